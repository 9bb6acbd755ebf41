"""The implementation of ``mongolock_async.jobs`` (its public path; the user guide is there)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar, Unpack

from pymongo.errors import PyMongoError

from .._runtime.lease import Lease
from .._runtime.waiting import deadline_in
from .._util import validation
from .._util.backoff import Backoff
from .._util.collection_types import AsyncCollectionLike
from .._util.diagnosis import cause_of
from ..errors import LockLostError
from ..hooks import notify
from ..store import MAX_ATTEMPTS_LIMIT, JobSchedule, is_transient, of_kind, store_for
from ..store.documents import JOB_KIND, JobRecord, JobRun, LockState, Period
from ..store.job_state import JobState, describe_skip
from .lock import LEASE_OPTIONS, AsyncMongoLock, LeaseKeywords
from .options import LeaseOptions

__all__ = [
    "AsyncMongoJob",
    "DerivedJobNameWarning",
    "JobResult",
    "JobRun",
    "JobRunInfo",
    "JobState",
    "Period",
    "current_run",
    "run_once",
]

logger = logging.getLogger("mongolock_async")

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_MAX_ATTEMPTS = 3
"""Runs allowed per period of a job with ``every``, unless ``max_attempts`` says otherwise."""
_ERROR_MESSAGE_LIMIT = 1000
_LOSS_RECORD_TIME = 2.0
"""Seconds a run that lost its lease spends at most recording the loss in the job's record."""


class JobRunInfo(NamedTuple):
    """The run of a job that the calling code is part of (see [`current_run`][mongolock_async.jobs.current_run])."""

    name: str
    period: Period | None
    """The period it runs in, on the server's clock (None for a job without ``every``): key the
    job's writes by ``period.start`` to make a repeated run of the period overwrite, not add."""
    attempt: int
    """Its number among the runs started in its period (1 without ``every``)."""
    fencing_token: int
    """The run's fencing token: above every earlier run's (pass it with the job's writes)."""
    started_at: datetime | None
    """Server time at which it started."""


_current: ContextVar[JobRunInfo] = ContextVar("mongolock_async_job_run")


def current_run() -> JobRunInfo:
    """The run of a job that the calling code runs in (call it from inside the job's function):
    its period, attempt and fencing token. ``LookupError`` outside a job's run."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_run() is for code that a job's run calls: no job runs here") from None


@dataclass(frozen=True, slots=True)
class JobResult(Generic[R]):
    """What one call of [`AsyncMongoJob.run`][mongolock_async.jobs.AsyncMongoJob.run] did."""

    name: str
    ran: bool
    """Whether this call ran the job's function (to its end: its value is ``value``)."""
    value: R | None
    """What the function returned, if it ran."""
    skipped: str | None
    """Why it did not run: ``running``, ``held``, ``done``, ``failed`` or ``too_soon`` (see
    [`LockHooks.job_skipped`][mongolock_async.LockHooks.job_skipped])."""
    record: JobRecord
    """The job's record as the server's decision showed it (for a skip: who ran it, and when)."""

    def __str__(self) -> str:
        if self.ran:
            return f"job {self.name!r} ran"
        return f"job {self.name!r} skipped: {describe_skip(self.skipped, self.record)}"


class _Schedule(NamedTuple):
    server: JobSchedule
    hold_at_least_ms: int | None


def _schedule(
    every: object, offset: object, min_interval: object, max_attempts: object, hold_at_least: object
) -> _Schedule:
    """The job options, checked (before any I/O), in milliseconds. Every duration is at most
    ``validation.MAX_DURATION`` (a year and a day), which keeps what the server adds up in range."""
    every_s = None if every is None else validation.duration(every, "every")
    if every_s is not None and every_s < 1:
        raise ValueError(f"every must be at least 1 second (a period of the server's clock), got {every_s:g} s")
    offset_s = 0.0
    if offset is not None:
        if every_s is None:
            raise ValueError("offset places the periods of every: give every too")
        offset_s = validation.duration(offset, "offset", allow_zero=True)
        if offset_s >= every_s:
            raise ValueError(f"offset ({offset_s:g} s) must be shorter than every ({every_s:g} s)")
    min_interval_s = None if min_interval is None else validation.duration(min_interval, "min_interval")
    if every_s is not None and min_interval_s is not None and min_interval_s >= every_s:
        raise ValueError(
            f"min_interval ({min_interval_s:g} s) must be shorter than every ({every_s:g} s): with runs at least "
            "that far apart, some periods could never have their run"
        )
    if max_attempts is None:
        attempts = DEFAULT_MAX_ATTEMPTS
    else:
        if every_s is None:
            raise ValueError("max_attempts counts the runs in one period of every: give every too")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise TypeError(f"max_attempts must be an int, not {type(max_attempts).__name__}")
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be 1 to {MAX_ATTEMPTS_LIMIT}, got {max_attempts}")
        attempts = max_attempts
    hold_s = None if hold_at_least is None else validation.duration(hold_at_least, "hold_at_least")
    if hold_s is not None and every_s is not None and hold_s >= every_s:
        raise ValueError(
            f"hold_at_least ({hold_s:g} s) must be shorter than every ({every_s:g} s): the lease kept after a run "
            "would block the next period's"
        )
    return _Schedule(
        JobSchedule(
            every_ms=None if every_s is None else round(every_s * 1000),
            offset_ms=round(offset_s * 1000),
            min_interval_ms=None if min_interval_s is None else round(min_interval_s * 1000),
            max_attempts=attempts,
        ),
        None if hold_s is None else round(hold_s * 1000),
    )


class AsyncMongoJob:
    """A job that runs at most one at a time across every process sharing ``collection``, and, with
    the options below, at most once per period of the server's clock, or at least some time apart.

    - ``every`` (a ``timedelta`` or seconds, at least 1 s): run at most once per period. Periods
      are spans of the **server's** clock, aligned to the Unix epoch plus ``offset`` (say
      ``every=timedelta(days=1), offset=timedelta(hours=2)``: daily from 02:00 UTC). A call in a
      period in which a run started and succeeded (or a later one: a server clock that stepped
      back) returns at once without running. Changing ``every`` or ``offset`` keeps that word: a
      period that contains a successful run's start is done, whichever schedule that run had.
    - ``max_attempts`` (with ``every``; default 3): runs allowed per period. A run that raises, is
      cancelled, or whose process dies counts; the next call in the period runs the job again
      (once the dead run's lease has expired) until a run succeeds or the attempts are used up.
      The runs that count are those started in the period, whatever schedule they had.
    - ``min_interval``: no run starts sooner than this after the last run ended, whichever process
      ran it (fixed delay). With ``every`` it must be shorter than ``every``.
    - ``hold_at_least``: the lease is kept until this long after the run started even if the run
      ends sooner (ShedLock's ``lockAtLeastFor``): a call meanwhile does not run the job. It adds
      nothing to ``every``, which already runs each period once; it is for jobs without one.

    Each of ``every``, ``min_interval`` and ``hold_at_least`` is at most a year and a day (as a
    ``ttl``), else ``ValueError`` names it and the limit.

    The other arguments are a lock's (see [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]):
    ``ttl`` is the run's lease and ``heartbeat`` keeps it while the run goes on, **on by default
    for a job** (every ``ttl / 3``; ``heartbeat=False`` turns it off). If the lease is lost anyway,
    the run is cancelled, ``LockLostError`` raised, and the job's record (``last``) and a WARNING
    log line say so, with the TTL and the heartbeat. A job never waits for its turn: a call either
    runs it or returns at once. Every argument is checked before any I/O.
    """

    def __init__(
        self,
        collection: AsyncCollectionLike,
        name: str,
        *,
        every: timedelta | float | None = None,
        offset: timedelta | float | None = None,
        min_interval: timedelta | float | None = None,
        max_attempts: int | None = None,
        hold_at_least: timedelta | float | None = None,
        ttl: float = 30.0,
        **options: Unpack[LeaseKeywords],
    ) -> None:
        self._schedule = _schedule(every, offset, min_interval, max_attempts, hold_at_least)
        options = {"heartbeat": True, **options}  # a job's runs are the long-running case
        checked = LeaseOptions.checked("AsyncMongoJob", LEASE_OPTIONS, ttl=ttl, **options)
        self._options = replace(checked, blocking=False)
        self._store = store_for(validation.async_collection(collection), checked.write_concern)
        self._collection = collection
        self._name = validation.lock_name(name)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        every = self._schedule.server.every_ms
        when = "" if every is None else f" every={every / 1000:g}s"
        return f"<AsyncMongoJob {self._name!r}{when}>"

    async def run(self, function: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> JobResult[R]:
        """Run ``function(*args, **kwargs)`` as this job's run if the job is due; return what happened.

        When it runs, the function runs as the body of ``async with`` the job's lease (a loss of
        the lease cancels it and raises [`LockLostError`][mongolock_async.LockLostError]), and
        [`current_run`][mongolock_async.jobs.current_run] tells it its period, attempt and fencing
        token. Its end is recorded: a return marks the period done; an exception is recorded (its
        type and message, never its arguments) and propagates; so does a cancellation. When it does
        not run, the result says why (``skipped``) and shows the record the server decided on.
        Other errors are a lock's (``ServerUnreachableError``, ``LockDataError`` if the name is a
        semaphore's, a read-write lock's or an election's).
        """
        lock = _RunLock(self._collection, self._name, self._schedule, self._options)
        if not await lock.acquire():
            record = _record_of(lock.decision)
            period, reason = record.skipped or (None, "held")  # held: by a lock of the same name
            if lock.taken:
                period, reason = None, "lost"  # taken, but the reply came after the lease's deadline
            notify(self._options.hooks, "job_skipped", self._name, reason=reason, period=period)
            return JobResult(self._name, False, None, reason, record)
        started = time.monotonic()
        running = _record_of(lock.decision).running
        if running is None or lock.fencing_token is None:
            raise RuntimeError(f"job {self._name!r}: its lease was taken without a run or a fencing token")
        info = JobRunInfo(self._name, running.period, running.attempt, lock.fencing_token, running.started_at)
        token = _current.set(info)
        lock._guard_body()
        try:
            value = await function(*args, **kwargs)
        except BaseException as error:
            await lock.__aexit__(type(error), error, error.__traceback__)
            raise
        else:
            await lock.__aexit__(None, None, None)
        finally:
            _current.reset(token)
            outcome = lock.outcome if lock.recorded else "lost"
            duration = time.monotonic() - started
            details = {"outcome": outcome, "duration": duration, "period": info.period, "attempt": info.attempt}
            notify(self._options.hooks, "job_ran", self._name, **details)
        return JobResult(self._name, True, value, None, _record_of(lock.decision))

    async def state(self) -> JobState | None:
        """What this job last did and whether it is done in the current period, judged on the
        server's clock (read with read concern ``majority``); None if it never ran. Raises
        [`LockDataError`][mongolock_async.LockDataError] if the name is not a job's."""
        reports = await self._store.report([self._name], bound=self._options.ttl)
        if not reports:
            return None
        report = reports[0]
        if report.state is None:
            if report.error is None:  # a document that could not be read carries its error
                raise RuntimeError(f"job {self._name!r}: a report with neither a state nor an error")
            raise report.error
        if report.state.kind != "lock":  # a lock's document: a run_once of an earlier version
            of_kind(report.state, None, kind=JOB_KIND)
        return JobState.from_report(report)


def _record_of(decision: LockState | None) -> JobRecord:
    return (decision.job if decision is not None else None) or JobRecord()


class _RunLock(AsyncMongoLock):
    """The lease of one run of a job: taken by the job's start request, ended by its finish request
    (which records how the run ended)."""

    def __init__(self, collection: AsyncCollectionLike, name: str, schedule: _Schedule, options: LeaseOptions) -> None:
        self._init(collection, name, options)
        self._job_schedule = schedule
        self.decision: LockState | None = None
        """The job's document as the start request left it."""
        self.taken = False
        """Whether the start request took the lease (``acquire`` is False all the same when its
        reply came too late to leave any of it: the run is then finished as lost)."""
        self.outcome = "lost"
        self.recorded = False
        """Whether the finish request recorded ``outcome``."""
        self._error: dict[str, str] | None = None

    async def _try_request(
        self, owner: str, ttl_ms: int, *, on_cancelled: Callable[[LockState], Awaitable[None]]
    ) -> LockState:
        state = await self._store.start_job(
            self._name,
            owner,
            ttl_ms,
            self._holder(),
            self._job_schedule.server,
            bound=self._options.ttl,
            on_cancelled=on_cancelled,
        )
        self.decision, self.taken = state, state.owner == owner
        return state

    async def _hand_over(self, owner: str, *, until: float) -> bool:
        """Finish the run: record ``outcome`` and end the lease (see ``LockStore.finish_job``);
        transient failures are retried until ``until``."""
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                self.recorded = await self._store.finish_job(
                    self._name,
                    owner,
                    outcome=self.outcome,
                    error=self._error,
                    hold_at_least_ms=self._job_schedule.hold_at_least_ms,
                    bound=until - time.monotonic(),
                )
                return self.recorded
            except PyMongoError as error:
                delay = backoff.next_delay()
                if not is_transient(error) or time.monotonic() + delay >= until:
                    raise
                logger.debug("finishing the run of job %r failed (%s); retrying", self._name, str(error))
                await asyncio.sleep(delay)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.outcome = "succeeded"
        elif isinstance(exc, asyncio.CancelledError):
            self.outcome = "cancelled"  # the caller's: a loss of the lease raises LockLostError below
        else:
            self.outcome = "failed"
            self._error = {"type": type(exc).__qualname__, "message": str(exc)[:_ERROR_MESSAGE_LIMIT]}
        lease = self._lease
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            if lease is not None and lease.lost_error is not None:
                await self._record_loss(lease, lease.lost_error)

    async def _record_loss(self, lease: Lease, lost: LockLostError) -> None:
        """Say in the job's record (``last``, as ``lost`` with the reason) and in the log that the
        run was cancelled because its lease was lost, naming the TTL and the heartbeat. The record
        is written while it still shows this run, within ``_LOSS_RECORD_TIME``; a failure is logged."""
        if lease.heartbeat_interval is None:
            heartbeat = "heartbeat off (heartbeat=True, a job's default, renews it while the run goes on)"
        else:
            heartbeat = f"heartbeat every {lease.heartbeat_interval:g} s"
        message = f"the run's lease was lost ({lost.reason}); ttl {lease.ttl:g} s, {heartbeat}"
        logger.warning("job %r: run cancelled: %s", self._name, message)
        self.outcome = "lost"
        self._error = {"type": type(lost).__name__, "message": message[:_ERROR_MESSAGE_LIMIT]}
        try:
            await self._hand_over(lease.owner, until=deadline_in(min(lease.ttl, _LOSS_RECORD_TIME)))
        except PyMongoError as error:
            logger.warning("job %r: the loss of its run could not be recorded (%s)", self._name, cause_of(error))


class DerivedJobNameWarning(UserWarning):
    """A job (or a ``run_once`` lock) is named after its function's module and qualified name."""


def derived_name(function: Callable[..., Any]) -> str:
    """The default name of ``function``'s job, its module and qualified name, with a
    ``DerivedJobNameWarning`` at the line that decorates it (once per line: Python's default
    warning filter shows a warning once per place)."""
    name = validation.lock_name(f"{function.__module__}.{function.__qualname__}")
    warnings.warn(
        f"the job name {name!r} is derived from the function's module and qualified name: moving or renaming "
        "the function starts a new job under a new name, which runs at once; pass an explicit name",
        DerivedJobNameWarning,
        stacklevel=3,  # the line that applies the decorator
    )
    return name


def run_once(
    collection: AsyncCollectionLike, name: str | None = None, **options: Any
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
    """Decorate an async function so that calls of it run as the job ``name`` (default: the
    function's module and qualified name) on ``collection``: at most one at a time across every
    process, and with ``every``, ``min_interval`` or ``hold_at_least`` (see
    [`AsyncMongoJob`][mongolock_async.jobs.AsyncMongoJob], whose keywords ``options`` are), at most
    once per period or at least that far apart. A call that does not run the function returns
    None at once (and logs why at INFO); the arguments are checked now, before any I/O.

    Give scheduled jobs an explicit ``name``: the derived one changes when the function moves or is
    renamed, and the job then starts afresh (it runs at once, whatever the old name's record says).
    Decorating without a name warns so (``DerivedJobNameWarning``, once per place it happens)."""

    checked = AsyncMongoJob(collection, name or "run_once", **options)  # every argument now, before any I/O

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
        job = checked if name else AsyncMongoJob(collection, derived_name(function), **options)

        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
            result = await job.run(function, *args, **kwargs)
            if not result.ran:
                logger.info("%s", result)  # "job 'name' skipped: why"
            return result.value

        return run

    return decorate
