"""The implementation of ``mongolock_async.aiohttp`` (its public path; the user guide is there)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Unpack

try:
    from aiohttp import web
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"mongolock_async.aiohttp needs aiohttp: install the aiohttp extra (from a checkout: pip install '.[aiohttp]')"
        f" ({error})",
        name=error.name,
    ) from error

from .._core.lock import AsyncMongoLock, ManagerKeywords
from .._core.manager import LockManager
from ..errors import LockLostError, LockTimeoutError, ServerUnreachableError

__all__ = ["Handler", "hold_lock", "HTTPLocked", "limit_concurrency", "LOCK", "ManagerOf", "NameOf"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NameOf = str | Callable[[web.Request], str]
ManagerOf = LockManager | Callable[[web.Request], LockManager]

LOCK = web.RequestKey("mongolock_async.lock", AsyncMongoLock)
"""The request key under which [`hold_lock`][mongolock_async.aiohttp.hold_lock] puts the held lock."""


class HTTPLocked(web.HTTPClientError):
    """423 Locked: the lock could not be taken within its timeout."""

    status_code = 423


def hold_lock(locks: ManagerOf, name: NameOf, **overrides: Unpack[ManagerKeywords]) -> Callable[[Handler], Handler]:
    """Decorate a handler so that it runs holding the lock ``name``.

    ``locks`` is a [`LockManager`][mongolock_async.LockManager], or a function of the request returning one
    (``lambda request: request.app[LOCKS]``); ``name`` a string or a function of the request.
    The held lock is ``request[LOCK]``. If someone else holds it past the timeout, the response is
    423 Locked (with ``Retry-After: 1``); if MongoDB cannot be reached, or the lease is lost while
    the handler runs (which is then cancelled), 503 Service Unavailable.
    """

    def lock_for(request: web.Request) -> AsyncMongoLock:
        manager = locks if isinstance(locks, LockManager) else locks(request)
        return manager(name if isinstance(name, str) else name(request), **overrides)

    return _holding(lock_for, HTTPLocked)


def limit_concurrency(
    locks: ManagerOf, name: NameOf, limit: int, **overrides: Unpack[ManagerKeywords]
) -> Callable[[Handler], Handler]:
    """Decorate a handler so that it runs holding one permit of the semaphore ``name``: at most
    ``limit`` requests run it at once, across every process sharing the collection.

    As [`hold_lock`][mongolock_async.aiohttp.hold_lock] (the held semaphore is ``request[LOCK]``),
    but a request that finds every permit taken past the timeout gets 429 Too Many Requests (with
    ``Retry-After: 1``).
    """

    def permit_for(request: web.Request) -> AsyncMongoLock:
        manager = locks if isinstance(locks, LockManager) else locks(request)
        return manager.semaphore(name if isinstance(name, str) else name(request), limit, **overrides)

    return _holding(permit_for, web.HTTPTooManyRequests)


def _holding(
    handle_for: Callable[[web.Request], AsyncMongoLock], busy: type[web.HTTPClientError]
) -> Callable[[Handler], Handler]:
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: web.Request) -> web.StreamResponse:
            lock = handle_for(request)
            try:
                async with lock:
                    request[LOCK] = lock
                    return await handler(request)
            except LockTimeoutError as error:
                if request.get(LOCK) is lock:
                    raise  # raised by the handler itself, not by taking this lock
                if error.unreachable is not None:
                    raise web.HTTPServiceUnavailable(text=str(error)) from error
                raise busy(text=str(error), headers={"Retry-After": "1"}) from error
            except ServerUnreachableError as error:
                if request.get(LOCK) is lock:
                    raise
                raise web.HTTPServiceUnavailable(text=str(error)) from error
            except LockLostError as error:
                if error.name != lock.name:
                    raise
                raise web.HTTPServiceUnavailable(text=str(error)) from error

        return run

    return decorate
