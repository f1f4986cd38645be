"""Flower's configuration file (read from the working directory by `celery -A tasks flower`).

Flower never starts without basic auth, nor with a password shipped in this repository's
examples: the credentials come from FLOWER_BASIC_AUTH (`user:password`, comma-separated for
several users), never from the command line, so they do not show in `ps`. It listens on loopback
unless FLOWER_ADDRESS says otherwise, because Flower's `/metrics` and `/healthcheck` endpoints
bypass basic auth.

This file is read only from the working directory; tasks/worker/flowerguard.py enforces the same
rules from the `tasks` package, so they hold wherever Flower is started.
"""

import os

from tasks.worker.flowerguard import check_basic_auth

basic_auth = os.environ.get("FLOWER_BASIC_AUTH", "").strip().split(",")
check_basic_auth(basic_auth)
address = os.environ.get("FLOWER_ADDRESS", "127.0.0.1")
port = int(os.environ.get("FLOWER_PORT", "5555"))
