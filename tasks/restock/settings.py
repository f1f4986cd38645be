"""The restock wing's settings section: RESTOCK_* and MAINTENANCE_EVERY."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.config import envparse
from tasks.config.settings import REDIS_SCHEMES, Section, Settings, setting

__all__ = ["RestockSettings", "restock_settings"]


@dataclass(frozen=True)
class RestockSettings(Section):
    """What restock reads from the environment (RESTOCK_ + the field's name). Seconds."""

    ENV_PREFIX: ClassVar[str] = "RESTOCK_"

    # The stock Redis masters (default: REDIS_URL alone); shard N lives on master N % masters
    # (one URL: every shard there; a cluster: wherever the shard's slot is).
    redis_urls: tuple[str, ...] = setting((), envparse.url_list(REDIS_SCHEMES))
    # Logical stock shards (hash tag {stock:N}); a SKU's shard is crc32(SKU) % shards. Changing
    # it is a migration (docs/decisions.md, "Logical stock shards").
    shards: int = setting(16, envparse.positive(int))
    queues: int = setting(2, envparse.positive(int))  # delay queues per shard
    # An unpaid item's stock comes back after this long.
    delay: float = setting(600.0, envparse.positive(float))
    # A delay queue holding this many stops syncing.
    capacity: int = setting(100_000, envparse.positive(int))
    batch: int = setting(100, envparse.positive(int))  # due entries per restock script call
    # Seconds between the sync/drain/rebuild jobs beat emits.
    interval: float = setting(5.0, envparse.positive(float))
    # A node's next maintenance window after a rebuild.
    maintenance_every: float = setting(3 * 3600.0, envparse.positive(float),
                                       env="MAINTENANCE_EVERY")
    # The Celery queue of restock work (tasks.restock.*).
    queue: str = setting("restock", envparse.queue)

    @property
    def queue_names(self) -> tuple[str, ...]:
        """The names of every node's delay queues: q0, q1, ..."""
        return tuple(f"q{i}" for i in range(self.queues))

    def nodes(self, settings: Settings) -> tuple[str, ...]:
        """The Redis URL of every stock master, master 0 first (default: REDIS_URL)."""
        return self.redis_urls or (settings.redis_url,)


def restock_settings(settings: Settings) -> RestockSettings:
    """The restock section of `settings`."""
    return settings.section(RestockSettings)
