"""`python -m bench nemesis`: the randomized fault run (bench/nemesis/run.py).

Workers import `bench.nemesis.job` (EXTRA_TASK_MODULES), so this package's import stays light:
the harness is imported only when the benchmark runs.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str]) -> int:
    from bench.nemesis.run import main as run

    return run(argv)
