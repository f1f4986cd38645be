"""A leader-elected beat scheduler (HA beat on a lease). The schedule is the app's
(`tasks.worker.schedule`): beat imports tasks, tasks never imports beat."""

from beat.scheduler import LEADER_LEASE, LeaderScheduler

__all__ = ["LEADER_LEASE", "LeaderScheduler"]
