"""Rollback checkpoints: a task journals how to undo each step; failure runs the undos in reverse.

Inside a task built on `tasks.worker.base.PlatformTask` (a sketch of a user's task, with `step`
from `tasks.rollback.api` and `compensation` from `tasks.rollback.registry`; the example order
saga, `tasks.examples.order_saga`, is a complete one)::

    @compensation("cancel_shipment")
    def cancel_shipment(data: dict[str, Any]) -> None: ...   # idempotent, see below

    @app.task(name="myshop.ship_order", base=PlatformTask)
    def ship_order(order_id: str) -> None:
        with step("ship", undo="cancel_shipment", data={"order": order_id}):
            ship(order_id)

**Write-ahead.** `step()` journals the step as 'intended' BEFORE its body runs and marks it
'recorded' after; `checkpoint(name, undo=..., data=...)` is the one-line form (a row
'recorded' at once), to be called before the effect too. So every effect that may have run is
in the journal; if `step()` or `checkpoint()` raises (JournalLost above all), the effect has
not run. Compensations must therefore be idempotent and tolerate a step that never happened
or half happened: an 'intended' step is compensated like any other.

**Ownership.** The journal of execution `task_id` is owned by one row of `rollback_owners`:
the owning execution's journal lease token and a state. Every write the owner makes (a new
step, a confirmation, the success) is one transaction that first matches
`owner = :token AND state = 'running'`, so whoever changed that row (the sweeper, a later
delivery) has fenced the old owner out, in the database, whatever Redis said or says:

    owner  open: acquire lease journal:{task_id} (token T); owners row -> running/T
    owner  step/checkpoint: UPDATE owners ... WHERE owner=T AND state='running'; INSERT row
    owner  returns: DELETE owners ... WHERE owner=T AND state='running' + its rows -> SUCCESS
           no row matched: JournalLost, the task FAILS (never SUCCESS)
    sweep  lease gone: UPDATE owners SET state='taken_over' WHERE owner=T AND state='running';
           then compensate the rows that existed, newest first

A paused owner that wakes after a takeover can neither add a step nor succeed. An effect it
had already begun (its intent committed before the takeover) is refused by a store that checks
the step's fence (`fences`: the journal lease still holds the owner's token, checked in the
same atomic write). An effect nothing fenced may land after the sweeper ran its compensation,
so the owner, finding its confirmation refused, runs that step's compensation once more
(idempotent) before it raises JournalLost.

What happens to a journal afterwards:

    returns normally                 -> rows deleted (after the fenced success above)
    fails for good, soft time limit  -> rollback(): compensations in reverse seq order
    task_retry                       -> rollback() of the failed attempt (ROLLBACK_ON_RETRY=1),
                                        or handed over to the next attempt (=0, see handover)
    task_revoked(terminate=True)     -> a `tasks.rollback.rollback` task takes it over as the
                                        sweeper would, once its lease is gone; a process that
                                        ignored the signal runs on, and its own end decides
    hard time limit, SIGKILL, pause  -> no signal at all: the sweeper takes over every journal
    past the lease TTL, Redis loss      whose lease is gone, and rolls it back

The journal lease is acquired at the first step with progress=False: the process's lease
keeper renews it for as long as the process lives. Its loss means "the owner may be dead";
the owners row makes that safe to act on even when the owner is alive.

Each step is claimed at most once per journal row and ownership, newest first (`runner`); a
compensation that keeps failing is dead-lettered and the remaining steps still run. Runners
are fenced by the owners row: a takeover fences out a runner that hung or died inside a
compensation, and runs that step's compensation again (idempotent) instead of leaving it
'compensating'.
Compensated and dead rows, and closed owners rows, are deleted by the sweeper (`sweeper`)
JOURNAL_RETENTION seconds after their last change.

A task that records no checkpoint costs nothing: the hooks look at a per-process dict and
return, without any database or Redis I/O.

The modules, one concept each: `errors`, `signals`, `tables` (the journal's tables on
`Base.metadata`), `registry` (the compensations), `runner` (rolling a journal back),
`journals` (the `Journal` of this process's executions and their ownership), `sweeper`,
`api` (the public functions and the process's journal), `tasks` (the Celery tasks, signal
handlers and PlatformTask hooks; importing that module installs them, and a worker imports it
through the wing's declaration), `settings` (the wing's section), `wing` (what the wing brings
to the platform: tasks/rollback/wing.py).

This face does no work: import the module you need (`from tasks.rollback.api import step`,
`from tasks.rollback.registry import compensation`).
"""
