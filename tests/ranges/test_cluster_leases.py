"""A range job on real workers whose leases (and the platform's other keys) live on a 3-master
Redis Cluster (REDIS_CLUSTER_NODES), the broker and result backend on a plain Redis (Celery
cannot use a cluster). Mid-job, the slot of a running partition's lease moves to another
master (as resharding does) and a worker is SIGKILLed: every row is still processed once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.crc import key_slot

from examples.seed import seed_cm_data
from lease.keys import lease_key
from tasks.ranges.keys import range_lease_name
from tests.ranges.cluster import Platform
from tests.support.redis_cluster import redis_cluster
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_until

pytestmark = pytest.mark.timeout(240)

ROWS = 10_000


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_range_job_with_leases_on_a_cluster_survives_a_slot_move_and_a_kill(
        engine: object, platform: Callable[..., Platform], private_redis: RedisServer) -> None:
    seed_cm_data(engine, ROWS)  # type: ignore[arg-type]
    with redis_cluster(masters=3) as cluster:
        # REDIS_URL gives the cluster only its (absent) password; the private Redis, so that
        # nothing else that reads REDIS_URL (restock's default stock node) reaches a shared one.
        env = {"REDIS_CLUSTER_NODES": cluster.seeds, "REDIS_URL": private_redis.url,
               "BROKER_URL": private_redis.url, "RESULT_BACKEND": private_redis.url,
               "CM_DATA_BATCH_DELAY": "0.2"}
        run = platform(**env)
        try:
            doomed = run.worker("doomed")
            run.worker("survivor")
            run.beat()
            run.start_job()
            part = wait_until(run.running_with_progress, 90, "a partition in progress")
            slot = key_slot(lease_key(range_lease_name("cm_data", part.part)).encode())
            before = cluster.owner_of(slot)
            assert cluster.move_slot(slot, (before + 1) % cluster.masters) >= 1
            wait_until(lambda: run.running_with_progress(batches=4), 60, "progress after the move")
            doomed.kill()
            run.wait_finished(timeout=150)
        finally:
            run.stop()
        fences = {key.decode() for key in cluster.client().scan_iter(match="fence:*")}
    run.assert_exactly_once(ROWS)
    parts = run.parts()
    assert len(parts) == 2
    # Every partition's fence counter is on the cluster (the leases never touched REDIS_URL).
    assert {f"fence:{{range:cm_data:{p.part}}}" for p in parts} <= fences
