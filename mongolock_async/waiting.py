"""How blocked acquires wait, and how a release hands the lease to the next waiter.

The tasks of one process (strictly: one event loop) that wait for one name queue in arrival order
(:mod:`.queues`), and only the first of them, the *head*, talks to the server. Its failed attempt
also takes a *place* for the process in the queue stored with the lock (see :mod:`.store`); the
place carries the owner token the lease is handed to when its turn comes. The process's batched
heartbeat keeps the place alive (:mod:`.keeper`); if the process dies, the place expires.

A release by a handle of this process passes the lease to the head in the same write (a *local
hand-off*: one request for the release and the next acquisition). So that one process cannot keep
a hot lock to itself, at most :data:`LOCAL_STREAK` local hand-offs happen in a row while another
process has a place; then the lease goes to that place. With ``fair=True`` every release hands to
the oldest place, whichever process it belongs to, and a free lock is not taken past an older place.

A head learns that it was handed the lease by another process through the collection's change
stream (:mod:`.watcher`), or else when its backoff ends; it then *claims* the lease with its next
attempt, which restarts the expiry from that request's send time, so its local deadline is sound.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from pymongo.errors import PyMongoError

from ._backoff import Backoff
from ._shield import run_shielded
from .documents import LockState
from .keeper import keeper_for_running_loop
from .queues import Grant, LocalQueue, Waiter, existing_queue, join, remove
from .store import LockStore, PlaceRequest, bounded, is_transient
from .watcher import ReleaseWatcher, watcher_for

logger = logging.getLogger("mongolock_async")

LOCAL_STREAK = 8
"""Local hand-offs in a row after which another process's place gets the lease (default mode)."""
_RETRY_BASE, _RETRY_CAP = 0.05, 1.0

_background: set[asyncio.Task[Any]] = set()


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    """What a blocking acquire asks for, and how it waits."""

    store: LockStore
    name: str
    ttl: float
    holder: Mapping[str, Any]
    fair: bool
    retry_base: float
    retry_cap: float
    fresh_for: float
    """The handle's safety margin: a hand-off seen by the change stream within this long of the
    place's last write is taken without a claim (the lease then ends at most this much earlier)."""

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))


async def wait_for_lease(request: AcquireRequest, give_up_at: float | None) -> Grant | None:
    """Queue behind this process's other waiters and wait for the lease; None past ``give_up_at``.

    The head tries at once; others wait for their turn. If the caller is cancelled, a lease this
    produced is handed on and only the cancellation propagates.
    """
    watcher = watcher_for(request.store)
    waiter = Waiter(ttl_ms=request.ttl_ms, holder=request.holder, fresh_for=request.fresh_for)
    queue = join(request.store, request.name, waiter, token_prefix=watcher.token_prefix)
    backoff = Backoff(request.retry_base, request.retry_cap)
    keeper = keeper_for_running_loop()
    attempted = False
    attempt_at: float | None = None  # the head's next attempt when no news comes first
    try:
        while waiter.grant is None:
            waiter.wake.clear()
            now = time.monotonic()
            is_head = queue.head is waiter
            if not is_head:
                attempt_at = None
            # A release of this process in flight may hand the head the lease: it waits for that.
            can_attempt = is_head and not queue.handing_over
            must_attempt = can_attempt and (
                waiter.news
                or waiter.uncovered
                or not queue.slot_queued
                or (attempt_at is not None and now >= attempt_at)
            )
            if give_up_at is not None and now >= give_up_at and (attempted or not must_attempt):
                return None
            if must_attempt:
                delay = await _attempt(
                    queue, waiter, request, watcher, backoff, first=not attempted, give_up_at=give_up_at
                )
                attempted = True
                attempt_at = None if delay is None else time.monotonic() + delay
            elif can_attempt and attempt_at is None:
                attempt_at = now + _sleep_without_news(watcher, request, backoff)
            if waiter.grant is not None:
                break
            if is_head and queue.slot_queued:
                keeper.keep_place(queue)
            await _sleep_until(waiter, attempt_at if can_attempt else None, give_up_at)
        return waiter.grant
    except asyncio.CancelledError:
        if waiter.grant is not None:  # granted in the same loop iteration as the cancel: pass it on
            owner = waiter.grant.owner
            spawn(hand_over(request.store, request.name, owner, fair=request.fair, until=deadline_in(request.ttl)))
        raise
    finally:
        if remove(queue, waiter):
            keeper_for_running_loop().drop_place(queue)
            if queue.slot_queued:
                # Nobody here wants the places any more: withdraw them, and if the lease was handed
                # to one meanwhile, pass that on. In the background: giving up returns at once.
                spawn(_withdraw(queue.store, queue.name, queue.tokens(), fair=request.fair, within=request.ttl))


async def _attempt(
    queue: LocalQueue,
    waiter: Waiter,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    *,
    first: bool,
    give_up_at: float | None,
) -> float | None:
    """The head's attempt: take, claim, or queue a place. Returns how long to sleep if not taken.

    When no change stream reports releases yet, the attempt runs in a session, whose
    ``operationTime`` is where the stream starts. Except the first of an acquire: it most often
    takes a free lock, and a session would only slow that down; if it fails, the next attempt
    follows at once, in a session. (A head that inherits an uncovered place, queued by the attempt
    that won the lease for the waiter before it, uses a session from its first attempt.)
    """
    waiter.news = False
    place = queue.head_place()
    token = place.token
    covered = watcher.covers_new_requests()
    with_session = not covered and (not first or waiter.uncovered)
    sent_at = time.monotonic()

    async def hand_on_if_taken(result: tuple[LockState, Any]) -> None:
        if result[0].owner == token:
            # Taken for a task that is gone: it leaves the queue, and the lease goes to the next.
            if queue.slot == token:
                queue.queued(place.follower, sent_at)
            remove(queue, waiter)
            await hand_over(request.store, request.name, token, fair=request.fair, until=deadline_in(request.ttl))

    left = request.ttl if give_up_at is None else min(request.ttl, give_up_at - sent_at)
    queue.head_attempting = True
    try:
        with bounded(left, request.store.client):
            state, operation_time = await run_shielded(
                _send_attempt(request, place, with_session=with_session),
                grace=request.ttl,
                on_cancelled=hand_on_if_taken,
            )
    except PyMongoError as error:
        if not is_transient(error):
            raise
        # The server may have applied it: the place (maybe the lease) can be there, and so can
        # the follower's place that the same write queues. Either the next head claims it with the
        # same token, or the last one to leave withdraws both.
        queue.slot_queued = True
        queue.slot_follower = place.follower or queue.slot_follower
        waiter.uncovered = False
        logger.debug("an attempt on %r failed (%s); trying again", request.name, str(error))
        return backoff.next_delay()
    finally:
        queue.head_attempting = False
    if waiter.grant is not None or queue.slot != token:
        return None  # a release of this process handed it the lease while this was in flight
    if state.owner == token:
        queue.streak = 0
        queue.grant_head(Grant(token, state.fencing_token, sent_at, place.ttl_ms), follower=place.follower)
        next_head = queue.head
        # The same write queued a place for the next waiter: the hand-off to it must be reported
        # too, by a stream from this write on, or else the next head looks again, in a session.
        if (
            place.follower is not None
            and next_head is not None
            and not covered
            and (operation_time is None or not watcher.cover_from(request.store, operation_time))
        ):
            next_head.uncovered = True
            next_head.wake.set()
        return None
    queue.queued(place, sent_at)
    # Unless a stream reports releases from before this attempt on, one could go unnoticed.
    waiter.uncovered = not covered and (not with_session or not watcher.cover_from(request.store, operation_time))
    if waiter.uncovered:
        return 0.0
    written = state.place_of(token)
    until_expiry = None
    if state.expires_at is not None and written is not None and written.refreshed_at is not None:
        until_expiry = max(0.0, (state.expires_at - written.refreshed_at).total_seconds())
    return _sleep_without_news(watcher, request, backoff, until_expiry)


async def _send_attempt(request: AcquireRequest, place: PlaceRequest, *, with_session: bool) -> tuple[LockState, Any]:
    """One acquire request; in a session when the change stream must start at its operationTime."""
    store = request.store
    arguments = (request.name, place.token, place.ttl_ms, place.holder)
    options: dict[str, Any] = {"enqueue": True, "fair": request.fair, "follower": place.follower}
    if not with_session:
        return await store.try_acquire(*arguments, **options), None
    async with store.session() as session:
        state = await store.try_acquire(*arguments, session=session, **options)
        return state, session.operation_time


def _sleep_without_news(
    watcher: ReleaseWatcher, request: AcquireRequest, backoff: Backoff, until_expiry: float | None = None
) -> float:
    """How long a head sleeps unless woken: while the change stream reports releases and
    hand-offs, until the holder's expiry (at most a TTL); else jittered backoff, never past the expiry."""
    delay = max(request.retry_cap, request.ttl) if watcher.streaming else backoff.next_delay()
    return delay if until_expiry is None else min(delay, until_expiry)


async def _sleep_until(waiter: Waiter, wake_at: float | None, give_up_at: float | None) -> None:
    """Sleep until woken, ``wake_at`` or ``give_up_at``, whichever comes first."""
    until = min((moment for moment in (wake_at, give_up_at) if moment is not None), default=None)
    delay = None if until is None else until - time.monotonic()
    if (delay is not None and delay <= 0) or waiter.wake.is_set():
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(waiter.wake.wait(), delay)


async def hand_over(store: LockStore, name: str, owner: str, *, fair: bool, until: float) -> bool:
    """Release ``owner``'s lease on ``name``, handing it to the next waiter in the same write.

    The lease goes to this process's head waiter when there is one (within the streak limit, or in
    its turn with ``fair``), else to the oldest place of another process, else nobody. Returns
    whether the lease was still live. A transient failure is retried with backoff until ``until``
    (monotonic: when the lease expires on the server anyway), which also bounds each request; past
    it the last error is raised. A cancellation waits for the request in flight and propagates.
    """
    backoff = Backoff(_RETRY_BASE, _RETRY_CAP)
    # Any of the requests may be the one the server applied: what the lease is handed on with
    # counts from the first one's send time, the earliest it can have been applied.
    first_sent_at = time.monotonic()
    while True:
        try:
            return await _hand_over_once(store, name, owner, fair=fair, until=until, first_sent_at=first_sent_at)
        except PyMongoError as error:
            delay = backoff.next_delay()
            if not is_transient(error) or time.monotonic() + delay >= until:
                raise
            logger.debug("releasing %r failed (%s); retrying", name, str(error))
            await asyncio.sleep(delay)
        except _HandedToNobody as handed:
            # Handed to this process's place, but its waiters are gone: pass the lease on, and
            # withdraw the follower place that write queued, or the lease could go to it next.
            with bounded(until - time.monotonic(), store.client):
                await store.leave(name, handed.tokens, fair=fair)
            return True


class _HandedToNobody(Exception):
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens


async def _hand_over_once(
    store: LockStore, name: str, owner: str, *, fair: bool, until: float, first_sent_at: float
) -> bool:
    queue = existing_queue(store, name)
    successor = None
    if queue is not None and queue.waiters:
        # Named even while the head's own attempt is in flight: both carry the same tokens,
        # and whichever reply comes first gives the lease (the other finds the slot moved on).
        successor = queue.head_place()
        queue.handing_over += 1
    sent_at = time.monotonic()
    try:
        with bounded(until - sent_at, store.client):
            state = await run_shielded(
                store.release(
                    name,
                    owner,
                    successor=successor,
                    fair=fair,
                    successor_first=queue is not None and queue.streak < LOCAL_STREAK,
                ),
                grace=max(0.0, until - sent_at),
            )
    finally:
        if successor is not None and queue is not None:
            queue.handing_over -= 1
            if queue.handing_over == 0:
                queue.wake_head(news=False)  # it skipped its turn while this release was in flight
    if queue is None or state is None:
        if state is None and queue is not None:
            queue.wake_head()  # not ours any more (expired): the lock may be free
        return state is not None
    if successor is None:
        if state.owner is None:
            queue.wake_head()  # free: a head that came meanwhile takes it
        return True
    if state.owner == successor.token:
        if queue.slot != successor.token:
            return True  # the head's own attempt claimed it first, and has it
        grant = Grant(successor.token, state.fencing_token, first_sent_at, successor.ttl_ms)
        if not queue.grant_head(grant, follower=successor.follower):
            follower = [successor.follower.token] if successor.follower is not None else []
            raise _HandedToNobody([successor.token, *follower])
        queue.streak += 1
        return True
    queue.streak = 0
    if queue.slot == successor.token:
        queue.queued(successor, first_sent_at)  # the lease went elsewhere; our successor's place is queued
    return True


def deadline_in(seconds: float) -> float:
    """The monotonic time ``seconds`` from now."""
    return time.monotonic() + seconds


async def _withdraw(store: LockStore, name: str, tokens: list[str], *, fair: bool, within: float) -> None:
    try:
        with bounded(within, store.client):
            await store.leave(name, tokens, fair=fair)
    except Exception as error:  # best effort: the place expires by itself
        logger.debug("could not withdraw the queue place for %r (%s); it expires by itself", name, str(error))


def spawn(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``coroutine`` in the background, in a fresh context so that no caller's
    ``pymongo.timeout`` applies to it, and keep it referenced until it ends. What it raises is
    logged (nobody awaits it): a release that could not be sent leaves a lease to expire."""
    task = asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())
    _background.add(task)
    task.add_done_callback(_background_done)
    return task


def _background_done(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    error = None if task.cancelled() else task.exception()
    if error is not None:
        logger.warning("a background release of a lock failed (%s); it expires by itself", str(error))
