"""The test suite. Runs before any test module imports `tasks`, whose settings come from env.

Under pytest-xdist (`make test` runs `pytest -n ...`) every worker process gets its own Redis
databases and its own PostgreSQL and MariaDB databases, so tests run side by side without
sharing state; `tests/conftest.py` creates those databases when they are missing.
"""

import os

_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... or ""


def _own_redis_server() -> str:
    """Start a redis-server for this xdist worker (stopped when the worker exits); its URL."""
    import atexit

    from tests.support.redis_server import RedisServer

    server = RedisServer().start()
    atexit.register(server.kill)
    return f"redis://127.0.0.1:{server.port}"

if _XDIST_WORKER.startswith("gw"):
    _n = int(_XDIST_WORKER[2:])
    if _n < 4:  # databases 1..8 of the machine's Redis are the tests' own
        _redis = "redis://127.0.0.1:6379"
    elif "TEST_WORKER_REDIS_URL" in os.environ:  # a process the xdist worker started
        _redis = ""  # inherits the worker's URLs
    else:  # the rest are in use (demos, benchmarks): a redis-server of this worker's own
        _redis = _own_redis_server()
    os.environ.setdefault("TEST_REDIS_URL", f"{_redis}/{1 + 2 * (_n % 4)}")
    os.environ.setdefault("TEST_WORKER_REDIS_URL", f"{_redis}/{2 + 2 * (_n % 4)}")
    os.environ.setdefault("TEST_POSTGRES_URL",
                          f"postgresql+psycopg://postgres@127.0.0.1:5432/test_{_XDIST_WORKER}")
    os.environ.setdefault("TEST_MARIADB_URL",
                          f"mysql+pymysql://root@127.0.0.1:3306/test_{_XDIST_WORKER}")

WORKER_REDIS_URL = os.environ.get("TEST_WORKER_REDIS_URL", "redis://127.0.0.1:6379/11")
# The app imported by tests sends to the same Redis database as the `worker_env` workers. An
# xdist worker inherits the controller's environment, where this module set the serial
# default, so there it is set outright.
if _XDIST_WORKER.startswith("gw"):
    os.environ["REDIS_URL"] = WORKER_REDIS_URL
else:
    os.environ.setdefault("REDIS_URL", WORKER_REDIS_URL)
# Workers started by tests (they inherit this environment) register the sample tasks and the
# benchmarks' variant of the example job cm_data (bench/cm_data.py), as a user registers a job.
SAMPLE_MODULES = "bench.cm_data,devtools.samples,tests.support.sagas,tests.support.jobs"
os.environ.setdefault("EXTRA_TASK_MODULES", SAMPLE_MODULES)
