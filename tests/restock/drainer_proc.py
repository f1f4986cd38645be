"""A restock drainer in its own process, to SIGKILL in the middle of a batch.

    python -m tests.restock.drainer_proc NODE_URL DATABASE_URL NODE QUEUE NOW_MS LEASE_TTL

Drains QUEUE of node NODE as of wall-clock NOW_MS; after the batch's payment lookup (the
items are 'released' in the database) it prints "claimed N" and sleeps, so the test can kill
it before its restock script runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import redis
from sqlalchemy.orm import sessionmaker

from tasks.drain import Drainer
from tasks.nodes import StockNode
from tasks.redolog import RedoEntry
from tasks.resources import make_engine


def main(argv: list[str]) -> int:
    node_url, db_url, node, queue, now_ms, ttl = argv
    sessions = sessionmaker(make_engine(db_url), expire_on_commit=False)

    def stall(entries: Sequence[RedoEntry]) -> None:
        print(f"claimed {len(entries)}", flush=True)
        time.sleep(120)

    drainer = Drainer(sessions, StockNode.on(int(node), redis.Redis.from_url(node_url)),
                      lease_ttl=float(ttl), clock_ms=lambda: int(now_ms),
                      before_restock=stall)
    drainer.drain(queue)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
