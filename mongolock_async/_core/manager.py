"""``LockManager``: one lock collection and its defaults, handing out handles by name."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

from .._util import validation
from .._util.collection_types import AsyncCollectionLike
from ..admin.dashboard_guard import LOOPBACK_HOSTS
from .election import AsyncMongoElection
from .jobs import AsyncMongoJob, JobState, derived_name, run_once
from .lock import LOCK_OPTIONS, AsyncMongoLock, ManagerKeywords
from .options import LeaseOptions
from .rwlock import AsyncMongoRWLock
from .semaphore import AsyncMongoSemaphore

if TYPE_CHECKING:
    # The operator tools load on first use (see each method): a service that only takes locks never
    # imports the live view or the dashboard.
    from ..admin.dashboard import Dashboard
    from ..admin.live import LockWatch
    from ..admin.operations import ForcedRelease, LockInfo

logger = logging.getLogger("mongolock_async")

P = ParamSpec("P")
R = TypeVar("R")


class LockManager:
    """The lock collection and the defaults for its locks, created once (say, in an app's lifespan).

    ``locks = LockManager(collection, ttl=10, timeout=2, label="checkout")``, then
    ``async with locks("stock:" + sku): ...`` anywhere. Every keyword of
    [`AsyncMongoLock`][mongolock_async.AsyncMongoLock] can be given here as a default and overridden per call.
    The defaults are checked here, before any I/O, with the same errors as the handle's.
    """

    def __init__(self, collection: AsyncCollectionLike, **defaults: Unpack[ManagerKeywords]) -> None:
        if "name" in defaults:
            raise TypeError("a LockManager hands out locks by name: pass the name to each call, not as a default")
        LeaseOptions.checked("LockManager", LOCK_OPTIONS, **defaults)  # no I/O
        validation.async_collection(collection)
        self._collection = collection
        self._defaults: dict[str, Any] = dict(defaults)

    @property
    def collection(self) -> AsyncCollectionLike:
        return self._collection

    def __call__(self, name: str, **overrides: Unpack[ManagerKeywords]) -> AsyncMongoLock:
        """A new handle for ``name`` (one per task that needs the lock), with the manager's defaults.

        ``blocking=False`` here drops the manager's default ``timeout`` (a non-blocking acquire has none).
        """
        return AsyncMongoLock(self._collection, name, **self._options(overrides))

    def semaphore(self, name: str, limit: int, **overrides: Unpack[ManagerKeywords]) -> AsyncMongoSemaphore:
        """A new handle for one permit of the semaphore ``name`` (at most ``limit`` holders at once),
        with the manager's defaults; see [`AsyncMongoSemaphore`][mongolock_async.AsyncMongoSemaphore]."""
        return AsyncMongoSemaphore(self._collection, name, limit, **self._options(overrides))

    def rwlock(self, name: str, **overrides: Unpack[ManagerKeywords]) -> AsyncMongoRWLock:
        """The read-write lock ``name`` with the manager's defaults (but ``fair``: a read-write lock
        always serves in turn); see [`AsyncMongoRWLock`][mongolock_async.AsyncMongoRWLock]."""
        options = self._options(overrides)
        options.pop("fair", None)
        return AsyncMongoRWLock(self._collection, name, **options)

    def election(self, name: str, **overrides: Unpack[ManagerKeywords]) -> AsyncMongoElection:
        """A new candidate in the election ``name`` with the manager's defaults but ``fair`` and
        ``blocking`` (a candidate waits in turn) and a default ``heartbeat=False`` (a leader is
        always renewed); see [`AsyncMongoElection`][mongolock_async.AsyncMongoElection]."""
        options = self._options(overrides)
        for not_taken in ("fair", "blocking"):
            options.pop(not_taken, None)
        if options.get("heartbeat") is False and "heartbeat" not in overrides:
            del options["heartbeat"]
        return AsyncMongoElection(self._collection, name, **options)

    def _options(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        options = {**self._defaults, **overrides}
        if overrides.get("blocking") is False and "timeout" not in overrides:
            options.pop("timeout", None)
        return options

    def run_once(
        self,
        name: str | None = None,
        *,
        wait: bool = False,
        every: timedelta | float | None = None,
        offset: timedelta | float | None = None,
        min_interval: timedelta | float | None = None,
        max_attempts: int | None = None,
        hold_at_least: timedelta | float | None = None,
        **overrides: Any,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an async function (a scheduled job, say) so that its calls run as a job: at most
        one at a time across every process that shares the collection, and with ``every``,
        ``min_interval`` or ``hold_at_least``, at most once per period of the server's clock, or at
        least that far apart (see [`AsyncMongoJob`][mongolock_async.jobs.AsyncMongoJob]; each run is
        recorded, and [`job`][mongolock_async.LockManager.job] reads the record).

        A call that does not run the function returns None at once and logs why at INFO. The
        function runs as the body of ``async with`` the job's lease: if the lease is lost, it is
        cancelled and [`LockLostError`][mongolock_async.LockLostError] is raised. ``name`` defaults
        to the function's module and qualified name, with a ``DerivedJobNameWarning`` (give
        scheduled jobs an explicit one: the derived one changes when the function moves);
        ``overrides`` set lease options (a job's heartbeat is on unless the manager's defaults or
        the call say ``heartbeat``); the manager's ``blocking``, ``timeout``, ``fair``,
        ``retry_base`` and ``retry_cap`` do not apply: a job never waits in line.

        ``wait=True`` is for work that must run on every call, one call at a time: the call waits
        for its turn (up to the manager's or the call's ``timeout``, then
        [`LockTimeoutError`][mongolock_async.LockTimeoutError]) on a plain lock, and nothing is
        recorded; it takes none of the job options.
        """
        schedule = {
            "every": every,
            "offset": offset,
            "min_interval": min_interval,
            "max_attempts": max_attempts,
            "hold_at_least": hold_at_least,
        }
        chosen = {option: value for option, value in schedule.items() if value is not None}
        if not wait:
            return run_once(self._collection, name, **self._job_options(overrides), **chosen)
        if chosen:
            raise TypeError(
                f"run_once(wait=True) waits its turn for a plain lock and takes no {', '.join(chosen)}: "
                "a job (every, min_interval, ...) never waits in line"
            )
        options: dict[str, Any] = {"blocking": True, **overrides}

        def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
            lock_name = validation.lock_name(name) if name else derived_name(function)
            LeaseOptions.checked("run_once", LOCK_OPTIONS, **self._options(options))  # now, before any I/O

            @functools.wraps(function)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R:
                async with self(lock_name, **options):
                    return await function(*args, **kwargs)

            return run

        return decorate

    async def job(self, name: str) -> JobState | None:
        """What the job ``name`` last did and whether it is done in the current period, judged on
        the server's clock; None if it never ran (see
        [`AsyncMongoJob.state`][mongolock_async.jobs.AsyncMongoJob.state])."""
        return await AsyncMongoJob(self._collection, name, **self._job_options({})).state()

    def _job_options(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        options = {**self._defaults, **overrides}
        for lock_only in ("blocking", "timeout", "fair", "retry_base", "retry_cap"):
            if lock_only not in overrides:
                options.pop(lock_only, None)
        return options

    async def list_locks(self, *, prefix: str | None = None, held: bool = False) -> list[LockInfo]:
        """Every lock of the collection (or those whose name starts with ``prefix``; with ``held``,
        only live ones), as ``mongolock list`` shows them; see
        [`list_locks`][mongolock_async.operations.list_locks]."""
        from ..admin import operations

        return await operations.list_locks(self._collection, prefix=prefix, held=held)

    async def inspect(self, name: str) -> LockInfo | None:
        """The lock (semaphore, read-write lock, election, job) ``name`` as ``mongolock inspect``
        shows it; None if it has no document. See [`inspect_lock`][mongolock_async.operations.inspect_lock]."""
        from ..admin import operations

        return await operations.inspect_lock(self._collection, name)

    async def force_release(
        self, name: str, *, holder: str | None = None, by: str | None = None
    ) -> ForcedRelease | None:
        """Break the one lease of ``name`` whose owner token is ``holder`` (``mongolock release
        --force``), or only repair an unreadable document without it; logged at WARNING on
        ``mongolock_async.audit`` with ``by``; see [`force_release`][mongolock_async.operations.force_release]."""
        from ..admin import operations

        return await operations.force_release(self._collection, name, holder=holder, by=by)

    def watch(self, *, prefix: str = "", poll_interval: float = 2.0) -> LockWatch:
        """A live view of the collection (``async with locks.watch() as view: async for update in
        view: ...``); see [`LockWatch`][mongolock_async.live.LockWatch]."""
        from ..admin.live import LockWatch

        return LockWatch(self._collection, prefix=prefix, poll_interval=poll_interval)

    def dashboard(
        self,
        *,
        prefix: str = "",
        allow_release: bool = False,
        title: str = "locks",
        allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
        release_secret: str | None = None,
    ) -> Dashboard:
        """The dashboard page of the collection, an ASGI app to mount (``app.mount("/locks",
        locks.dashboard(allowed_hosts=["shop.example.com"]))``); see
        [`Dashboard`][mongolock_async.dashboard.Dashboard]."""
        from ..admin.dashboard import Dashboard

        return Dashboard(
            self._collection, prefix=prefix, allow_release=allow_release, title=title, allowed_hosts=allowed_hosts,
            release_secret=release_secret,
        )  # fmt: skip
