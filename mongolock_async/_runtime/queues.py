"""The tasks of this process waiting for a lock, per event loop, lock name and weight (a read-write
lock's readers apart from its writers), in arrival order, and the two state types of waiting: where
a task's blocked acquire stands (``Turn``), and where this process's place in the queue stored with
the lock stands (``PlaceState``).

Every transition is a method of ``LocalQueue``, named after what triggers it; the diagram is in
docs/design.md ("The states of a blocked acquire"). Nothing here sends a request: ``waiting``
drives a waiting task through the states and calls the store; the change stream (``watcher``),
the heartbeat (``keeper``) and releases of this process (``waiting``) report what they saw
through the ``on_*`` methods.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._util.weak import PerLoop
from ..store import LockStore, PlaceRequest

QueueKey = tuple[int, str, str, int]
"""(id of the client, collection full name, lock name, weight). A queue holds its store, so the
client it names stays alive, and its id unique, for as long as the queue is registered. Waiters of
one weight queue together (a read-write lock's readers apart from its writers), so that a place,
which asks for one weight, is never the place of a waiter that wants another."""


class Turn(enum.Enum):
    """Where one task's blocked acquire stands."""

    QUEUED = "queued"
    """Behind earlier tasks of this process: sends nothing, waits to be first."""
    DUE = "due"
    """First in line, its next attempt due now (held back only while a release of this process,
    which may hand it the lease, is in flight)."""
    ATTEMPTING = "attempting"
    """First in line, its acquire request in flight. Events that arrive meanwhile move it on (to
    ``DUE`` or ``GRANTED``) and the request's reply does not undo that."""
    PLACED = "placed"
    """First in line, the lock held elsewhere and this process's place stored: sleeps until news (a
    release, a hand-off), the holder's expiry, or its backoff where no change stream reports news."""
    BACKING_OFF = "backing off"
    """First in line, its last request failed in transit: tries again after a backoff."""
    GRANTED = "granted"
    """The lease is this task's: taken or claimed by its attempt, or handed to it by a release."""


class PlaceState(enum.Enum):
    """Where this process's place in the queue stored with the lock stands."""

    ABSENT = "absent"
    """None written, or the server showed it gone (its turn came, or it expired)."""
    STORED = "stored"
    """A reply showed it in the queue; the heartbeat keeps it alive."""
    UNCERTAIN = "uncertain"
    """A request that may have written it failed: kept alive, and withdrawn when nobody waits."""


class Grant(NamedTuple):
    """A lease given to a waiting task: its owner and fencing tokens, and when it started.

    ``sent_at`` is the local monotonic time at which the request that produced the lease was sent;
    the server set its expiry ``ttl_ms`` after that request arrived.
    """

    owner: str
    fencing_token: int
    sent_at: float
    ttl_ms: int


@dataclass(eq=False, slots=True)
class Waiter:
    """One task's blocked acquire, queued."""

    ttl_ms: int
    holder: Mapping[str, Any]
    fresh_for: float
    """How old the place's last write may be for a hand-off to be taken without a claim: the
    handle's safety margin (see ``LocalQueue.on_handed_to_place``)."""
    weight: int = 1
    """What it asks for of a semaphore's or read-write lock's limit (a lock's waiters: 1)."""
    turn: Turn = Turn.QUEUED
    attempt_at: float | None = None
    """In ``BACKING_OFF``: when to attempt if no news comes first (None: not set yet). In ``PLACED``
    the queue's ``look_at`` says when."""
    in_session: bool = False
    """Its next attempt runs in a session: no change stream covers the time since the place was
    written, and the stream must start at that attempt's ``operationTime``."""
    grant: Grant | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on every transition made by someone else, so the waiting task looks again."""


class LocalQueue:
    """The tasks of one event loop waiting for one lock name with one weight, and this process's
    place for them."""

    def __init__(
        self,
        store: LockStore,
        name: str,
        key: QueueKey,
        token_prefix: str,
        *,
        followers: bool,
        registry: dict[QueueKey, LocalQueue | FirstAttempt],
    ) -> None:
        self.store = store
        self.name = name
        self.key = key
        self.registry = registry
        """The running loop's queues, this one among them while anyone waits in it (see ``join``)."""
        self.kept = False
        """Whether the heartbeat keeps this queue's place alive (see ``LeaseKeeper.keep_place``)."""
        self.token_prefix = token_prefix
        """Starts every owner token of this process's places, so hand-offs reach only its stream."""
        self.followers = followers
        """Whether a write that gives the first waiter the lease queues the second's place (a lock).
        A semaphore's next waiter attempts at once instead: a permit may still be free."""
        self.waiters: deque[Waiter] = deque()
        self.place = PlaceState.ABSENT
        self.slot: str | None = None
        """The owner token of this process's place: what the lease is handed to at its turn."""
        self.place_written_at = 0.0
        self.place_fence = 0
        """The document's fencing token as of that write: a hand-off to the place made after the
        write carries a higher one. A report of an older hand-off (a change event delivered late,
        after the place expired and was written again with the same token) is not taken as fresh."""
        """Monotonic send time of the last request whose reply showed the place in the queue. A
        hand-off to the place lasts a TTL from that write's server time at least (see the store)."""
        self.place_ttl_ms = 0
        """The lease length that write put in the place: what a hand-off to it grants."""
        self.place_follower: PlaceRequest | None = None
        """The follower recorded with the place: the place a hand-off to it queues next."""
        self.look_at: float | None = None
        """Monotonic time at which the first waiter, placed, attempts if no news comes first (the
        expiry that can let it in, or the end of its sleep; None: not set yet). It belongs to the
        place, not to a waiter: one that gives up leaves it to the next, or a line of waiters that
        each give up sooner would put the look off for ever, behind a lease that expired (or was
        handed to this place unseen) meanwhile."""
        self.upcoming: PlaceRequest | None = None
        """The follower for the place: the place of the waiter after the first. Every request that
        writes the first waiter's place names the same one, so whichever of them gives the lease,
        the process's next place is the one this process expects."""
        self.line_attempt: tuple[PlaceRequest, float] | None = None
        """The place and send time of an attempt in flight that belongs to the line, not to the
        waiter that sent it (see ``waiting``): whoever is first in line when it is answered is
        moved by the answer, and sends no attempt of its own meanwhile."""
        self.refusal: Exception | None = None
        """What the line's attempt raised, for the first waiter's acquire to raise."""
        self.releases_in_flight = 0
        """Releases of this process in flight that may hand the lease to the first waiter."""
        self.local_streak = 0
        """Consecutive hand-offs between tasks of this process; reset when the lease goes elsewhere."""
        self.failing_since: float | None = None
        """Monotonic time of the first attempt, since the last answered one, that failed in transit."""
        self.last_error: Exception | None = None
        """The error of the last attempt, if it failed in transit."""
        self.uncertain_since: float | None = None
        """Monotonic send time of the earliest request for the place whose outcome is unknown (it
        failed in transit, or its waiter stopped waiting for it), since a reply last showed the
        place; None if there is none. While it is set, attempts claim without moving the lease's
        expiry (``PlaceRequest.keep_expiry``), and a lease they get counts from then."""

    @property
    def head(self) -> Waiter | None:
        return self.waiters[0] if self.waiters else None

    def new_token(self) -> str:
        return self.token_prefix + secrets.token_hex(16)

    def head_place(self) -> PlaceRequest:
        """The place of the first waiter (its token is the slot), with the follower for the second."""
        head = self.waiters[0]
        if self.slot is None:
            self.slot = self.new_token()
        keep = self.uncertain_since is not None
        if not self.followers:
            return PlaceRequest(self.slot, head.ttl_ms, head.holder, weight=head.weight, keep_expiry=keep)
        if len(self.waiters) > 1 and self.upcoming is None:
            self.upcoming = PlaceRequest(self.new_token(), self.waiters[1].ttl_ms, self.waiters[1].holder)
        # The follower the place records on the server is named again while it may be there, even
        # with its waiter gone: a hand-off to the place queues it, and a claim that named none
        # would leave that place queued, unknown here, for the next release to hand the lock to.
        follower = self.upcoming if len(self.waiters) > 1 else self.place_follower
        return PlaceRequest(self.slot, head.ttl_ms, head.holder, follower, keep_expiry=keep)

    def tokens(self) -> list[str]:
        """The tokens of this process's places on the server (the slot and its follower)."""
        return [token for token in (self.slot, self.place_follower and self.place_follower.token) if token]

    # -- transitions ---------------------------------------------------------------------------------

    def _move(self, waiter: Waiter, turn: Turn) -> None:
        waiter.turn = turn
        waiter.wake.set()

    def _first_in_line(self, waiter: Waiter) -> None:
        """QUEUED -> DUE, or PLACED (not yet scheduled) when a place of this process is known to be
        stored and covered by a change stream or a backoff: it just waits for its turn there. An
        uncertain place is looked at first: a lease may have been taken for it already. While the
        line's attempt is in flight, it waits for that one's answer (ATTEMPTING)."""
        if self.line_attempt is not None:
            self._move(waiter, Turn.ATTEMPTING)
        elif self.place is not PlaceState.STORED or waiter.in_session:
            self._move(waiter, Turn.DUE)
        else:
            self._move(waiter, Turn.PLACED)

    def on_joined(self, waiter: Waiter) -> None:
        """A task starts waiting: last in line, first if nobody else waits."""
        self.waiters.append(waiter)
        if len(self.waiters) == 1:
            self._first_in_line(waiter)

    def on_left(self, waiter: Waiter) -> None:
        """A task stops waiting (granted, timed out, cancelled, failed): the next one is first."""
        was_head = self.head is waiter
        if waiter in self.waiters:
            self.waiters.remove(waiter)
        head = self.head
        if was_head and head is not None:
            self._first_in_line(head)
        if head is None and self.line_attempt is not None:
            self._uncertain(*self.line_attempt)  # whatever it writes is withdrawn

    def on_attempt_sent(self, waiter: Waiter) -> None:
        """DUE -> ATTEMPTING: the reply says when to look next."""
        waiter.turn = Turn.ATTEMPTING
        self.look_at = None

    def on_line_attempt_sent(self, place: PlaceRequest, sent_at: float) -> None:
        """The first waiter's attempt (for ``place``, sent at ``sent_at``) belongs to the line: it
        runs on, and its answer goes to whoever is first in line then."""
        self.line_attempt = (place, sent_at)

    def on_line_attempt_done(self, refusal: Exception | None) -> bool:
        """The line's attempt ended, its answer (if any) applied: a first waiter that the answer
        did not move on (it came first meanwhile) goes on as a new first waiter. A ``refusal`` (an
        error retrying cannot fix) is raised by the first waiter's acquire. False if nobody waits."""
        self.line_attempt = None
        head = self.head
        if head is None:
            return False
        self.refusal = refusal
        if head.turn is Turn.ATTEMPTING:
            self._first_in_line(head)
        head.wake.set()  # a DUE waiter held back can go now
        return True

    def raise_refusal(self, waiter: Waiter) -> None:
        """Raise the line's attempt's refusal if ``waiter`` is first in line (the refusal is its)."""
        refusal = self.refusal
        if refusal is not None and waiter is self.head:
            self.refusal = None
            raise refusal

    def on_taken(self, grant: Grant, *, follower: PlaceRequest | None) -> bool:
        """The first waiter's place got the lease (its own attempt, a release, a hand-off):
        -> GRANTED, and the next waiter is first, with ``follower`` (queued by the same write) as
        the process's place. False if nobody waits any more."""
        self._placed(follower, grant.sent_at, grant.fencing_token)
        if not self.waiters:
            return False
        head = self.waiters.popleft()
        head.grant = grant
        self._move(head, Turn.GRANTED)
        if self.waiters:
            self._first_in_line(self.waiters[0])
        return True

    def on_placed(self, place: PlaceRequest, sent_at: float, fence: int, *, covered: bool) -> None:
        """The attempt's reply shows the lock held elsewhere and the place stored: the first waiter
        ATTEMPTING -> PLACED (scheduled by the caller), or -> DUE in a session when no change stream
        covers the time since the write. An event that moved the waiter meanwhile stands."""
        self._placed(place, sent_at, fence)
        waiter = self.head
        if waiter is None or waiter.turn is not Turn.ATTEMPTING:
            return
        waiter.in_session = not covered
        if covered:
            self._move(waiter, Turn.PLACED)
        else:
            self._move(waiter, Turn.DUE)

    def on_attempt_failed(
        self, place: PlaceRequest, error: Exception, now: float, *, maybe_applied: bool, outage: bool
    ) -> None:
        """The attempt failed in transit: the first waiter ATTEMPTING -> BACKING_OFF (scheduled by the caller), and
        with ``outage`` the outage clock runs (not for a slow answer while others came). If the
        server may have applied it, the place (and the follower it records, or queues with the
        lease) may be there: UNCERTAIN."""
        if maybe_applied:
            self._uncertain(place, now)
        if outage:
            if self.failing_since is None:
                self.failing_since = now
            self.last_error = error
        waiter = self.head
        if waiter is None:
            return
        waiter.in_session = False
        if waiter.turn is Turn.ATTEMPTING:
            waiter.attempt_at = None
            self._move(waiter, Turn.BACKING_OFF)

    def on_attempt_abandoned(self, place: PlaceRequest, sent_at: float) -> None:
        """The caller of the first waiter's attempt (sent at ``sent_at``) was cancelled while it
        was in flight: the request ran to its end, but its reply is not applied here. Whatever it
        wrote (the place, the follower it records, or a lease taken for the place) is UNCERTAIN:
        withdrawn if nobody waits any more, else looked at by the next first waiter's attempt,
        which claims such a lease (without moving its expiry)."""
        if self.slot == place.token:
            self._uncertain(place, sent_at)

    def _uncertain(self, place: PlaceRequest, sent_at: float) -> None:
        """A request for the place, sent at ``sent_at``, may have been applied: UNCERTAIN."""
        self.place = PlaceState.UNCERTAIN
        self.place_follower = place.follower or self.place_follower
        self.uncertain_since = sent_at if self.uncertain_since is None else min(self.uncertain_since, sent_at)

    def on_place_uncovered(self) -> None:
        """The write that gave the first waiter's predecessor the lease queued this process's next
        place, and no change stream reports hand-offs from that write on: the first waiter looks
        again at once, in a session (-> DUE), so that its place never waits for a hand-off nobody
        will report."""
        head = self.head
        if head is not None:
            head.in_session = True
            self._move(head, Turn.DUE)

    def on_answered(self) -> None:
        """An attempt got a reply: whatever outage there was is over."""
        self.failing_since = None
        self.last_error = None

    def on_news(self) -> None:
        """Something happened that is worth an attempt (a release seen, the lock found free, the
        place found gone): PLACED, BACKING_OFF or ATTEMPTING -> DUE."""
        head = self.head
        if head is not None and head.turn in (Turn.PLACED, Turn.BACKING_OFF, Turn.ATTEMPTING):
            self._move(head, Turn.DUE)

    def on_handed_to_place(self, owner: str, fence: object) -> None:
        """The change stream saw the lease handed to this process's place.

        The hand-off lasts a TTL from the place's last write at least, so the first waiter takes it
        as it is (-> GRANTED) if that write is recent enough and the hand-off came after it (its
        ``fence`` is above ``place_fence``); else, or while its own attempt or a release of this
        process is in flight, it claims it with an attempt (-> DUE), which restarts the expiry
        from that attempt's send time (and finds an expired hand-off gone).
        """
        head = self.head
        if owner != self.slot or head is None:
            return
        fresh = head.turn is Turn.PLACED and not self.releases_in_flight
        fresh = fresh and time.monotonic() - self.place_written_at <= head.fresh_for
        if not fresh or isinstance(fence, bool) or not isinstance(fence, int) or fence <= self.place_fence:
            self.on_news()
            return
        self.on_taken(Grant(owner, fence, self.place_written_at, self.place_ttl_ms), follower=self.place_follower)

    def on_release_sent(self) -> None:
        """A release of this process that may hand the lease to the first waiter is in flight: it
        holds back its attempts."""
        self.releases_in_flight += 1

    def on_release_done(self) -> None:
        self.releases_in_flight -= 1
        if self.releases_in_flight == 0 and self.head is not None:
            self.head.wake.set()  # a DUE waiter held back can go now

    def on_place_confirmed(self, sent_at: float) -> None:
        """The heartbeat refreshed the place (it was there when the request sent at ``sent_at`` arrived)."""
        self.place_written_at = max(self.place_written_at, sent_at)

    def on_place_unconfirmed(self) -> None:
        """The heartbeat's refresh of the place failed in transit: that says nothing of whether the
        place is there (a refresh never writes one), so it is UNCERTAIN (withdrawn if nobody waits
        any more), and the first waiter looks at it. Taken as gone, a waiter giving up before it
        looked would leave it queued, withdrawn by nobody, for a release to hand the lock to (the
        model found it: model/check.py's refresh-failed-gone control)."""
        if self.place is not PlaceState.ABSENT:
            self.place = PlaceState.UNCERTAIN
        self.on_news()

    def on_place_gone(self) -> None:
        """The heartbeat found the place gone (its turn came, or it expired): it must be written again."""
        self.place = PlaceState.ABSENT
        self.on_news()

    def on_lease_went_elsewhere(self, place: PlaceRequest, sent_at: float, fence: int) -> None:
        """A release of this process handed the lease to another process; its write stored this
        process's place (the successor's) in the queue."""
        self.local_streak = 0
        if self.slot == place.token:
            self._placed(place, sent_at, fence)

    def _placed(self, place: PlaceRequest | None, written_at: float, fence: int) -> None:
        """A request sent at ``written_at`` left ``place`` in the server's queue (or, for None, this
        process has no place there)."""
        if place is not None and place is self.upcoming:
            self.upcoming = None
        if place is None or place.token != self.slot:
            self.look_at = None  # a new place: its first waiter has seen nothing of it yet
        self.slot = None if place is None else place.token
        self.place = PlaceState.ABSENT if place is None else PlaceState.STORED
        self.uncertain_since = None
        self.place_written_at = written_at
        self.place_fence = fence
        self.place_ttl_ms = 0 if place is None else place.ttl_ms
        self.place_follower = None if place is None else place.follower


class FirstAttempt:
    """The first attempt of a task that waits alone for a lock, in flight before its queue is made.

    Most acquires find the lock free: their first attempt takes it, and a queue, a waiter and their
    records would be made for nothing (``waiting.wait_for_lease``). So a task that finds no queue
    for the name (and no change stream on the collection, so nothing can report a hand-off to it)
    registers this instead and sends the attempt the queue's first waiter would send: a place with
    a fresh slot token, no follower, no session. Whoever looks the name up meanwhile (a task that
    comes to wait for it too, a release of this process, the change stream) gets the queue made
    (``queue``) as it would stand with the attempt sent by its first waiter (``waiter``,
    ATTEMPTING), and the attempt's answer is then applied to that queue. An attempt nobody looked
    at that takes the lock is done with at once (``unregister``); any other outcome makes the
    queue too, and the waiter goes on from there.
    """

    __slots__ = ("fresh_for", "key", "place", "queue", "registry", "store", "token_prefix", "waiter")

    def __init__(
        self,
        store: LockStore,
        key: QueueKey,
        place: PlaceRequest,
        *,
        token_prefix: str,
        fresh_for: float,
        registry: dict[QueueKey, LocalQueue | FirstAttempt],
    ) -> None:
        self.store = store
        self.key = key
        self.place = place
        self.token_prefix = token_prefix
        self.fresh_for = fresh_for
        self.registry = registry
        self.queue: LocalQueue | None = None
        self.waiter: Waiter | None = None

    def made_queue(self) -> LocalQueue:
        """The queue, made now if nobody has looked yet: the attempt's waiter first in it, ATTEMPTING."""
        if self.queue is not None:
            return self.queue
        place = self.place
        queue = self.queue = LocalQueue(
            self.store, self.key[2], self.key, self.token_prefix, followers=True, registry=self.registry
        )
        self.registry[self.key] = queue
        self.waiter = Waiter(ttl_ms=place.ttl_ms, holder=place.holder, fresh_for=self.fresh_for)
        queue.on_joined(self.waiter)
        queue.slot = place.token
        queue.on_attempt_sent(self.waiter)
        return queue

    def unregister(self) -> None:
        """The attempt took the lock and nobody looked: forget it."""
        if self.registry.get(self.key) is self:
            del self.registry[self.key]


_queues: PerLoop[dict[QueueKey, LocalQueue | FirstAttempt]] = PerLoop(dict)
"""The running loop's queues, by key (and first attempts of tasks waiting alone, made into queues
when looked up)."""


def _looked_up(entry: LocalQueue | FirstAttempt | None) -> LocalQueue | None:
    return entry.made_queue() if isinstance(entry, FirstAttempt) else entry


def queue_key(store: LockStore, name: str, weight: int) -> QueueKey:
    return (id(store.client), store.full_name, name, weight)


def existing_queue(store: LockStore, name: str, weight: int) -> LocalQueue | None:
    """The running loop's queue for ``name`` and ``weight``, if anyone waits in it."""
    return _looked_up(_queues.get().get(queue_key(store, name, weight)))


def queues_on(client_id: int, full_name: str) -> list[LocalQueue]:
    """The running loop's queues on one collection of one client."""
    entries = [entry for key, entry in _queues.get().items() if key[0] == client_id and key[1] == full_name]
    return [queue for queue in map(_looked_up, entries) if queue is not None]


def first_attempt(
    store: LockStore, name: str, ttl_ms: int, holder: Mapping[str, Any], *, token_prefix: str, fresh_for: float
) -> FirstAttempt | None:
    """Register the first attempt of a task that waits alone for ``name`` (a lock's waiter), with a
    fresh slot token; None if a queue (or another first attempt) is there already."""
    queues = _queues.get()
    key = queue_key(store, name, 1)
    if key in queues:
        return None
    place = PlaceRequest(token_prefix + secrets.token_hex(16), ttl_ms, holder)
    attempt = queues[key] = FirstAttempt(
        store, key, place, token_prefix=token_prefix, fresh_for=fresh_for, registry=queues
    )
    return attempt


def join(store: LockStore, name: str, waiter: Waiter, *, token_prefix: str, followers: bool = True) -> LocalQueue:
    """Queue ``waiter`` last for ``name`` among the waiters of its weight, creating the queue if
    needed (``followers``: see ``LocalQueue``)."""
    queues = _queues.get()
    key = queue_key(store, name, waiter.weight)
    queue = _looked_up(queues.get(key))
    if queue is None:
        queue = queues[key] = LocalQueue(store, name, key, token_prefix, followers=followers, registry=queues)
    queue.on_joined(waiter)
    return queue


def leave(queue: LocalQueue, waiter: Waiter) -> bool:
    """Take ``waiter`` out. True if the queue is now empty and unregistered."""
    queue.on_left(waiter)
    if queue.waiters:
        return False
    if queue.registry.get(queue.key) is queue:
        del queue.registry[queue.key]
    return True
