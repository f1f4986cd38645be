"""The composition root's list of wings: the only place, with `tasks.celery`, that names them.

Each wing declares what it brings in its `wing.py` (`tasks.wing.Wing`): task modules, tables,
settings section, routing rules, beat entries, metric series and dead-letter kinds. The app
(`tasks.celery`) is built from `WINGS`; tools that read the settings or the tables outside a
worker (the CLI, tests, benchmarks) use `load_settings` and `load_tables` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from sqlalchemy import MetaData

from tasks.config import settings as config
from tasks.ranges.wing import WING as RANGES
from tasks.restock.wing import WING as RESTOCK
from tasks.rollback.wing import WING as ROLLBACK
from tasks.store.models import Base
from tasks.wing import Wing

__all__ = ["WINGS", "CORE_TASK_MODULES", "task_modules", "sections", "load_settings",
           "load_tables", "variables"]

WINGS: tuple[Wing, ...] = (RANGES, ROLLBACK, RESTOCK)

# The core's own task module (health checks, the dead-letter prune).
CORE_TASK_MODULES = ("tasks.worker.health",)


def task_modules(wings: tuple[Wing, ...] = WINGS) -> list[str]:
    """What Celery imports (its `include`): the core's task module, then every wing's."""
    return [*CORE_TASK_MODULES, *(m for wing in wings for m in wing.task_modules)]


def sections(wings: tuple[Wing, ...] = WINGS) -> tuple[type[config.Section], ...]:
    """Every wing's settings section class."""
    return tuple(wing.settings for wing in wings if wing.settings is not None)


def load_settings(env: Mapping[str, str] | None = None) -> config.Settings:
    """The core's settings and every wing's section, read from `env` (default `os.environ`)."""
    return config.load_settings(env, sections())


def variables() -> set[str]:
    """Every environment variable the core and the wings read."""
    return config.variables(sections())


def load_tables(wings: tuple[Wing, ...] = WINGS) -> MetaData:
    """The shared MetaData with every wing's tables declared on it (each wing's `tables`
    module imported)."""
    import tasks.deadletters.tables  # noqa: F401  (the dead-letter room's table)

    for wing in wings:
        if wing.tables is not None:
            importlib.import_module(wing.tables)
    return Base.metadata
