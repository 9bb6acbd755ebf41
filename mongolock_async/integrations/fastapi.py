"""The implementation of ``mongolock_async.fastapi`` (its public path; the user guide is there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Unpack

try:
    from fastapi import Depends, HTTPException, Request, status
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"mongolock_async.fastapi needs FastAPI: install the fastapi extra (from a checkout: pip install '.[fastapi]')"
        f" ({error})",
        name=error.name,
    ) from error

from .._core.lock import AsyncMongoLock, ManagerKeywords
from .._core.manager import LockManager
from .._core.semaphore import AsyncMongoSemaphore
from ..errors import LockLostError, LockTimeoutError, ServerUnreachableError

__all__ = ["hold_lock", "limit_concurrency", "ManagerOf", "NameOf"]

NameOf = str | Callable[[Request], str]
ManagerOf = LockManager | Callable[[Request], LockManager]


def hold_lock(locks: ManagerOf, name: NameOf, **overrides: Unpack[ManagerKeywords]) -> Any:
    """A dependency (already wrapped in ``Depends``: use it as ``Annotated[AsyncMongoLock, hold_lock(...)]``)
    that holds the lock ``name`` for the request.

    ``locks`` is a [`LockManager`][mongolock_async.LockManager], or a function of the request returning one
    (``lambda request: request.app.state.locks``); ``name`` a string or a function of the request.
    ``overrides`` set handle options for this dependency. The lock is released as soon as the path
    operation returns, before the response is sent. If someone else holds it past the timeout, the
    request fails with 423 Locked (and ``Retry-After: 1``); if MongoDB cannot be reached, or the
    lease is lost while the path operation runs (which is then cancelled), with 503 Service
    Unavailable.
    """

    def lock_for(request: Request) -> AsyncMongoLock:
        manager = locks if isinstance(locks, LockManager) else locks(request)
        return manager(name if isinstance(name, str) else name(request), **overrides)

    return _holding(lock_for, status.HTTP_423_LOCKED)


def limit_concurrency(locks: ManagerOf, name: NameOf, limit: int, **overrides: Unpack[ManagerKeywords]) -> Any:
    """A dependency (already wrapped in ``Depends``: use it as ``Annotated[AsyncMongoSemaphore,
    limit_concurrency(...)]``) that holds one permit of the semaphore ``name`` for the request: at
    most ``limit`` requests run it at once, across every process sharing the collection.

    As [`hold_lock`][mongolock_async.fastapi.hold_lock], but a request that finds every permit taken
    past the timeout fails with 429 Too Many Requests (and ``Retry-After: 1``). With the manager's
    ``timeout`` (or ``blocking=False`` here) a full route answers at once.
    """

    def permit_for(request: Request) -> AsyncMongoSemaphore:
        manager = locks if isinstance(locks, LockManager) else locks(request)
        return manager.semaphore(name if isinstance(name, str) else name(request), limit, **overrides)

    return _holding(permit_for, status.HTTP_429_TOO_MANY_REQUESTS)


def _holding(handle_for: Callable[[Request], AsyncMongoLock], busy: int) -> Any:
    """A dependency holding the handle ``handle_for`` makes for each request; ``busy`` is the status
    of a request that could not get it within its timeout."""

    async def dependency(request: Request) -> AsyncIterator[AsyncMongoLock]:
        lock = handle_for(request)
        try:
            await lock.__aenter__()
        except LockTimeoutError as error:
            if error.unreachable is not None:
                raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from error
            raise HTTPException(busy, str(error), headers={"Retry-After": "1"}) from error
        except ServerUnreachableError as error:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from error
        try:
            yield lock
        except BaseException as error:
            await _exit(lock, error)
            raise
        await _exit(lock, None)

    return Depends(dependency, scope="function")


async def _exit(lock: AsyncMongoLock, error: BaseException | None) -> None:
    """Leave the lock's block as ``async with`` would; a lost lease becomes 503."""
    try:
        await lock.__aexit__(type(error) if error else None, error, error.__traceback__ if error else None)
    except LockLostError as lost:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(lost)) from lost
