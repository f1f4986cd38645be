"""Range jobs: walk a table in id-range partitions, each owned through a lease.

jobs (what a job is, the registry), planning (partition boundaries), runner (one partition's
batches), reconciler (dispatch and takeover), tasks (the Celery tasks `tasks.ranges.*`).
"""
