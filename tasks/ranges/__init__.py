"""Range jobs: walk a table in id-range partitions, each owned through a lease.

jobs (what a job is, the registry), planning (partition boundaries), runner (one partition's
run under its lease), workrow (the partition's fenced work row), batches (the keyset and
closing passes), outcomes (how a run ends), reconciler (dispatch and takeover), tasks (the
Celery tasks `tasks.ranges.*`), status (the partitions for `python -m tasks status`).
"""
