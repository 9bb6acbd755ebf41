"""``AsyncMongoLock``: the lock handle users hold."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from . import _validate
from ._shield import run_shielded
from .errors import LockAlreadyHeldError, LockLostError, LockNotOwnedError, LockTimeoutError
from .keeper import keeper_for_running_loop
from .lease import Lease, call_on_lost, default_safety_margin, local_deadline, logger
from .store import LockState, LockStore
from .waiting import Backoff, announce_release, release_signal

OnLost = Callable[["AsyncMongoLock"], Awaitable[None] | None]

_MAJORITY = WriteConcern(w="majority")


class AsyncMongoLock:
    """A distributed lock on one name, stored in a MongoDB collection.

    ``collection`` is a PyMongo ``AsyncCollection`` (``pymongo.AsyncMongoClient``) or a Motor
    collection. A handle stands for one holder: use one handle per task that needs the lock.

    Arguments (all checked before any I/O; ``TypeError``/``ValueError`` name the argument):

    - ``ttl``: lease length in seconds (default 30). Expiry is set and judged by the server's clock.
    - ``blocking``/``timeout``: defaults for :meth:`acquire` and ``async with`` (``timeout=None``
      waits forever).
    - ``label``: free text shown to operators as the holder (with host and pid).
    - ``write_concern``: for every write; ``majority`` by default so an acknowledged acquisition
      survives a primary failover.
    - ``heartbeat``: ``True`` renews the lease every ``ttl / 3`` while held; a number sets the
      interval in seconds, which must leave room for two renewals before the local deadline
      (``2 * heartbeat <= ttl - safety_margin``). Off by default.
    - ``safety_margin``: seconds before the TTL at which the holder stops believing it holds the
      lease (default: 10 % of the TTL, at most 1 s).
    - ``on_lost``: called once (sync, or async in its own task) with this handle when a held lease
      is lost.
    - ``retry_base``/``retry_cap``: the jittered exponential backoff of a blocking acquire, in
      seconds. A waiter also wakes when the holder's lease expires, or at once when a handle in this
      process releases the name.
    """

    def __init__(
        self,
        collection: Any,
        name: str,
        ttl: float = 30.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        label: str | None = None,
        write_concern: WriteConcern = _MAJORITY,
        heartbeat: bool | float = False,
        safety_margin: float | None = None,
        on_lost: OnLost | None = None,
        retry_base: float = 0.05,
        retry_cap: float = 1.0,
    ) -> None:
        collection = _validate.async_collection(collection)
        self._name = _validate.lock_name(name)
        self._ttl = _validate.ttl(ttl)
        self._blocking = _validate.flag(blocking, "blocking")
        self._timeout = _validate.optional_timeout(timeout)
        _validate.timeout_needs_blocking(self._blocking, self._timeout)
        self._label = _validate.optional_label(label)
        if safety_margin is not None:
            safety_margin = _validate.seconds(safety_margin, "safety_margin", allow_zero=True)
            if safety_margin >= self._ttl:
                raise ValueError(f"safety_margin ({safety_margin:g} s) must be smaller than ttl ({self._ttl:g} s)")
        self._safety_margin = safety_margin
        if not isinstance(heartbeat, bool):
            heartbeat = _validate.seconds(heartbeat, "heartbeat")
        self._heartbeat = heartbeat
        _heartbeat_interval(self._heartbeat, self._ttl, self._safety_margin)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable, not {type(on_lost).__name__}")
        self._on_lost = on_lost
        self._retry_base = _validate.seconds(retry_base, "retry_base")
        self._retry_cap = _validate.seconds(retry_cap, "retry_cap", minimum=self._retry_base)
        self._store = LockStore(collection, _validate.write_concern(write_concern))
        self._key = (self._store.full_name, self._name)
        self._lease: Lease | None = None
        self._acquiring = False
        self._lost = asyncio.Event()
        self._body_scope: anyio.CancelScope | None = None

    def __repr__(self) -> str:
        state = "held" if self._lease is not None and self._lease.believed_held else "not held"
        return f"<AsyncMongoLock {self._name!r} in {self._store.full_name} ttl={self._ttl:g}s {state}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        """The TTL of the current lease (changed by :meth:`extend`), else the configured one."""
        return self._lease.ttl if self._lease is not None else self._ttl

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition; None when this handle holds nothing.

        Tokens of one name only go up, across releases, expiry takeovers, server restarts and purges
        of idle lock documents: pass it to the resource you protect and have it refuse smaller ones.
        """
        lease = self._lease
        return lease.fencing_token if lease is not None and lease.lost_error is None else None

    @property
    def deadline(self) -> float | None:
        """The local ``time.monotonic()`` until which the lease is known to be held; None if not held."""
        lease = self._lease
        return lease.deadline if lease is not None and lease.lost_error is None else None

    @property
    def lost(self) -> asyncio.Event:
        """Set when the current lease is lost (a fresh, unset event per acquisition)."""
        return self._lost

    @property
    def lost_error(self) -> LockLostError | None:
        """Why the current lease was lost, if it was."""
        return None if self._lease is None else self._lease.lost_error

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; return True if this handle now holds it.

        ``blocking=False`` tries once. A blocking acquire waits up to ``timeout`` seconds (the
        handle's default when None) and returns False past it; one request already on its way is
        allowed to finish, so the wait can overrun by one round trip.

        Raises :class:`LockAlreadyHeldError` if this handle already holds or is acquiring the lock.
        If the caller is cancelled, the request in flight completes, any lease it took is released,
        and the cancellation propagates.
        """
        blocking = self._blocking if blocking is None else _validate.flag(blocking, "blocking")
        if timeout is None:
            timeout = self._timeout if blocking else None
        else:
            timeout = _validate.optional_timeout(timeout)
            _validate.timeout_needs_blocking(blocking, timeout)
        if self._acquiring or (self._lease is not None and self._lease.lost_error is None):
            raise LockAlreadyHeldError(self._name)
        self._forget_lease()
        self._acquiring = True
        try:
            return await self._acquire(blocking, timeout)
        finally:
            self._acquiring = False

    async def _acquire(self, blocking: bool, timeout: float | None) -> bool:
        give_up_at = None if timeout is None else time.monotonic() + timeout
        backoff = Backoff(self._retry_base, self._retry_cap)
        with release_signal(self._store, self._name) as released:
            while True:
                released.clear()
                state = await self._attempt()
                if state is None:
                    return True
                if not blocking:
                    return False
                delay = min(backoff.next_delay(), await self._until_expiry(state))
                if give_up_at is not None:
                    left = give_up_at - time.monotonic()
                    if left <= 0:
                        return False
                    delay = min(delay, left)
                with anyio.move_on_after(delay):
                    await released.wait()

    async def _attempt(self) -> LockState | None:
        """One acquire request. None if it took the lock; else the document showing the holder."""
        owner = secrets.token_hex(16)
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "label": self._label}
        sent_at = time.monotonic()

        async def release_if_taken(state: LockState) -> None:
            if state.owner == owner:
                await self._store.release(self._name, owner)

        state = await run_shielded(
            self._store.try_acquire(self._name, owner, _ms(self._ttl), holder),
            grace=self._ttl,
            on_cancelled=release_if_taken,
        )
        if state.owner != owner:
            return state
        deadline = local_deadline(sent_at, self._ttl, self._safety_margin)
        if time.monotonic() >= deadline:
            # The answer came too late to leave any time under the lease: treat it as not taken.
            await self._release_quietly(owner)
            return state
        self._lost = asyncio.Event()
        self._lease = Lease(
            store=self._store,
            name=self._name,
            owner=owner,
            fencing_token=state.fencing_token,
            ttl=self._ttl,
            safety_margin=self._safety_margin,
            deadline=deadline,
            heartbeat_interval=_heartbeat_interval(self._heartbeat, self._ttl, self._safety_margin),
            lost=self._lost,
            on_lost=self._signal_lost,
        )
        if self._lease.heartbeat_interval is not None:
            keeper_for_running_loop().keep(self._lease)
        return None

    async def _until_expiry(self, state: LockState) -> float:
        """Seconds until the holder's lease expires on the server's clock (estimated), or inf."""
        if state.expires_at is None:
            return float("inf")
        try:
            server_now = await self._store.estimated_server_time()
        except PyMongoError:
            return float("inf")
        if server_now is None:
            return float("inf")
        return max(0.0, (state.expires_at.replace(tzinfo=None) - server_now).total_seconds())

    async def release(self) -> bool:
        """Give the lock up. True if this ended our live lease; False if we held nothing live.

        Never raises for a lease that expired or was taken over. The request runs shielded: a
        cancellation waits for it (up to the TTL, after which the lease has expired anyway) and then
        propagates.
        """
        lease = self._forget_lease()
        if lease is None:
            return False
        try:
            return await run_shielded(self._store.release(self._name, lease.owner), grace=lease.ttl)
        finally:
            announce_release(self._key)

    async def extend(self, ttl: float | None = None) -> None:
        """Start a new lease of ``ttl`` seconds (default: the current TTL) from now, server time.

        Raises :class:`LockNotOwnedError` if this handle holds no live lease; the lease then counts
        as lost (``lost`` is set, ``on_lost`` is called).
        """
        new_ttl = self.ttl if ttl is None else _validate.ttl(ttl)
        lease = self._lease
        if lease is None or lease.lost_error is not None:
            raise LockNotOwnedError(self._name)
        interval = _heartbeat_interval(self._heartbeat, new_ttl, self._safety_margin)
        sent_at = time.monotonic()
        if not await self._store.extend(self._name, lease.owner, _ms(new_ttl)):
            lease.mark_lost("extend found the lease expired or held by another owner")
            raise LockNotOwnedError(self._name, "the lease expired or another owner holds it now")
        lease.heartbeat_interval = interval
        lease.confirm(sent_at, new_ttl)
        if interval is not None:
            keeper_for_running_loop().keep(lease)  # the keeper re-reads the (maybe shorter) interval

    async def locked(self) -> bool:
        """Whether anyone holds a live lease on this name, judged by the server."""
        return await self._store.is_held(self._name)

    async def owned(self) -> bool:
        """Whether this handle holds the lease: live on the server and before the local deadline."""
        lease = self._lease
        if lease is None or not lease.believed_held:
            return False
        return await self._store.is_held_by(self._name, lease.owner) and lease.believed_held

    async def __aenter__(self) -> AsyncMongoLock:
        if not await self.acquire():
            raise LockTimeoutError(self._name, self._timeout if self._blocking else None)
        lease = self._lease
        assert lease is not None
        if lease.heartbeat_interval is not None:
            # Entered here and exited in __aexit__, in the same task: the keeper cancels it on loss.
            scope = anyio.CancelScope()
            scope.__enter__()
            self._body_scope = lease.cancel_scope = scope
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        lease = self._lease
        cancelled_by_loss = False
        if self._body_scope is not None:
            scope, self._body_scope = self._body_scope, None
            cancelled_by_loss = bool(scope.__exit__(exc_type, exc, traceback))
        if lease is not None and lease.lost_error is None and time.monotonic() >= lease.deadline:
            lease.mark_lost(
                f"the block ran past the lease's local deadline (ttl {lease.ttl:g} s) without renewal; "
                + (
                    "the event loop was blocked, so the heartbeat could not run: code in the block must yield"
                    if lease.heartbeat_interval is not None
                    else "use heartbeat=True for work that can outlast the TTL"
                )
            )
        lost_error = lease.lost_error if lease is not None else None
        if lost_error is not None:
            # Lost means expired or taken over: nothing of ours is left on the server to release.
            self._forget_lease()
            if exc_type is None or cancelled_by_loss:
                raise lost_error
            return False
        try:
            await self.release()
        except PyMongoError:
            if exc_type is None:
                raise
            logger.exception("releasing %r failed while the block raised; the lease will expire", self._name)
        return False

    def _forget_lease(self) -> Lease | None:
        """Detach the current lease from this handle and the heartbeat; return it."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.ended = True
            lease.cancel_scope = None
            if lease.heartbeat_interval is not None:
                keeper_for_running_loop().drop(lease)
        return lease

    async def _release_quietly(self, owner: str) -> None:
        try:
            await run_shielded(self._store.release(self._name, owner), grace=self._ttl)
        except PyMongoError:
            logger.warning("could not release an abandoned acquire of %r; it expires within its ttl", self._name)

    def _signal_lost(self, error: LockLostError) -> None:
        if self._on_lost is not None:
            call_on_lost(self._on_lost, self)


def _heartbeat_interval(heartbeat: bool | float, ttl: float, safety_margin: float | None) -> float | None:
    """The renewal interval for ``ttl``, or None when the heartbeat is off; ValueError if it cannot fit."""
    if heartbeat is False:
        return None
    interval = ttl / 3 if heartbeat is True else float(heartbeat)
    margin = default_safety_margin(ttl) if safety_margin is None else safety_margin
    if 2 * interval > ttl - margin:
        raise ValueError(
            f"heartbeat interval {interval:g} s leaves no room for two renewals inside ttl {ttl:g} s "
            f"minus the safety margin {margin:g} s; use at most {(ttl - margin) / 2:g} s"
        )
    return interval


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
