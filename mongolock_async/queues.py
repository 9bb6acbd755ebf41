"""The tasks of this process waiting for a lock, per event loop and lock name, in arrival order.

Nothing here sends a request; :mod:`.waiting` drives the queues and :mod:`.watcher` wakes them.
"""

from __future__ import annotations

import asyncio
import secrets
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .store import LockStore, PlaceRequest

QueueKey = tuple[int, str, str]
"""(id of the client, collection full name, lock name). A queue holds its store, so the client it
names stays alive, and its id unique, for as long as the queue is registered."""


@dataclass(frozen=True, slots=True)
class Grant:
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
    """One task's blocking acquire, queued.

    ``wake`` makes the task look at its state again (it became the head, was granted the lease,
    or has news); ``news`` says that something happened on the server that is worth an attempt.
    """

    ttl_ms: int
    holder: Mapping[str, Any]
    fresh_for: float
    """How old the place's last write may be for a hand-off to be taken without a claim: the
    handle's safety margin (see :func:`.waiting.wait_for_lease`)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    news: bool = False
    uncovered: bool = False
    """Its last attempt failed and no change stream covers the time since: try again in a session."""
    grant: Grant | None = None


class LocalQueue:
    """The tasks of one event loop waiting for one lock name, and this process's place for them."""

    def __init__(self, store: LockStore, name: str, key: QueueKey, token_prefix: str) -> None:
        self.store = store
        self.name = name
        self.key = key
        self.token_prefix = token_prefix
        """Starts every owner token of this process's places, so hand-offs reach only its stream."""
        self.waiters: deque[Waiter] = deque()
        self.slot: str | None = None
        """The owner token of this process's place: what the lease is handed to at its turn."""
        self.slot_queued = False
        """Whether a place with ``slot`` was written to the server's queue (and may still be there)."""
        self.slot_written_at = 0.0
        """Monotonic send time of the last request whose reply showed the place in the queue. A
        hand-off to the place comes after that write, so its lease ends at least a TTL after it."""
        self.slot_ttl_ms = 0
        """The lease length that write put in the place: what a hand-off to it grants."""
        self.slot_follower: PlaceRequest | None = None
        """The follower that write recorded with the place: queued by the hand-off to it."""
        self.upcoming: PlaceRequest | None = None
        """The follower for the place: the place of the waiter after the head. Every request that
        writes the head's place names the same one, so whichever of them gives the head the lease,
        the process's next place is the one this process expects."""
        self.head_attempting = False
        self.handing_over = 0
        """Releases in flight that may hand the lease to the head; the head does not attempt meanwhile."""
        self.streak = 0
        """Consecutive local hand-offs; reset when the lease goes elsewhere."""

    @property
    def head(self) -> Waiter | None:
        return self.waiters[0] if self.waiters else None

    def new_token(self) -> str:
        return self.token_prefix + secrets.token_hex(16)

    def slot_token(self) -> str:
        if self.slot is None:
            self.slot = self.new_token()
        return self.slot

    def head_place(self) -> PlaceRequest:
        """The place of the head waiter (its token is the slot), with the follower for the second."""
        head = self.waiters[0]
        if len(self.waiters) > 1 and self.upcoming is None:
            self.upcoming = PlaceRequest(self.new_token(), self.waiters[1].ttl_ms, self.waiters[1].holder)
        follower = self.upcoming if len(self.waiters) > 1 else None
        return PlaceRequest(self.slot_token(), head.ttl_ms, head.holder, follower)

    def queued(self, place: PlaceRequest | None, written_at: float) -> None:
        """Record that a request sent at ``written_at`` left ``place`` in the server's queue (or that
        this process has no place there, for None)."""
        if place is not None and place is self.upcoming:
            self.upcoming = None
        self.slot = None if place is None else place.token
        self.slot_queued = place is not None
        self.slot_written_at = written_at
        self.slot_ttl_ms = 0 if place is None else place.ttl_ms
        self.slot_follower = None if place is None else place.follower

    def tokens(self) -> list[str]:
        """The tokens of this process's places on the server (the slot and its follower)."""
        return [token for token in (self.slot, self.slot_follower and self.slot_follower.token) if token]

    def wake_head(self, *, news: bool = True) -> None:
        """Make the head look again; with ``news``, also try the server again."""
        head = self.head
        if head is not None:
            head.news = head.news or news
            head.wake.set()

    def grant_head(self, grant: Grant, *, follower: PlaceRequest | None) -> bool:
        """Give the lease to the head, which leaves the queue; False if nobody waits any more.

        ``follower`` is the place the same write queued for the next waiter, if any.
        """
        self.queued(follower, grant.sent_at)
        if not self.waiters:
            return False
        head = self.waiters.popleft()
        head.grant = grant
        head.wake.set()
        self.wake_head(news=False)
        return True


_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[QueueKey, LocalQueue]] = (
    weakref.WeakKeyDictionary()
)


def queue_key(store: LockStore, name: str) -> QueueKey:
    return (id(store.client), store.full_name, name)


def existing_queue(store: LockStore, name: str) -> LocalQueue | None:
    """The running loop's queue for ``name``, if anyone waits for it."""
    return _queues.get(asyncio.get_running_loop(), {}).get(queue_key(store, name))


def queues_on(client_id: int, full_name: str) -> list[LocalQueue]:
    """The running loop's queues on one collection of one client."""
    queues = _queues.get(asyncio.get_running_loop(), {})
    return [queue for key, queue in queues.items() if key[0] == client_id and key[1] == full_name]


def join(store: LockStore, name: str, waiter: Waiter, *, token_prefix: str) -> LocalQueue:
    """Queue ``waiter`` last for ``name``, creating the queue if needed."""
    queues = _queues.setdefault(asyncio.get_running_loop(), {})
    key = queue_key(store, name)
    queue = queues.get(key)
    if queue is None:
        queue = queues[key] = LocalQueue(store, name, key, token_prefix)
    queue.waiters.append(waiter)
    return queue


def remove(queue: LocalQueue, waiter: Waiter) -> bool:
    """Take ``waiter`` out; wake the next head. True if the queue is now empty and unregistered."""
    was_head = queue.head is waiter
    if waiter in queue.waiters:
        queue.waiters.remove(waiter)
    if was_head:
        queue.wake_head(news=False)
    if queue.waiters:
        return False
    queues = _queues.get(asyncio.get_running_loop(), {})
    if queues.get(queue.key) is queue:
        del queues[queue.key]
    return True
