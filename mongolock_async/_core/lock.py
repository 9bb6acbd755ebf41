"""``AsyncMongoLock``: the lock handle users hold."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypedDict, Unpack

from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from .._runtime.keeper import keeper_for_running_loop
from .._runtime.lease import BodyGuard, Lease, call_on_lost, local_deadline, logger
from .._runtime.queues import Grant
from .._runtime.waiting import GIVE_UP_SLACK, AcquireRequest, deadline_in, finish_soon, hand_over, spawn, wait_for_lease
from .._util import validation
from .._util.collection_types import AsyncClient, AsyncCollectionLike
from .._util.diagnosis import cause_of
from ..errors import (
    LockAlreadyHeldError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    ServerUnreachableError,
    TransactionsUnsupportedError,
)
from ..hooks import LockHooks, notify
from ..store import Permits, is_transient, store_for
from ..store.documents import LockState
from .options import LeaseOptions, UnreachableTimeout

OnLost = Callable[["AsyncMongoLock"], Awaitable[None] | None]
"""Called with the handle whose lease was lost; a coroutine function runs in its own task."""

# The keyword sets are typed dictionaries, so that each handle's constructor takes exactly the
# options that apply to it (``**options: Unpack[LockKeywords]``) and a type checker sees a
# misspelt or misplaced one. They live with the lock because ``on_lost`` is called with it.


class LeaseKeywords(TypedDict, total=False):
    """The options of a lease (a job's run takes these); each is described on
    [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]."""

    label: str | None
    write_concern: WriteConcern
    heartbeat: bool | float
    safety_margin: float | None
    on_lost: OnLost | None
    hooks: LockHooks | None
    unreachable_timeout: UnreachableTimeout


class WaitKeywords(LeaseKeywords, total=False):
    """A lease's options and a waiter's (an election's candidates take these)."""

    timeout: float | None
    retry_base: float
    retry_cap: float


class RWLockKeywords(WaitKeywords, total=False):
    """A read-write lock's options: a lock's but ``fair`` (it always serves in turn)."""

    blocking: bool


class LockKeywords(RWLockKeywords, total=False):
    """A lock's and a semaphore's options."""

    fair: bool


class ManagerKeywords(LockKeywords, total=False):
    """A ``LockManager``'s defaults: a lock's options and its ``ttl``."""

    ttl: float


def names_of(keywords: type[Any]) -> frozenset[str]:
    """The option names a typed dictionary of keywords declares."""
    return frozenset(keywords.__required_keys__ | keywords.__optional_keys__)


LEASE_OPTIONS = names_of(LeaseKeywords)
WAIT_OPTIONS = names_of(WaitKeywords)
RWLOCK_OPTIONS = names_of(RWLockKeywords)
LOCK_OPTIONS = names_of(LockKeywords)


# A release is sent even for a lease about to expire; it gets at least this long to complete.
_MIN_RELEASE_TIME = 1.0


class AsyncMongoLock:
    """A distributed lock on one name, stored in a MongoDB collection.

    ``collection`` is a PyMongo ``AsyncCollection`` (``pymongo.AsyncMongoClient``) or a Motor
    collection. A handle stands for one holder: use one handle per task that needs the lock.

    Arguments (all checked before any I/O; ``TypeError``/``ValueError`` name the argument):

    - ``ttl``: lease length in seconds (default 30). Expiry is set and judged by the server's clock.
    - ``blocking``/``timeout``: defaults for [`acquire`][mongolock_async.AsyncMongoLock.acquire] and
      ``async with`` (``timeout=None`` waits forever).
    - ``label``: free text shown to operators as the holder (with host and pid), at most 128 bytes
      of UTF-8.
    - ``write_concern``: for every write; ``majority`` by default so an acknowledged acquisition
      survives a primary failover.
    - ``heartbeat``: ``True`` renews the lease every ``ttl / 3`` while held; a number sets the
      interval in seconds, which must leave room for two renewals before the local deadline
      (``2 * heartbeat <= ttl - safety_margin``). Off by default.
    - ``safety_margin``: seconds before the TTL at which the holder stops believing it holds the
      lease (default: 10 % of the TTL, at most 1 s).
    - ``on_lost``: called once (sync, or async in its own task) with this handle when a held lease
      is lost.
    - ``fair``: first come, first served across processes. Waiting processes take places in a
      queue stored with the lock and every release hands the lease to the oldest place. Off by
      default: then a release prefers a waiting task of its own process (one request for both),
      for at most a few hand-offs in a row while other processes wait. Within one process, waiting
      tasks are always served in arrival order. The trade-offs are in
      [the design notes][waiting-a-queue-per-process-places-across-processes].
    - ``hooks``: a [`LockHooks`][mongolock_async.LockHooks] told of every acquisition, renewal,
      release and loss (for metrics and traces).
    - ``retry_base``/``retry_cap``: the jittered exponential backoff of a blocking acquire where
      no change stream reports releases (a standalone server), in seconds. A waiter also wakes when
      the holder's lease expires, and at once when the lock is released or handed to it.
    - ``unreachable_timeout``: how long a blocking acquire rides out an outage (MongoDB not
      reached: no server to select, connections failing, no primary) before it raises
      [`ServerUnreachableError`][mongolock_async.ServerUnreachableError]. ``"server_selection"``
      (the default) is the client's ``serverSelectionTimeoutMS`` (30 s unless the URI or the client says otherwise),
      which rides out an election; a number of seconds; or ``None`` to wait through any outage.
      Errors that retrying cannot fix (a certificate that does not verify, rejected credentials)
      are raised at once.
    """

    # Slots, not a dictionary per handle: a process holding thousands of leases holds as many
    # handles (benchmarks/client_cost.py, part 4). Subclasses with fields of their own have both.
    __slots__ = ("__weakref__", "_acquiring", "_lease", "_lost", "_name", "_options", "_permits", "_store")

    _permits: Permits | None
    """What a permit of a semaphore or read-write lock is (see ``AsyncMongoSemaphore``); None for a lock."""

    def __init__(
        self, collection: AsyncCollectionLike, name: str, ttl: float = 30.0, **options: Unpack[LockKeywords]
    ) -> None:
        self._init(collection, name, LeaseOptions.checked(type(self).__name__, LOCK_OPTIONS, ttl=ttl, **options))

    def _init(
        self, collection: AsyncCollectionLike, name: str, options: LeaseOptions, permits: Permits | None = None
    ) -> None:
        """Make this handle from checked options: every constructor (a semaphore's, an election's,
        a read-write lock's handle, a job's run) ends here, after its own checks, so that a handle
        is never seen half made."""
        collection = validation.async_collection(collection)
        self._name = validation.lock_name(name)
        self._options = options
        self._permits = permits
        self._store = store_for(collection, options.write_concern)
        self._lease: Lease | None = None
        self._acquiring = False
        self._lost: asyncio.Event | None = None  # made when asked for: most callers never ask

    def __repr__(self) -> str:
        state = "held" if self._lease is not None and self._lease.believed_held else "not held"
        kind = "" if self._permits is None else f" {self._permits.kind} limit={self._permits.limit}"
        where = f"in {self._store.full_name} ttl={self._options.ttl:g}s"
        return f"<{type(self).__name__} {self._name!r}{kind} {where} {state}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        """The TTL of the current lease (changed by [`extend`][mongolock_async.AsyncMongoLock.extend]),
        else the configured one."""
        return self._lease.ttl if self._lease is not None else self._options.ttl

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
        if self._lost is None:
            self._lost = asyncio.Event()
            if self._lease is not None and self._lease.lost_error is not None:
                self._lost.set()
        return self._lost

    @property
    def lost_error(self) -> LockLostError | None:
        """Why the current lease was lost, if it was."""
        return None if self._lease is None else self._lease.lost_error

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; return True if this handle now holds it.

        ``blocking=False`` tries once. A blocking acquire queues behind the other tasks of this
        process that wait for the same name (first come, first served) and waits up to ``timeout``
        seconds (the handle's default when None), returning False past it while someone else holds
        the lock; one request already on its way is allowed to finish, so the wait can overrun by
        one round trip. Giving up (past the timeout, cancelled, or failed) withdraws this process's
        place in the lock's queue before it returns or raises, when no other task of this process
        waits: one more round trip, or at most 2 s when MongoDB does not answer it (it goes on in
        the background then), so that no release hands the lock to a waiter that is gone.

        An unreachable MongoDB is never reported as a busy lock: if the timeout passes while MongoDB
        cannot be reached, [`LockTimeoutError`][mongolock_async.LockTimeoutError] says so (its
        ``unreachable`` says why, and the driver's error is its ``__cause__``); an outage longer
        than ``unreachable_timeout`` raises
        [`ServerUnreachableError`][mongolock_async.ServerUnreachableError], as does a non-blocking
        acquire that finds no server. Errors retrying cannot fix (a certificate that does not
        verify, rejected credentials) propagate as the driver raised them.

        Raises [`LockAlreadyHeldError`][mongolock_async.LockAlreadyHeldError] if this handle already
        holds or is acquiring the lock, and [`LockDataError`][mongolock_async.LockDataError] if the
        lock's document was corrupted by hand or another tool. If the caller is cancelled, the
        request in flight completes, any lease or queue place it took is handed on or withdrawn, and
        the cancellation propagates.
        """
        blocking = self._options.blocking if blocking is None else validation.flag(blocking, "blocking")
        if timeout is None:
            timeout = self._options.timeout if blocking else None
        else:
            timeout = validation.optional_timeout(timeout)
            validation.timeout_needs_blocking(blocking, timeout)
        if self._acquiring or (self._lease is not None and self._lease.lost_error is None):
            raise LockAlreadyHeldError(self._name)
        self._forget_lease()
        self._acquiring = True
        started = time.monotonic()
        try:
            give_up_at = None if timeout is None else started + timeout
            while True:
                grant = await (self._wait(give_up_at, timeout) if blocking else self._try_once())
                if grant is None:
                    if self._observed():
                        waited = time.monotonic() - started
                        logger.debug("%r not acquired after %.3f s", self._name, waited)
                        notify(self._options.hooks, "not_acquired", self._name, waited=waited)
                    return False
                if self._hold(grant):
                    if self._observed():
                        waited = time.monotonic() - started
                        logger.debug("acquired %r, token %d, after %.3f s", self._name, grant.fencing_token, waited)
                        token = grant.fencing_token
                        notify(self._options.hooks, "acquired", self._name, fencing_token=token, waited=waited)
                    return True
                # The answer came too late to leave any time under the lease: pass it on, go on waiting.
                await self._pass_on(grant.owner)
                if not blocking:
                    return False
        finally:
            self._acquiring = False

    def _holder(self) -> dict[str, Any]:
        return {"host": _hostname(), "pid": os.getpid(), "label": self._options.label}

    async def _wait(self, give_up_at: float | None, timeout: float | None) -> Grant | None:
        unreachable_timeout = self._options.unreachable_timeout
        if unreachable_timeout == "server_selection":
            unreachable_timeout = float(self._store.client.options.server_selection_timeout)
        request = AcquireRequest(
            store=self._store,
            name=self._name,
            ttl=self._options.ttl,
            holder=self._holder(),
            fair=self._options.fair,
            retry_base=self._options.retry_base,
            retry_cap=self._options.retry_cap,
            fresh_for=self._options.safety_margin_for(self._options.ttl),
            timeout=timeout,
            unreachable_timeout=unreachable_timeout,
            permits=self._permits,
        )
        return await wait_for_lease(request, give_up_at)

    def _hand_over(self, owner: str, *, until: float) -> Coroutine[Any, Any, bool]:
        """Release ``owner``'s lease (see ``waiting.hand_over``): the coroutine itself, one level
        fewer for every step of the request to pass through."""
        return hand_over(self._store, self._name, owner, fair=self._options.fair, until=until, permits=self._permits)

    async def _pass_on(self, owner: str) -> None:
        """Release ``owner``'s lease, granted too late to hold (its local deadline had passed).
        Nobody holds it: if MongoDB does not answer in time (a server slower than the TTL), what is
        left of it expires on its own, and the acquire goes on (as ``release`` of a lost lease does
        not raise). Errors retrying cannot fix propagate."""
        try:
            await self._hand_over(owner, until=deadline_in(self._options.ttl))
        except PyMongoError as error:
            if not is_transient(error):
                raise
            logger.debug("could not pass on %r, granted too late to hold (%s)", self._name, cause_of(error))

    async def _try_request(
        self, owner: str, ttl_ms: int, *, on_cancelled: Callable[[LockState], Awaitable[None]]
    ) -> LockState:
        """The request of a non-blocking acquire for ``owner``, bounded by the TTL."""
        return await self._store.try_acquire(
            self._name,
            owner,
            ttl_ms,
            self._holder(),
            fair=self._options.fair,
            permits=self._permits,
            bound=self._options.ttl,
            on_cancelled=on_cancelled,
        )

    async def _try_once(self) -> Grant | None:
        """One acquire request, without queueing."""
        owner = secrets.token_hex(16)
        ttl_ms = _ms(self._options.ttl)

        async def hand_on_if_taken(state: LockState) -> None:
            if state.holds(owner):
                await self._hand_over(owner, until=deadline_in(self._options.ttl))

        sent_at = time.monotonic()
        try:
            state = await self._try_request(owner, ttl_ms, on_cancelled=hand_on_if_taken)
        except ServerSelectionTimeoutError as error:
            # Never sent (see waiting._attempt): nothing to undo, and not a busy lock.
            raise ServerUnreachableError(self._name, cause_of(error), time.monotonic() - sent_at) from error
        except PyMongoError as error:
            if is_transient(error):
                # The server may have applied it: release what this token may hold before raising.
                await finish_soon(self._hand_over(owner, until=deadline_in(self._options.ttl)))
            raise
        return Grant(owner, state.fence_of(owner), sent_at, ttl_ms) if state.holds(owner) else None

    def _hold(self, grant: Grant) -> bool:
        """Make ``grant`` this handle's lease; False if its local deadline has already passed."""
        ttl = min(self._options.ttl, grant.ttl_ms / 1000)
        deadline = local_deadline(grant.sent_at, ttl, self._options.safety_margin)
        if time.monotonic() >= deadline:
            return False
        self._lost = None
        lease = Lease(
            store=self._store,
            name=self._name,
            owner=grant.owner,
            fencing_token=grant.fencing_token,
            ttl=self._options.ttl,
            safety_margin=self._options.safety_margin,
            deadline=deadline,
            heartbeat_interval=self._options.heartbeat_interval(self._options.ttl),
            holder=weakref.ref(self),
            loop=asyncio.get_running_loop(),
            hooks=self._options.hooks,
            permits=self._permits,
        )
        lease.arm()
        self._lease = lease
        if lease.heartbeat_interval is not None:
            keeper_for_running_loop().keep(lease)
        return True

    async def release(self) -> bool:
        """Give the lock up. True if this ended our live lease; False if we held nothing live.

        If another task of this process waits for the lock, the lease passes to it in the same
        write. Never raises for a lease that expired or was taken over, nor for one already lost
        (past its local deadline): what may be left of that on the server is removed if MongoDB
        answers in time, and expires on its own otherwise. For a live lease, an error
        that outlasts the lease's time on the server is raised. The request runs shielded: a
        cancellation waits for it (up to the TTL, after which the lease has expired anyway) and
        then propagates.
        """
        lease = self._forget_lease()
        if lease is None:
            return False
        lost_already = lease.lost_error is not None or time.monotonic() >= lease.deadline
        # Worth trying until the lease expires on the server anyway (and for a moment at least).
        until = max(lease.server_expiry_floor, deadline_in(_MIN_RELEASE_TIME))
        try:
            released = await self._hand_over(lease.owner, until=until)
        except PyMongoError as error:
            if not lost_already:
                raise
            # Its loss was reported already; failing the caller's clean-up as well tells nothing new.
            logger.debug("could not release %r, which was lost already (%s)", self._name, cause_of(error))
            return False
        if released and self._observed():
            held = lease.held
            logger.debug("released %r after holding it %.3f s", self._name, held)
            notify(self._options.hooks, "released", self._name, fencing_token=lease.fencing_token, held=held)
        return released

    def _observed(self) -> bool:
        """Whether anyone listens for events (hooks, or debug logging): they cost nothing otherwise."""
        return self._options.hooks is not None or logger.isEnabledFor(logging.DEBUG)

    async def extend(self, ttl: float | None = None) -> None:
        """Start a new lease of ``ttl`` seconds (default: the current TTL) from now, server time.

        Raises [`LockNotOwnedError`][mongolock_async.LockNotOwnedError] if this handle holds no live
        lease; the lease then counts as lost (``lost`` is set, ``on_lost`` is called).
        """
        new_ttl = self.ttl if ttl is None else validation.ttl(ttl)
        lease = self._lease
        if lease is None or lease.lost_error is not None:
            raise LockNotOwnedError(self._name)
        interval = self._options.heartbeat_interval(new_ttl)
        sent_at = time.monotonic()
        extended = await self._store.extend(
            self._name, lease.owner, _ms(new_ttl), permits=self._permits, bound=lease.server_expiry_floor - sent_at
        )
        if not extended:
            lease.mark_lost("extend found the lease expired or held by another owner")
            raise LockNotOwnedError(self._name, "the lease expired or another owner holds it now")
        lease.heartbeat_interval = interval
        lease.confirm(sent_at, new_ttl)
        if interval is not None:
            keeper_for_running_loop().keep(lease)  # rescheduled at the (maybe shorter) interval

    async def locked(self) -> bool:
        """Whether anyone holds a live lease on this name, judged by the server.

        Advisory: the answer can be out of date by the time it arrives. It is read with read
        concern ``majority``, so it never shows an acquisition a failover could still roll back.
        """
        return await self._store.is_held(self._name, permits=self._permits, bound=self._options.ttl)

    async def owned(self) -> bool:
        """Whether this handle holds the lease: live on the server and before the local deadline."""
        lease = self._lease
        if lease is None or not lease.believed_held:
            return False
        bound = lease.deadline - time.monotonic()
        held = await self._store.is_held(self._name, lease.owner, permits=self._permits, bound=bound)
        return held and lease.believed_held

    async def guard_transaction(self, session: Any) -> None:
        """Tie the MongoDB transaction running on ``session`` to this handle's lease: the transaction
        commits only if the lease was live when this ran, and no one can take the lock over before
        the commit (a takeover waits for the commit; one that came first makes this fail).

        Call it inside the transaction, best as its first statement, on a session of the lock
        collection's client:

        ```python
        async with client.start_session() as session:
            async with await session.start_transaction():
                await lock.guard_transaction(session)
                await orders.insert_one(order, session=session)
        ```

        One request, a write to the lock document inside the transaction. It holds that document
        until the transaction ends, so renewals of this lease (and others' acquires) wait for the
        commit: keep guarded transactions well under the TTL. MongoDB ends a transaction after 60 s
        (``transactionLifetimeLimitSeconds``).

        Raises [`LockLostError`][mongolock_async.LockLostError] (and marks the lease lost,
        cancelling an ``async with`` block) if the lease has ended, locally or on the server; the
        transaction must then be aborted, which ``async with session.start_transaction()`` and
        ``session.with_transaction`` do on the error. A ``WriteConflict`` error labelled
        ``TransientTransactionError`` propagates as the driver raised it: the lock document changed
        since the transaction's snapshot (a takeover, or this lease's own renewal);
        ``with_transaction`` then runs the callback again, and this call tells which it was.
        [`LockNotOwnedError`][mongolock_async.LockNotOwnedError] if the handle never held the lock;
        [`TransactionsUnsupportedError`][mongolock_async.TransactionsUnsupportedError] on a
        standalone server; ``ValueError`` if ``session`` is not in a transaction. The checks before
        the request do no I/O.
        """
        if not getattr(session, "in_transaction", False):
            raise ValueError(
                "guard_transaction needs a session in a transaction: call it inside "
                "`async with await session.start_transaction():` (PyMongo) or `session.with_transaction`"
            )
        lease = self._lease
        if lease is None:
            raise LockNotOwnedError(self._name)
        if lease.lost_error is None and time.monotonic() >= lease.deadline:
            lease.mark_lost("the lease's local deadline passed before guard_transaction")
        if lease.lost_error is not None:
            raise lease.lost_error
        if _standalone(session.client):
            # A standalone mongod refuses transactions (IllegalOperation); some test servers run them
            # without their guarantees. Either way the guard would protect nothing.
            raise TransactionsUnsupportedError(
                f"lock {self._name!r}: guard_transaction needs a replica set or a sharded cluster; "
                "this server is a standalone, without multi-document transactions"
            )
        live = await self._store.guard_transaction(
            self._name,
            lease.owner,
            lease.fencing_token,
            session,
            permits=self._permits,
            bound=lease.deadline - time.monotonic(),
        )
        if not live:
            lease.mark_lost("guard_transaction found the lease expired, released by force, or taken over")
        if lease.lost_error is not None:
            raise lease.lost_error

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise LockTimeoutError(self._name, self._options.timeout if self._options.blocking else None)
        self._guard_body()
        return self

    def _guard_body(self) -> None:
        """Make the running task the body that a loss of the lease cancels (until ``__aexit__``)."""
        lease = self._lease
        if lease is None:
            raise RuntimeError("a body guarded without a lease")
        # Entered here and checked in __aexit__, in the same task: loss cancels the block.
        lease.body = BodyGuard()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lease = self._lease
        if lease is None:
            return
        cancelled_by_loss = lease.body is not None and lease.body.close(exc_type)
        if lease.lost_error is None and time.monotonic() >= lease.deadline:
            # The deadline timer could not run: the event loop was blocked past the deadline.
            lease.mark_lost(
                f"the block ran past the lease's local deadline (ttl {lease.ttl:g} s) without renewal; "
                + (
                    "the event loop was blocked, so the heartbeat could not run: code in the block must yield"
                    if lease.heartbeat_interval is not None
                    else "use heartbeat=True for work that can outlast the TTL"
                )
            )
        lost_error = lease.lost_error
        if lost_error is not None:
            # Lost means expired or taken over: nothing of ours is left on the server to release.
            self._forget_lease()
            if exc_type is None or cancelled_by_loss:
                raise lost_error
            return
        try:
            released = await self.release()
        except PyMongoError:
            if exc_type is None:
                raise
            logger.exception("releasing %r failed while the block raised; the lease will expire", self._name)
            return
        if not released:
            error = LockLostError(
                self._name,
                "the lease was gone when the block ended (released by force, or expired and taken over)",
                datetime.now(UTC),
            )
            if exc_type is None:
                raise error
            logger.warning("%s (the block raised %s, which propagates)", error, exc_type.__name__)

    def _lease_lost(self, lease: Lease) -> None:
        """Called by ``lease`` when it is lost: set ``lost``, call ``on_lost``."""
        if lease is not self._lease:
            return
        if self._lost is not None:
            self._lost.set()
        if self._options.on_lost is not None:
            call_on_lost(self._options.on_lost, self)

    def __del__(self) -> None:
        # A handle dropped while holding must not keep its lease alive (or held) for ever.
        lease = getattr(self, "_lease", None)  # None if __init__ refused its arguments
        if lease is not None:
            _abandoned(lease, self._options.fair, type(self).__name__)

    def _forget_lease(self) -> Lease | None:
        """Detach the current lease from this handle and the heartbeat; return it."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.end()
            if lease.heartbeat_interval is not None:
                keeper_for_running_loop().drop(lease)
        return lease


def _abandoned(lease: Lease, fair: bool, kind: str) -> None:
    """A handle was garbage-collected while holding ``lease``: stop renewing it and release it.

    The release runs in a task that the shutdown of ``asyncio.run`` waits for (for at most
    ``GIVE_UP_SLACK`` seconds), so a program whose main coroutine returns holding a lock releases it.
    """
    if lease.ended or lease.lost_error is not None:
        return
    if lease.loop.is_closed():
        logger.warning(
            "an %s handle for %r was garbage-collected while holding it, after its event loop closed: its lease "
            "could not be released, and stays held until it expires on the server (its TTL is %g s)",
            kind,
            lease.name,
            lease.ttl,
        )
        return
    logger.warning("an %s handle for %r was garbage-collected while holding it; releasing its lease", kind, lease.name)

    def end_it() -> None:
        lease.end()
        keeper_for_running_loop().drop(lease)
        spawn(_release_abandoned(lease, fair), shielded_for=GIVE_UP_SLACK)

    lease.loop.call_soon_threadsafe(end_it)


async def _release_abandoned(lease: Lease, fair: bool) -> None:
    until = min(lease.server_expiry_floor, deadline_in(GIVE_UP_SLACK))
    try:
        await hand_over(lease.store, lease.name, lease.owner, fair=fair, until=until, permits=lease.permits)
    except (Exception, asyncio.CancelledError) as error:  # cancelled: its time ran out
        cause = "no answer in time" if isinstance(error, asyncio.CancelledError) else cause_of(error)
        logger.warning(
            "could not release %r, whose handle was garbage-collected (%s); it stays held until it expires on "
            "the server (its TTL is %g s)",
            lease.name,
            cause,
            lease.ttl,
        )
        if isinstance(error, asyncio.CancelledError):
            raise


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


_MAX_HOST_BYTES = 255
"""The longest DNS name: a semaphore's document holds a host per holder, up to 10,000 of them."""


@functools.cache
def _hostname() -> str:
    # Cut at a character boundary: gethostname can return a longer name than DNS allows.
    return socket.gethostname().encode()[:_MAX_HOST_BYTES].decode(errors="ignore")


def _standalone(client: AsyncClient) -> bool:
    """Whether the client is connected to a standalone server, as far as its monitoring knows (it has
    at least the server this handle acquired on)."""
    types = {server.server_type for server in client.topology_description.server_descriptions().values()}
    return types == {SERVER_TYPE.Standalone}
