"""A restock drainer or rebuilder in its own process, to kill in the middle of its work.

    python -m tests.restock.drainer_proc NODE_URL DATABASE_URL NODE MODE QUEUE NOW_MS TTL \
        [CAP [ARG]]

NOW_MS is the node's clock for this process (the test's fake node clock), TTL the lease TTL.

- ``stall``: drain QUEUE; after the batch's payment lookup (the items are 'released' in the
  database) print "claimed N" and sleep, so the test can SIGKILL it before its restock script.
- ``drain``: drain QUEUE with at most CAP attempts per entry; a batch holding order item ARG
  ends the process with os._exit(3) after its payment lookup (a poison entry).
- ``rebuild``: rebuild the node (forced: due or not) with at most CAP attempts; ARG ``die``
  ends the process with os._exit(3) after its first database read. Prints the outcome.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import redis
from sqlalchemy.orm import sessionmaker

from tasks.restock.drain import Drainer
from tasks.restock.maintenance import Rebuilder
from tasks.restock.redolog import RedoEntry
from tasks.restock.shards import StockShard
from tasks.store.resources import make_engine


def main(argv: list[str]) -> int:
    node_url, db_url, node, mode, queue, now_ms, ttl, *rest = argv
    sessions = sessionmaker(make_engine(db_url), expire_on_commit=False)
    stock = StockShard.on(int(node), redis.Redis.from_url(node_url),
                         clock=lambda: int(now_ms))
    cap = int(rest[0]) if rest else 3
    arg = rest[1] if len(rest) > 1 else ""

    def stall(entries: Sequence[RedoEntry]) -> None:
        print(f"claimed {len(entries)}", flush=True)
        time.sleep(120)

    def poison(entries: Sequence[RedoEntry]) -> None:
        if any(e.order_item_id == arg for e in entries):
            os._exit(3)

    def die() -> None:
        os._exit(3)

    if mode == "rebuild":
        rebuilder = Rebuilder(sessions, stock, [queue], lease_ttl=float(ttl), max_attempts=cap,
                              on_read=die if arg == "die" else None)
        print(rebuilder.rebuild().outcome, flush=True)
        return 0
    drainer = Drainer(sessions, stock, lease_ttl=float(ttl), max_attempts=cap,
                      before_restock=stall if mode == "stall" else poison)
    drainer.drain(queue)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
