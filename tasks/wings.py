"""The composition root's list of wings: the only place, with `tasks.celery`, that names them.

Each wing declares what it brings in its `wing.py` (`tasks.wing.Wing`): task modules, tables,
settings section, routing rules, beat entries, metric series and dead-letter kinds. `WINGS`
lists every declared wing; the setting WINGS (`enabled`: a comma-separated list of wing names,
default all) says which of them a deployment runs. The app (`tasks.celery`) is built from the
enabled ones only (a wing turned off has none of its task modules imported, and no queue,
route, beat entry, metric series or dead-letter kind), and `migrate` creates only their tables
(`load_tables`). Every wing's settings section is still read, so the CLI and console can name
what a wing turned off would use. Tools that read the settings or the tables outside a worker
(the CLI, tests, benchmarks) use `load_settings` and `load_tables` here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from sqlalchemy import MetaData, Table

from tasks.config import envparse
from tasks.config import settings as config
from tasks.ranges.wing import WING as RANGES
from tasks.restock.wing import WING as RESTOCK
from tasks.rollback.wing import WING as ROLLBACK
from tasks.store.models import Base
from tasks.wing import Wing

__all__ = ["WINGS", "VARIABLE", "CORE_TASK_MODULES", "enabled", "is_enabled", "task_modules",
           "sections", "load_settings", "load_tables", "variables"]

# Every declared wing, enabled or not.
WINGS: tuple[Wing, ...] = (RANGES, ROLLBACK, RESTOCK)

# The setting naming the wings a deployment runs: `ranges,restock`; unset or empty: all of
# them; `none`: the core alone.
VARIABLE = "WINGS"

# The core's own task module (health checks, the dead-letter prune).
CORE_TASK_MODULES = ("tasks.worker.health",)


def enabled(env: Mapping[str, str] | None = None) -> tuple[Wing, ...]:
    """The wings the setting WINGS enables in `env` (default `os.environ`), in declaration
    order; `SettingsError` names the variable and the known wings on an unknown name."""
    raw = envparse.value(os.environ if env is None else env, VARIABLE)
    if not raw:
        return WINGS
    names = envparse.some_of(*(wing.name for wing in WINGS))(VARIABLE, raw)
    return tuple(wing for wing in WINGS if wing.name in names)


def is_enabled(name: str, env: Mapping[str, str] | None = None) -> bool:
    """True when the wing called `name` is enabled (WINGS): the CLI and console skip a
    wing's views when it is off (its tables may not exist)."""
    return any(wing.name == name for wing in enabled(env))


def task_modules(wings: tuple[Wing, ...] = WINGS) -> list[str]:
    """What Celery imports (its `include`): the core's task module, then every wing's."""
    return [*CORE_TASK_MODULES, *(m for wing in wings for m in wing.task_modules)]


def sections(wings: tuple[Wing, ...] = WINGS) -> tuple[type[config.Section], ...]:
    """Every wing's settings section class."""
    return tuple(wing.settings for wing in wings if wing.settings is not None)


def load_settings(env: Mapping[str, str] | None = None) -> config.Settings:
    """The core's settings and every wing's section, read from `env` (default `os.environ`);
    WINGS is checked here too, so a bad name fails wherever settings are read."""
    enabled(env)
    return config.load_settings(env, sections())


def variables() -> set[str]:
    """Every environment variable the core and the wings read."""
    return config.variables(sections()) | {VARIABLE}


def load_tables(wings: tuple[Wing, ...] | None = None) -> MetaData:
    """A MetaData holding the dead-letter room's table and the tables of `wings` (default: the
    enabled ones, `enabled()`), each wing's `tables` module imported (they declare their
    tables on the shared `tasks.store.models.Base.metadata`, which keeps every imported one)."""
    import tasks.deadletters.tables as room

    chosen = enabled() if wings is None else wings
    modules = [room, *(importlib.import_module(w.tables) for w in chosen if w.tables)]
    found = MetaData()
    for module in modules:
        for value in vars(module).values():
            if (isinstance(value, Table) and value.metadata is Base.metadata
                    and value.key not in found.tables):
                value.to_metadata(found)
    return found
