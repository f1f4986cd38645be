"""Range jobs: walk a table in partitions of its key, each owned through a lease.

jobs (what a job is, the registry), jobkeys (the key a job walks: integer, UUID, string,
date/time or a tuple), planning (partition boundaries), cuts (partitions cut by row count from
a walk of the key's index), runner (one partition's run under its lease), workrow (the
partition's fenced work row), batches (the keyset and closing passes), outcomes (how a run
ends), reconciler (dispatch and takeover), tasks (the Celery tasks `tasks.ranges.*`), status
(the partitions for `python -m tasks status`).
"""
