"""``AsyncMongoElection``: one standing leader per name, across processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Unpack

from pymongo.errors import PyMongoError

from .._runtime.lease import logger
from .._util.collection_types import AsyncCollectionLike
from ..errors import LockLostError, LockTimeoutError
from ..store import LockStore, Permits
from ..store.documents import Leadership
from .lock import WAIT_OPTIONS, AsyncMongoLock, WaitKeywords
from .options import LeaseOptions

_LEADERSHIP = Permits("election", 1)
# An observer reads the document again at least this often even when its stream is quiet (a
# stream can miss nothing, but a leader that died with nobody waiting writes nothing either).
_IDLE_READ = 60.0
# Read this long after a leadership's time is up on the server's clock, so that it has expired.
_EXPIRY_SLACK = 0.05
_MAX_AWAIT_MS = 1000


class AsyncMongoElection(AsyncMongoLock):
    """A leader election: at most one leader of ``name`` at a time, kept while the leader lives.

    Every replica makes one handle and campaigns; the winner leads until it resigns, its process
    dies (the leadership then expires after ``ttl``), or it loses the lease (a network cut, a pause
    past the TTL, ``mongolock release --force``). Leadership is a lease with every promise of
    [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]: the server's clock, renewal by the shared
    heartbeat (always on here: ``True`` renews every ``ttl / 3``, or give an interval), loss that
    cancels the leader's work. Candidates are served in turn across processes, and a resignation
    hands leadership to the next candidate in the same write (its process learns it from the change
    stream at once, not at expiry).

    Each term has its own number, ``term``: the leadership's fencing token, above every term before
    it (across resignations, expiry, forced release and purge). Pass it with leader-only writes so
    the resource can refuse a deposed leader's (see the fencing guide).

    Use [`lead`][mongolock_async.AsyncMongoElection.lead] to run leader-only work for as long as
    the process lives, ``async with election:`` for one term, or
    [`campaign`][mongolock_async.AsyncMongoElection.campaign] and
    [`resign`][mongolock_async.AsyncMongoElection.resign]. Anyone can ask who leads with
    [`leader`][mongolock_async.AsyncMongoElection.leader], without campaigning. The other keyword
    arguments are a lock's; an election always serves in turn, so it takes no ``fair``. A name is
    of one kind: using an election's name as a lock, a semaphore or a read-write lock raises
    [`LockDataError`][mongolock_async.LockDataError].
    """

    def __init__(
        self, collection: AsyncCollectionLike, name: str, ttl: float = 15.0, **options: Unpack[WaitKeywords]
    ) -> None:
        if options.get("heartbeat") is False:
            raise ValueError("an election keeps its leader with the heartbeat: heartbeat must be True or an interval")
        checked = LeaseOptions.checked("AsyncMongoElection", WAIT_OPTIONS, ttl=ttl, **{"heartbeat": True, **options})
        self._init(collection, name, dataclasses.replace(checked, fair=True), _LEADERSHIP)

    @property
    def leading(self) -> bool:
        """Whether this handle leads now: it won a term that has not ended, locally judged (its
        lease is before its local deadline and not lost)."""
        lease = self._lease
        return lease is not None and lease.believed_held

    @property
    def term(self) -> int | None:
        """The term this handle leads in; None while it does not lead."""
        return self.fencing_token

    async def campaign(self, timeout: float | None = None) -> int:
        """Wait until this handle leads, and return its term.

        Waits in turn behind the candidates before it, for up to ``timeout`` seconds (the
        handle's default when None; None there waits for ever), then raises
        [`LockTimeoutError`][mongolock_async.LockTimeoutError]. Raises
        [`LockAlreadyHeldError`][mongolock_async.LockAlreadyHeldError] if this handle leads
        already. Cancelling it withdraws the candidacy (a leadership won meanwhile is handed on).
        """
        if not await self.acquire(timeout=timeout):
            raise LockTimeoutError(self._name, self._options.timeout if timeout is None else timeout)
        term = self.term
        if term is None:  # acquire returned True: held
            raise RuntimeError(f"election {self._name!r}: held without a term")
        return term

    async def resign(self, to: str | None = None) -> bool:
        """Stop leading; the next candidate leads from this write. True if this ended a live term.

        ``to`` names a waiting candidate (its ``label``) to lead next instead of the next in turn:
        its place is first moved to the front of the queue (one request, made only while this
        handle leads), then the resignation hands leadership to it. Raises ``LookupError``, still
        leading, if no candidate with that label waits. A candidate that gives up between the two
        requests is passed over for the next in turn.
        """
        if to is None:
            return await self.release()
        if not isinstance(to, str):
            raise TypeError(f"to must be a candidate's label (a str) or None, not {type(to).__name__}")
        if not to:
            raise ValueError("to must be a candidate's label, not an empty string")
        lease = self._lease
        if lease is None or not lease.believed_held:
            return await self.release()
        bound = lease.deadline - time.monotonic()
        if not await self._store.put_candidate_first(self._name, lease.owner, to, permits=_LEADERSHIP, bound=bound):
            raise LookupError(f"no candidate labelled {to!r} waits in election {self._name!r}")
        return await self.release()

    async def leader(self) -> Leadership | None:
        """Who leads ``name`` now, judged on the server's clock; None if nobody does. Does not
        campaign. Read with read concern ``majority``; the answer can be out of date on arrival.
        Raises [`LockDataError`][mongolock_async.LockDataError] if the name is not an election's."""
        return await self._store.leadership(self._name, bound=self._options.ttl)

    async def changes(self) -> AsyncGenerator[Leadership | None, None]:
        """Who leads now, then every change: a new term (a new leader, or the same one elected
        again), or nobody leading (the last leader resigned, or its term expired). For anyone; does
        not campaign.

        Each write to the election's document is seen through a change stream opened before the
        first read, and the document is read again then, so a change is yielded one change event
        after its write; an expiry, which writes nothing, is seen when the leadership's time is up.
        Where there are no change streams (a standalone server) or the stream fails, the document
        is read every ``ttl / 3`` until the stream opens again. The leader's renewals are writes
        too: an observer reads the document once per heartbeat tick of the leader. Errors reading
        the document (as [`leader`][mongolock_async.AsyncMongoElection.leader]'s) propagate.
        Wrap it in ``contextlib.aclosing`` to close its stream as soon as you stop iterating.
        """
        watch = _NameWatch(self._store, self._name)
        try:
            first, yielded_term = True, None
            while True:
                await watch.open()
                current = await self.leader()
                term = None if current is None else current.term
                if first or term != yielded_term:
                    first, yielded_term = False, term
                    yield current
                poll = self._options.ttl / 3 if watch.stream is None else _IDLE_READ
                await watch.next_write(poll if current is None else min(poll, current.time_left + _EXPIRY_SLACK))
        finally:
            await watch.close()

    async def lead(self, work: Callable[[int], Awaitable[object]]) -> None:
        """Campaign, run ``work(term)`` while leading, and campaign again whenever leadership is
        lost; return (resigning) once ``work`` returns.

        A loss cancels ``work`` (as it cancels an ``async with`` block), is logged at WARNING, and
        a new campaign starts at once; ``work`` starts again, with the new term, when this handle
        leads again. Errors from ``work`` propagate (after resigning), as do the acquire's
        (``ServerUnreachableError``, ``LockTimeoutError`` if the handle has a ``timeout``).
        Cancelling ``lead`` cancels ``work`` and resigns.
        """
        while True:
            try:
                async with self:
                    term = self.term
                    if term is None:  # entered: held
                        raise RuntimeError(f"election {self._name!r}: held without a term")
                    await work(term)
                return
            except LockLostError as error:
                logger.warning("leadership of %r lost (%s); campaigning again", self._name, error)


class _NameWatch:
    """A change stream of one election's document for one observer, reopened when it fails."""

    def __init__(self, store: LockStore, name: str) -> None:
        self._store = store
        self._name = name
        self.stream: Any = None

    async def open(self) -> None:
        if self.stream is not None and self.stream.alive:
            return
        await self.close()
        try:
            self.stream = await self._store.watch_name(self._name, max_await_ms=_MAX_AWAIT_MS)
        except PyMongoError as error:  # no replica set, or no server now: the observer polls
            logger.debug("no change stream for election %r (%s); reading it every poll", self._name, error)

    async def next_write(self, within: float) -> None:
        """Return at the next write to the document, or after ``within`` seconds."""
        give_up_at = time.monotonic() + within
        while time.monotonic() < give_up_at:
            if self.stream is None:
                await asyncio.sleep(max(0.0, give_up_at - time.monotonic()))
                return
            try:
                # Between two getMores (each at most a second), never cut one off midway: a
                # cancelled getMore would cost the pooled connection it ran on.
                if await self.stream.try_next() is not None:
                    return
            except PyMongoError as error:
                logger.debug("change stream of election %r failed (%s); reopening", self._name, error)
                await self.close()
                return
            if not self.stream.alive:
                await self.close()
                return

    async def close(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(PyMongoError):
                await asyncio.shield(stream.close())
