"""A lease holder in its own process, for the race and pause tests.

    python -m tests.lease.holder contend URL NAME ITERATIONS THREADS
        THREADS threads each acquire NAME ITERATIONS times (blocking); inside the lease each
        INCRs and DECRs a shared counter and records (monotonic time, fence, counter value).
        Prints one JSON line: {"records": [[t, fence, inside], ...]}.

    python -m tests.lease.holder hold URL NAME TTL
        Acquires NAME and heartbeats it until it is lost, reporting each step on stdout.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

import redis

from lease import Lease, LeaseError, Leases


def contend(url: str, name: str, iterations: int, threads: int) -> int:
    client = redis.Redis.from_url(url)
    leases = Leases(client)
    records: list[tuple[float, int, int]] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(iterations):
            lease = leases.acquire(name, ttl=5.0, blocking=True, timeout=30.0)
            inside = int(client.incr(f"inside:{name}"))
            stamp = time.monotonic()
            lease.check()
            time.sleep(random.random() / 1000)
            client.decr(f"inside:{name}")
            lease.release()
            with lock:
                records.append((stamp, lease.fence, inside))
            time.sleep(random.random() / 1000)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"records": records}), flush=True)
    leases.close()
    return 0


_say_lock = threading.Lock()


def say(line: str) -> None:
    """Print one whole line, even with the keeper thread printing too."""
    with _say_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def hold(url: str, name: str, ttl: float) -> int:
    leases = Leases(redis.Redis.from_url(url))
    lease = leases.acquire(name, ttl=ttl)
    called = threading.Event()

    def lost(held: Lease) -> None:
        say(f"callback lost {held.fence}")
        called.set()

    lease.on_lost(lost)
    say(f"acquired {lease.fence}")
    deadline = time.monotonic() + 20
    while not lease.lost_event.is_set() and time.monotonic() < deadline:
        lease.heartbeat()
        time.sleep(0.02)
    say(f"event {lease.lost_event.is_set()} {lease.fence}")
    for step in (lease.check, lease.renew, lease.release):
        try:
            step()
            say(f"{step.__name__} ok")
        except LeaseError as exc:
            say(f"{step.__name__} {type(exc).__name__}")
    # The keeper thread may call back just after the event is set: wait for it, or this
    # process could exit (the keeper is a daemon thread) before it says so.
    called.wait(5.0)
    say("exit")
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "contend":
        return contend(argv[1], argv[2], int(argv[3]), int(argv[4]))
    if argv[0] == "hold":
        return hold(argv[1], argv[2], float(argv[3]))
    raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
