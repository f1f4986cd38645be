"""The test suite. Runs before any test module imports `tasks`, whose settings come from env."""

import os

WORKER_REDIS_URL = os.environ.get("TEST_WORKER_REDIS_URL", "redis://127.0.0.1:6379/11")
# The app imported by tests sends to the same Redis database as the `worker_env` workers.
os.environ.setdefault("REDIS_URL", WORKER_REDIS_URL)
# Workers started by tests (they inherit this environment) register the sample tasks.
os.environ.setdefault("DEV_TASKS", "1")
