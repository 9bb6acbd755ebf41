"""Jobs that run at most one at a time, once per period, or at least some time apart, across
every process that shares the lock collection.

A job is a name with a lease, as a lock is, and a record of its runs kept in the same document.
Whether a call runs the job is decided on the server, in the one request that takes the lease:
nobody else holds it; in a job with ``every``, no run that started in the current *period* (a
span ``[start, start + every)`` of the server's clock, ``start = offset + floor((now - offset) /
every) * every``) has succeeded, and fewer than ``max_attempts`` runs started in it; with
``min_interval``, the last run ended at least that long ago. The request that ends the run records
how it ended and, on success, when the successful run started. So "run only if this period is not
done" and "record the success" are each one atomic write, and clients' clocks decide nothing. A
period is known by its start and end, never by a number: a change of ``every`` or ``offset``, or a
server clock that steps back, never runs a period whose run succeeded again. A run whose process
dies, or that loses its lease, leaves its period not done: the next call in the period runs the
job again once the lease has expired, and the run is recorded as lost.

Use [`run_once`][mongolock_async.jobs.run_once] (or
[`LockManager.run_once`][mongolock_async.LockManager.run_once]) as a decorator, or
[`AsyncMongoJob`][mongolock_async.jobs.AsyncMongoJob] for the outcome of each call; read what ran
with [`AsyncMongoJob.state`][mongolock_async.jobs.AsyncMongoJob.state] (or
[`LockManager.job`][mongolock_async.LockManager.job]).
"""

from ._core.jobs import (
    AsyncMongoJob,
    DerivedJobNameWarning,
    JobResult,
    JobRun,
    JobRunInfo,
    JobState,
    Period,
    current_run,
    run_once,
)

__all__ = [
    "AsyncMongoJob",
    "current_run",
    "DerivedJobNameWarning",
    "JobResult",
    "JobRun",
    "JobRunInfo",
    "JobState",
    "Period",
    "run_once",
]
