"""The rollback wing's settings section: ROLLBACK_ON_RETRY and JOURNAL_RETENTION."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.config import envparse
from tasks.config.settings import Section, Settings, setting

__all__ = ["RollbackSettings", "rollback_settings"]


@dataclass(frozen=True)
class RollbackSettings(Section):
    """What the rollback journal reads from the environment (ROLLBACK_ + the field's name)."""

    ENV_PREFIX: ClassVar[str] = "ROLLBACK_"

    # A failed attempt that will be retried is rolled back before the retry (1), or hands its
    # journal over to the next attempt (0).
    on_retry: bool = setting(True, envparse.flag)
    # Compensated journal rows (and the demo saga ledgers) are deleted this long after their
    # last change, by the sweeper (seconds).
    journal_retention: float = setting(7 * 86400.0, envparse.positive(float),
                                       env="JOURNAL_RETENTION")


def rollback_settings(settings: Settings) -> RollbackSettings:
    """The rollback section of `settings`."""
    return settings.section(RollbackSettings)
