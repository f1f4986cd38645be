"""The beat schedule and a leader-elected scheduler (HA beat on a lease)."""

from beat.schedule import beat_schedule
from beat.scheduler import LEADER_LEASE, LeaderScheduler

__all__ = ["LEADER_LEASE", "LeaderScheduler", "beat_schedule"]
