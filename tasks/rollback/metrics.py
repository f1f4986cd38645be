"""The rollback wing's metric series (`RollbackSeries`, served by `tasks.observe.metrics`)."""

from __future__ import annotations

from typing import Any

from tasks.config.settings import Settings

__all__ = ["RollbackSeries"]


class RollbackSeries:
    """Compensations run and sweeper runs (`record.on.of(RollbackSeries)`)."""

    def __init__(self, make: Any) -> None:
        self.rollback_steps = make.counter("rollback_steps", "compensations run, by result",
                                           ["result"])
        self.rollback_sweeps = make.counter("rollback_sweeps", "sweeper runs")

    def zero(self, settings: Settings) -> None:
        """Both results' series, at 0."""
        for result in ("compensated", "failed"):
            self.rollback_steps.labels(result)
