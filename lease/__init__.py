"""Token-checked, fenced Redis leases with one renewer per process. Imports no Celery.

    leases = Leases(redis_client)
    with leases.acquire("range:cm_data:3", ttl=2.0) as lease:
        while work_left():
            lease.check()                 # raises LeaseLost once the lease is lost
            do_batch(fence=lease.fence)   # the store rejects writes with an older fence
            lease.heartbeat()             # progress: the keeper keeps renewing
"""

from lease.errors import LeaseError, LeaseLost, NotAcquired, NotHeld
from lease.keeper import Keeper
from lease.lease import Lease
from lease.leases import Leases

__all__ = ["Keeper", "Lease", "LeaseError", "LeaseLost", "Leases", "NotAcquired", "NotHeld"]
