"""How a blocked acquire waits for its lease, and how a release hands the lease to the next waiter.

Read ``wait_for_lease`` from the top: it drives one task through the states of
``Turn`` (the diagram is in docs/design.md). The tasks of one process (strictly: one
event loop) that wait for one name queue in arrival order (``queues``), and only the first of
them talks to the server. Its attempt that finds the lock held also stores a *place* for the
process in the queue stored with the lock (see ``store``); the place carries the owner token the
lease is handed to when its turn comes. (A task that finds nobody waiting sends its first attempt
before its queue is made, ``queues.FirstAttempt``: most find the lock free and never need one.)
The process's heartbeat keeps the place alive (``keeper``); if the process dies, the place expires.

A release by a handle of this process (``hand_over``) passes the lease to the first waiter in
the same write (a *local hand-off*: one request for the release and the next acquisition). So that
one process cannot keep a hot lock to itself, at most ``LOCAL_STREAK`` local hand-offs happen in
a row while another process has a place; then the lease goes to that place. With ``fair=True``
every release hands to the oldest place, whichever process it belongs to, and a free lock is not
taken past an older place.

The first waiter learns that another process handed the lease to its place through the
collection's change stream (``watcher``), or else when its backoff ends; it then *claims* the
lease with its next attempt, which restarts the expiry from that request's send time.

An outage is ridden out, not mistaken for a busy lock: attempts that fail in transit are retried
with backoff (each retry logged at WARNING, at most every ``WARNING_INTERVAL`` seconds), until
MongoDB has not been reached for the handle's ``unreachable_timeout``, or the acquire's timeout
passes; either raises, with the driver's error as the cause. Errors retrying cannot fix
(certificates, credentials) are raised at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any, NamedTuple

from pymongo.errors import PyMongoError, ServerSelectionTimeoutError

from .._util.backoff import Backoff
from .._util.diagnosis import cause_of
from .._util.shield import RequestTimeout, start_shielded, wait_for_event, wait_within
from ..errors import LockTimeoutError, ServerUnreachableError
from ..store import LockStore, Permits, PlaceRequest, is_transient
from ..store.documents import LockState
from .keeper import keeper_for_running_loop
from .queues import (
    FirstAttempt,
    Grant,
    LocalQueue,
    PlaceState,
    Turn,
    Waiter,
    existing_queue,
    first_attempt,
    join,
    leave,
)
from .watcher import ReleaseWatcher, watcher_for

logger = logging.getLogger("mongolock_async")

LOCAL_STREAK = 8
"""Local hand-offs in a row after which another process's place gets the lease (default mode)."""
WARNING_INTERVAL = 10.0
"""Seconds between two warnings about retried acquires, per process."""
GIVE_UP_SLACK = 2.0
"""Seconds a waiter that gives up (timed out, cancelled, failed) waits at most, past its timeout, for
the withdrawal of its process's place when MongoDB does not answer it at once; the withdrawal then
goes on in the background until the place would have expired anyway."""
_EXPIRY_SLACK = 0.01
"""Seconds a waiter sleeps past an expiry before looking again (so that it has passed on the server)."""
_RETRY_BASE, _RETRY_CAP = 0.05, 1.0

_background: set[asyncio.Task[Any]] = set()


class AcquireRequest(NamedTuple):
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
    timeout: float | None
    """The acquire's timeout, for the error that says it passed while MongoDB could not be reached."""
    unreachable_timeout: float | None
    """How long MongoDB may stay unreachable before the acquire raises (None: for ever)."""
    permits: Permits | None = None
    """What a semaphore's (or read-write lock's) request is for: one of its permits. None for a lock."""

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))


async def wait_for_lease(request: AcquireRequest, give_up_at: float | None) -> Grant | None:
    """Queue behind this process's other waiters and wait for the lease; None past ``give_up_at``.

    Drives one task through the states of ``Turn``: QUEUED until it is first in line;
    then DUE, ATTEMPTING, and PLACED (or BACKING_OFF after a failure in transit) until an attempt,
    a release or a hand-off makes it GRANTED. Events from elsewhere (the change stream, releases of
    this process, the heartbeat) move it through the ``LocalQueue`` and wake it.

    Raises ``LockTimeoutError`` if ``give_up_at`` passes while MongoDB cannot be reached, and
    ``ServerUnreachableError`` once it has not been reached for ``request.unreachable_timeout``.
    If the caller is cancelled, a lease this produced is handed on and only the cancellation
    propagates.
    """
    watcher = watcher_for(request.store)
    backoff = Backoff(request.retry_base, request.retry_cap)
    queue: LocalQueue | None = None
    waiter: Waiter | None = None
    first = None
    if request.permits is None and not watcher.streaming:  # nothing can report a hand-off to it
        first = first_attempt(
            request.store,
            request.name,
            request.ttl_ms,
            request.holder,
            token_prefix=watcher.token_prefix,
            fresh_for=request.fresh_for,
        )
    if first is None:
        weight = 1 if request.permits is None else request.permits.weight
        waiter = Waiter(ttl_ms=request.ttl_ms, holder=request.holder, fresh_for=request.fresh_for, weight=weight)
        queue = join(
            request.store, request.name, waiter, token_prefix=watcher.token_prefix, followers=request.permits is None
        )
    attempted = first is not None
    try:
        if first is not None:
            try:
                granted = await _first_attempt(first, request, watcher, backoff, give_up_at)
            finally:
                queue, waiter = first.queue, first.waiter  # None if it took the lock with nobody looking
            if granted is not None:
                return granted
        if queue is None or waiter is None:
            raise RuntimeError("no place in the queue after a first attempt that took nothing")
        while waiter.turn is not Turn.GRANTED:
            waiter.wake.clear()
            queue.raise_refusal(waiter)
            now = time.monotonic()
            _give_up_if_unreachable(queue, request, now)
            due = waiter.turn is Turn.DUE and not queue.releases_in_flight and queue.line_attempt is None
            if give_up_at is not None and now >= give_up_at and (attempted or not due):
                _give_up_if_unreachable(queue, request, now, timed_out=give_up_at)
                return None
            if due:
                await _attempt(queue, waiter, request, watcher, backoff, first=not attempted, give_up_at=give_up_at)
                attempted = True
                continue
            wake_at = None
            if waiter.turn is Turn.PLACED:
                if queue.look_at is None:
                    queue.look_at = now + _sleep_without_news(watcher, request, backoff)
                wake_at = queue.look_at
            elif waiter.turn is Turn.BACKING_OFF:
                if waiter.attempt_at is None:
                    waiter.attempt_at = now + backoff.next_delay()
                wake_at = waiter.attempt_at
            if wake_at is not None:
                if now >= wake_at:
                    waiter.turn = Turn.DUE
                    continue
                keeper_for_running_loop().keep_place(queue)
            await _sleep_until(waiter, wake_at, give_up_at, _unreachable_at(queue, request))
        return waiter.grant
    except asyncio.CancelledError:
        # Granted in the same loop iteration as the cancel: pass it on.
        if waiter is not None and waiter.grant is not None:
            owner = waiter.grant.owner
            until = deadline_in(request.ttl)
            await finish_soon(
                hand_over(request.store, request.name, owner, fair=request.fair, until=until, permits=request.permits)
            )
        raise
    finally:
        if queue is not None and waiter is not None and leave(queue, waiter):
            if queue.kept:  # most acquires never wait: their queue never had a place to keep
                keeper_for_running_loop().drop_place(queue)
            if queue.place is not PlaceState.ABSENT:
                # Nobody here wants the places any more: withdraw them (a lease handed to one
                # meanwhile is passed on) before giving up returns, so that no release can hand
                # the lock to a waiter that is gone, even if the program ends or closes its client next.
                await finish_soon(_withdraw(queue, request))


async def _first_attempt(
    first: FirstAttempt,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    give_up_at: float | None,
) -> Grant | None:
    """The attempt of a task that waits alone, sent before its queue is made (see ``FirstAttempt``):
    the lease if it took the lock and nobody looked meanwhile. Otherwise the queue is made, the
    attempt's answer (or failure) applied to it as ``_attempt`` would, and None returned: the waiter
    goes on from there. If the caller is cancelled, or an error retrying cannot fix is raised, the
    queue is made too, so that the waiter's leaving withdraws whatever the attempt did."""
    sent_at = time.monotonic()
    attempt = _Attempt(first.place, sent_at, covered=False, with_session=False, uncertain_since=None)
    bound = request.ttl if give_up_at is None else min(request.ttl, give_up_at - sent_at)
    try:
        state, _ = await _send(attempt, request, bound)
    except BaseException as error:
        queue = first.made_queue()
        if isinstance(error, asyncio.CancelledError):
            queue.on_attempt_abandoned(attempt.place, attempt.sent_at)
        elif isinstance(error, PyMongoError) and is_transient(error):
            _apply_failure(queue, attempt, request, error, bound=bound, give_up_at=give_up_at)
            return None
        raise
    token = first.place.token
    if first.queue is None and state.holds(token):
        first.unregister()
        return Grant(token, state.fence_of(token), attempt.sent_at, first.place.ttl_ms)
    _apply_answer(first.made_queue(), attempt, request, watcher, backoff, state, None)
    return None


async def _attempt(
    queue: LocalQueue,
    waiter: Waiter,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    *,
    first: bool,
    give_up_at: float | None,
) -> None:
    """DUE -> ATTEMPTING -> GRANTED, PLACED, DUE (again, in a session) or BACKING_OFF: the first
    waiter's attempt takes the lock, claims a lease handed to its place, or stores the place.

    When no change stream reports releases yet, the attempt runs in a session, whose
    ``operationTime`` is where the stream starts. Except the first of an acquire: it most often
    takes a free lock, and a session would only slow that down; if it fails, the next attempt
    follows at once, in a session.

    An attempt is bounded by the TTL and, in an outage, by when it is given up. It is also bounded
    by the waiter's own timeout when nobody waits behind it; with waiters behind, it belongs to the
    line instead: it runs on in the background (this returns at once, the waiter ATTEMPTING) and
    its answer goes to whoever is first in line then. Else, on a server slower than the patience
    each waiter has left when its turn comes, every attempt would be cut before its answer, and
    nobody would ever learn that the lease it waits behind has expired.
    """
    covered = watcher.covers_new_requests()
    attempt = _Attempt(
        place=queue.head_place(),
        sent_at=time.monotonic(),
        covered=covered,
        with_session=not covered and (not first or waiter.in_session),
        uncertain_since=queue.uncertain_since,
    )
    queue.on_attempt_sent(waiter)
    unreachable_at = _unreachable_at(queue, request)
    line_bound = request.ttl if unreachable_at is None else min(request.ttl, unreachable_at - attempt.sent_at)
    if give_up_at is None or give_up_at - attempt.sent_at >= line_bound or len(queue.waiters) == 1:
        bound = line_bound if give_up_at is None else min(line_bound, give_up_at - attempt.sent_at)
        try:
            await _send_and_apply(queue, attempt, request, watcher, backoff, bound=bound, give_up_at=give_up_at)
        except asyncio.CancelledError:
            # The request ran to its end, but this task is gone: what it wrote is withdrawn (or
            # claimed by the next waiter) on the way out of wait_for_lease.
            queue.on_attempt_abandoned(attempt.place, attempt.sent_at)
            raise
        return
    queue.on_line_attempt_sent(attempt.place, attempt.sent_at)
    spawn(_line_attempt(queue, attempt, request, watcher, backoff, bound=line_bound))


async def _line_attempt(
    queue: LocalQueue,
    attempt: _Attempt,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    *,
    bound: float,
) -> None:
    """The line's attempt: its answer moves the waiter first in line then, and what it raises
    (an error retrying cannot fix) is raised by that waiter's acquire."""
    refusal = None
    try:
        await _send_and_apply(queue, attempt, request, watcher, backoff, bound=bound, give_up_at=None)
    except Exception as error:
        refusal = error
    finally:
        if not queue.on_line_attempt_done(refusal) and refusal is not None:
            logger.warning("acquiring %r failed after every waiter had left (%s)", request.name, cause_of(refusal))


class _Attempt(NamedTuple):
    """One attempt of the first waiter, as it was sent."""

    place: PlaceRequest
    sent_at: float
    covered: bool
    """Whether a change stream reported releases from before the send on."""
    with_session: bool
    uncertain_since: float | None
    """The queue's ``uncertain_since`` at the send (see ``LocalQueue``)."""


async def _send_and_apply(
    queue: LocalQueue,
    attempt: _Attempt,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    *,
    bound: float,
    give_up_at: float | None,
) -> None:
    """Send ``attempt`` within ``bound`` seconds (``give_up_at``: the waiter's own timeout, where
    that bounds it) and move the waiter first in line by its answer; nobody if all have left (the
    withdrawal of the place then covers whatever the attempt did)."""
    try:
        state, operation_time = await _send(attempt, request, bound)
    except PyMongoError as error:
        if not is_transient(error):
            raise
        _apply_failure(queue, attempt, request, error, bound=bound, give_up_at=give_up_at)
        return
    _apply_answer(queue, attempt, request, watcher, backoff, state, operation_time)


async def _send(attempt: _Attempt, request: AcquireRequest, bound: float) -> tuple[LockState, Any]:
    """The attempt's request: the lock's state after it, and its ``operationTime`` if it was sent
    in a session (where the change stream must start at it), else None."""
    place = attempt.place
    # Sent in a session where the change stream must start at the request's ``operationTime``.
    store = request.store
    arguments = (request.name, place.token, place.ttl_ms, place.holder)
    follower, keep_expiry, fair, permits = place.follower, place.keep_expiry, request.fair, request.permits
    if attempt.with_session:
        return await store.try_acquire(
            *arguments, enqueue=True, fair=fair, follower=follower, keep_expiry=keep_expiry, permits=permits,
            operation_time=True, bound=bound,
        )
    state = await store.try_acquire(
        *arguments, enqueue=True, fair=fair, follower=follower, keep_expiry=keep_expiry, permits=permits,
        bound=bound,
    )
    return state, None


def _apply_failure(
    queue: LocalQueue,
    attempt: _Attempt,
    request: AcquireRequest,
    error: PyMongoError,
    *,
    bound: float,
    give_up_at: float | None,
) -> None:
    """The attempt failed in transit (``error``, which retrying may fix): back off, and count it
    towards an outage unless the server was merely slow."""
    sent_at = attempt.sent_at
    # PyMongo raises ServerSelectionTimeoutError only for a write it never sent (on a retry it
    # raises the first attempt's error instead: pymongo/asynchronous/mongo_client.py,
    # _ClientConnectionRetryable.run).
    sent = not isinstance(error, ServerSelectionTimeoutError)
    # A request that got no answer in time while others did met a slow server, not an outage;
    # so did one the acquire's own timeout cut too short to tell: the acquire timed out, as
    # under a busy lock.
    slow = isinstance(error, RequestTimeout) and (
        request.store.answered_at > sent_at or _cut_too_short_to_tell(request, give_up_at, bound)
    )
    queue.on_attempt_failed(attempt.place, error, sent_at, maybe_applied=sent, outage=not slow)
    if not slow and _will_retry(queue, request, give_up_at):
        _warn_retrying(request.name, error)


def _apply_answer(
    queue: LocalQueue,
    attempt: _Attempt,
    request: AcquireRequest,
    watcher: ReleaseWatcher,
    backoff: Backoff,
    state: LockState,
    operation_time: Any,
) -> None:
    """Move the waiter first in line by the attempt's answer (the lock's ``state`` after it)."""
    place, sent_at, covered = attempt.place, attempt.sent_at, attempt.covered
    token = place.token
    queue.on_answered()
    head = queue.head
    if head is None or queue.slot != token:
        return  # a release of this process handed the lease on while this was in flight, or nobody waits
    if state.holds(token):
        queue.local_streak = 0
        # A lease claimed without moving its expiry counts from the unanswered request that may
        # have set it (see PlaceRequest.keep_expiry): its expiry is later than that plus the TTL.
        granted_at = sent_at if attempt.uncertain_since is None else min(sent_at, attempt.uncertain_since)
        queue.on_taken(Grant(token, state.fence_of(token), granted_at, place.ttl_ms), follower=place.follower)
        # The same write queued a place for the next waiter: the hand-off to it must be reported
        # too, by a stream from this write on, or else the next waiter looks again, in a session.
        if (
            place.follower is not None
            and queue.head is not None
            and not covered
            and (operation_time is None or not watcher.cover_from(request.store, operation_time))
        ):
            queue.on_place_uncovered()
        return
    # Unless a stream reports releases from before this attempt on, one could go unnoticed.
    covered = covered or (attempt.with_session and watcher.cover_from(request.store, operation_time))
    queue.on_placed(place, sent_at, state.fencing_token, covered=covered)
    if head.turn is Turn.PLACED:
        until_change = _until_next_change(state, token, fair=request.fair)
        queue.look_at = time.monotonic() + _sleep_without_news(watcher, request, backoff, until_change)


def _until_next_change(state: LockState, token: str, *, fair: bool) -> float | None:
    """Seconds from the write that stored ``token``'s place until an attempt could go otherwise
    with nobody writing: a lease (or a permit) expires, or, served in turn, a place ahead of ours
    does (its process died: nothing writes when it expires). None if nothing is due to expire.

    Reckoned on the server's clock, from the place's ``at``; expiries already past (a lease that
    expired while a place ahead still blocks it) are not waited for.
    """
    written = state.place_of(token)
    if written is None or written.refreshed_at is None:
        return None
    now = written.refreshed_at
    moments = [permit.expires_at for permit in state.permits]
    if state.owner is not None and state.expires_at is not None:
        moments.append(state.expires_at)
    if fair:
        moments.extend(place.expires_at for place in state.queue[: state.queue.index(written)])
    upcoming = [moment for moment in moments if moment > now]
    if not upcoming:
        return None
    return (min(upcoming) - now).total_seconds() + _EXPIRY_SLACK


def _cut_too_short_to_tell(request: AcquireRequest, give_up_at: float | None, bound: float) -> bool:
    """Whether a request that the acquire's deadline (not its TTL) bounded to ``bound`` seconds
    says nothing of an outage when it gets no answer: the server answered this acquire already,
    or the request had under half the acquire's timeout (it was sent late: a loaded machine can
    stall a process for a fifth of a second between ``acquire()`` and the send)."""
    timeout = request.timeout
    if give_up_at is None or timeout is None or bound >= request.ttl:
        return False
    return request.store.answered_at >= give_up_at - timeout or bound < timeout / 2


def _give_up_if_unreachable(
    queue: LocalQueue, request: AcquireRequest, now: float, *, timed_out: float | None = None
) -> None:
    """Raise if MongoDB has not been reached for too long, or the acquire timed out meanwhile."""
    error = queue.last_error
    if queue.failing_since is None or error is None:
        return
    if timed_out is not None:
        timeout = request.timeout if request.timeout is not None else now - queue.failing_since
        raise LockTimeoutError(request.name, timeout, unreachable=cause_of(error)) from error
    bound = request.unreachable_timeout
    if bound is not None and now - queue.failing_since >= bound:
        raise ServerUnreachableError(request.name, cause_of(error), now - queue.failing_since) from error


def _unreachable_at(queue: LocalQueue, request: AcquireRequest) -> float | None:
    if queue.failing_since is None or request.unreachable_timeout is None:
        return None
    return queue.failing_since + request.unreachable_timeout


def _will_retry(queue: LocalQueue, request: AcquireRequest, give_up_at: float | None) -> bool:
    """Whether the acquire goes on after a failed attempt (else saying "retrying" would be wrong)."""
    now = time.monotonic()
    return all(moment is None or now < moment for moment in (give_up_at, _unreachable_at(queue, request)))


_last_warning = 0.0
_retries_unreported = 0


def _warn_retrying(name: str, error: Exception) -> None:
    """Log a retry after an error at WARNING, at most once per ``WARNING_INTERVAL`` per process
    (saying how many retries went unreported since)."""
    global _last_warning, _retries_unreported
    now = time.monotonic()
    if now - _last_warning < WARNING_INTERVAL:
        _retries_unreported += 1
        return
    since = f" ({_retries_unreported} more retries since the last such message)" if _retries_unreported else ""
    logger.warning("acquiring %r: MongoDB could not be reached (%s); retrying%s", name, cause_of(error), since)
    _last_warning, _retries_unreported = now, 0


def _sleep_without_news(
    watcher: ReleaseWatcher, request: AcquireRequest, backoff: Backoff, until_change: float | None = None
) -> float:
    """How long a PLACED waiter sleeps unless woken: while the change stream reports releases and
    hand-offs, until the next expiry that can let it in (at most a TTL); else jittered backoff,
    never past that expiry."""
    delay = max(request.retry_cap, request.ttl) if watcher.streaming else backoff.next_delay()
    return delay if until_change is None else min(delay, until_change)


async def _sleep_until(waiter: Waiter, *moments: float | None) -> None:
    """Sleep until woken or the earliest of ``moments``."""
    until = min((moment for moment in moments if moment is not None), default=None)
    delay = None if until is None else until - time.monotonic()
    if (delay is not None and delay <= 0) or waiter.wake.is_set():
        return
    await wait_for_event(waiter.wake, delay)


async def hand_over(
    store: LockStore, name: str, owner: str, *, fair: bool, until: float, permits: Permits | None = None
) -> bool:
    """Release ``owner``'s lease on ``name``, handing it to the next waiter in the same write.

    The lease goes to this process's head waiter when there is one (within the streak limit, or in
    its turn with ``fair``), else to the oldest place of another process, else nobody. Returns
    whether the lease was still live. With ``permits``, ``owner``'s permit is returned and
    handed on the same way. A transient failure is retried with backoff until ``until``
    (monotonic: when the lease expires on the server anyway), which also bounds each request; past
    it the last error is raised. A cancellation waits for the request in flight and propagates.
    """
    backoff = None  # made on the first failure: most releases have none
    # Any of the requests may be the one the server applied: what the lease is handed on with
    # counts from the first one's send time, the earliest it can have been applied.
    first_sent_at = time.monotonic()
    while True:
        try:
            return await _hand_over_once(
                store, name, owner, fair=fair, until=until, first_sent_at=first_sent_at, permits=permits
            )
        except PyMongoError as error:
            backoff = backoff or Backoff(_RETRY_BASE, _RETRY_CAP)
            delay = backoff.next_delay()
            if not is_transient(error) or time.monotonic() + delay >= until:
                raise
            logger.debug("releasing %r failed (%s); retrying", name, str(error))
            await asyncio.sleep(delay)
        except _HandedToNobody as handed:
            # Handed to this process's place, but its waiters are gone: pass the lease on, and
            # withdraw the follower place that write queued, or the lease could go to it next.
            await withdraw(store, name, handed.tokens, fair=fair, until=until, permits=permits)
            return True


class _HandedToNobody(Exception):
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens


async def _hand_over_once(
    store: LockStore, name: str, owner: str, *, fair: bool, until: float, first_sent_at: float, permits: Permits | None
) -> bool:
    queue = existing_queue(store, name, 1 if permits is None else permits.weight)
    successor = None
    if queue is not None and queue.waiters:
        # Named even while the first waiter's own attempt is in flight: both carry the same tokens,
        # and whichever reply comes first gives the lease (the other finds the slot moved on).
        successor = queue.head_place()
        queue.on_release_sent()
    sent_at = time.monotonic()
    try:
        state = await store.release(
            name,
            owner,
            successor=successor,
            fair=fair,
            successor_first=queue is not None and queue.local_streak < LOCAL_STREAK,
            permits=permits,
            bound=until - sent_at,
        )
    finally:
        if successor is not None and queue is not None:
            queue.on_release_done()
    if queue is None or state is None:
        if state is None and queue is not None:
            queue.on_news()  # not ours any more (expired): the lock may be free
        return state is not None
    if successor is None:
        if state.owner is None:
            queue.on_news()  # free (a semaphore: a permit freed): a waiter that came meanwhile takes it
        return True
    if state.holds(successor.token):
        if queue.slot != successor.token:
            return True  # the first waiter's own attempt claimed it first, and has it
        grant = Grant(successor.token, state.fence_of(successor.token), first_sent_at, successor.ttl_ms)
        if not queue.on_taken(grant, follower=successor.follower):
            follower = [successor.follower.token] if successor.follower is not None else []
            raise _HandedToNobody([successor.token, *follower])
        queue.local_streak += 1
        return True
    queue.on_lease_went_elsewhere(successor, first_sent_at, state.fencing_token)
    return True


def deadline_in(seconds: float) -> float:
    """The monotonic time ``seconds`` from now."""
    return time.monotonic() + seconds


async def _withdraw(queue: LocalQueue, request: AcquireRequest) -> None:
    """Withdraw the places of ``queue``, whose waiters all left; retried until they would have
    expired anyway (nothing refreshes them any more)."""
    lifetime = max(request.ttl, queue.place_ttl_ms / 1000)
    await withdraw(
        queue.store, queue.name, queue.tokens(), fair=request.fair, until=deadline_in(lifetime), permits=request.permits
    )


async def withdraw(
    store: LockStore, name: str, tokens: list[str], *, fair: bool, until: float, permits: Permits | None
) -> None:
    """Withdraw the queue places holding ``tokens`` (a lease handed to one meanwhile is passed
    on), retrying transient failures with backoff until ``until`` (monotonic), when the places
    expire by themselves. A failure is logged at WARNING: until then a release can hand the lock to
    a place nobody waits behind, and that lease stays idle for its TTL."""
    backoff = Backoff(_RETRY_BASE, _RETRY_CAP)
    while True:
        try:
            await store.leave(name, tokens, fair=fair, permits=permits, bound=until - time.monotonic())
            return
        except PyMongoError as error:
            delay = backoff.next_delay()
            if is_transient(error) and time.monotonic() + delay < until:
                logger.debug("withdrawing the queue place for %r failed (%s); retrying", name, str(error))
                await asyncio.sleep(delay)
                continue
            logger.warning(
                "could not withdraw this process's queue place for %r (%s): until it expires, within %.0f s, "
                "a release can hand the lock to it, and the lock then stays held by nobody for its TTL",
                name,
                cause_of(error),
                max(0.0, until - time.monotonic()),
            )
            return


async def finish_soon(cleanup: Coroutine[Any, Any, Any]) -> None:
    """Run ``cleanup`` (a release, a withdrawal) and wait for it, whatever happens to the caller, for
    at most ``GIVE_UP_SLACK`` seconds; past that it goes on in the background. A cancellation of
    the caller meanwhile is raised once the wait ends."""
    await wait_within(spawn(cleanup), GIVE_UP_SLACK)


def spawn(coroutine: Coroutine[Any, Any, Any], *, shielded_for: float | None = None) -> asyncio.Task[Any]:
    """Run ``coroutine`` in the background, in a fresh context so that no caller's
    ``pymongo.timeout`` (or other context) applies to it, and keep it referenced until it ends. What it raises is
    logged (nobody awaits it): a release that could not be sent leaves a lease to expire.

    With ``shielded_for``, nothing but that many seconds' passing cancels it (see
    ``start_shielded``): a program that ends meanwhile waits for it."""
    if shielded_for is not None:
        task = start_shielded(coroutine, bound=shielded_for)
    else:
        task = asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())
    _background.add(task)
    task.add_done_callback(_background_done)
    return task


def _background_done(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    error = None if task.cancelled() else task.exception()
    if error is not None:
        logger.warning("a background release of a lock failed (%s); it expires by itself", str(error))
