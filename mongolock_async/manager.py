"""``LockManager``: one lock collection and its defaults, handing out handles by name."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from ._collection import AsyncCollectionLike
from .election import AsyncMongoElection
from .errors import LockTimeoutError
from .lock import AsyncMongoLock
from .rwlock import AsyncMongoRWLock
from .semaphore import AsyncMongoSemaphore

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

    def __init__(self, collection: AsyncCollectionLike, **defaults: Any) -> None:
        if "name" in defaults:
            raise TypeError("a LockManager hands out locks by name: pass the name to each call, not as a default")
        AsyncMongoLock(collection, "lock-manager-check", **defaults)  # validates, no I/O
        self._collection = collection
        self._defaults = defaults

    @property
    def collection(self) -> AsyncCollectionLike:
        return self._collection

    def __call__(self, name: str, **overrides: Any) -> AsyncMongoLock:
        """A new handle for ``name`` (one per task that needs the lock), with the manager's defaults.

        ``blocking=False`` here drops the manager's default ``timeout`` (a non-blocking acquire has none).
        """
        return AsyncMongoLock(self._collection, name, **self._options(overrides))

    def semaphore(self, name: str, limit: int, **overrides: Any) -> AsyncMongoSemaphore:
        """A new handle for one permit of the semaphore ``name`` (at most ``limit`` holders at once),
        with the manager's defaults; see [`AsyncMongoSemaphore`][mongolock_async.AsyncMongoSemaphore]."""
        return AsyncMongoSemaphore(self._collection, name, limit, **self._options(overrides))

    def rwlock(self, name: str, **overrides: Any) -> AsyncMongoRWLock:
        """The read-write lock ``name`` with the manager's defaults (but ``fair``: a read-write lock
        always serves in turn); see [`AsyncMongoRWLock`][mongolock_async.AsyncMongoRWLock]."""
        options = self._options(overrides)
        options.pop("fair", None)
        return AsyncMongoRWLock(self._collection, name, **options)

    def election(self, name: str, **overrides: Any) -> AsyncMongoElection:
        """A new candidate in the election ``name`` with the manager's defaults but ``fair`` and
        ``blocking`` (a candidate waits in turn) and a default ``heartbeat=False`` (a leader is
        always renewed); see [`AsyncMongoElection`][mongolock_async.AsyncMongoElection]."""
        options = self._options(overrides)
        for not_taken in ("fair", "blocking"):
            options.pop(not_taken, None)
        if options.get("heartbeat") is False and "heartbeat" not in overrides:
            del options["heartbeat"]
        return AsyncMongoElection(self._collection, name, **options)

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        options = {**self._defaults, **overrides}
        if overrides.get("blocking") is False and "timeout" not in overrides:
            options.pop("timeout", None)
        return options

    def run_once(
        self, name: str | None = None, *, wait: bool = False, **overrides: Any
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an async function (a scheduled job, say) so that one call at a time runs it,
        across every process that shares the collection.

        A call made while another holds the lock returns None at once (``wait=False``, the
        default: for jobs that several replicas start on the same schedule), or waits for its turn
        (``wait=True``, up to the manager's or the call's ``timeout``, then
        [`LockTimeoutError`][mongolock_async.LockTimeoutError]). The function runs as the body of
        ``async with`` the lock: if the lease is lost, it is cancelled and
        [`LockLostError`][mongolock_async.LockLostError] is raised. ``name`` defaults to the function's
        module and qualified name; ``overrides`` set handle options (``heartbeat=True`` for long jobs).
        """

        options: dict[str, Any] = {"blocking": wait, **overrides}

        def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
            lock_name = name or f"{function.__module__}.{function.__qualname__}"
            self(lock_name, **options)  # the options are checked now

            @functools.wraps(function)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
                async with contextlib.AsyncExitStack() as stack:
                    try:
                        await stack.enter_async_context(self(lock_name, **options))
                    except LockTimeoutError:
                        if wait:
                            raise
                        logger.info("skipped %s: lock %r is held elsewhere", function.__qualname__, lock_name)
                        return None
                    return await function(*args, **kwargs)

            return run

        return decorate
