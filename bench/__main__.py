"""`python -m bench NAME [args]`: run one benchmark module, `bench/NAME.py`, by its `main(argv)`."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("lease", "range", "overhead", "restock", "control", "failover", "nemesis",
              "scale")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m bench {{{'|'.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{argv[0]}")
    result: int = module.main(argv[1:])
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
