"""The heartbeat: one task per event loop renews every lease held with ``heartbeat`` on, and keeps
this process's places in the locks' queues alive.

Each lease is renewed when its own interval has passed since its last confirmed renewal; leases
due within half an interval ride along, so a tick renews many leases at once. Renewals are sent per
collection in chunks of at most ``RENEWAL_CHUNK`` leases, earliest local deadline first, one
request per chunk: the server's work per lease stays flat however many are held, and no single
write holds the server long enough to stall other requests. Each request is bounded by the
earliest deadline it covers. A failed renewal is retried with backoff; a
lease whose deadline passes unrenewed is lost by its own timer (``lease``), with the last
failure as the reason. A lease the server shows as no longer ours is marked lost at once.

The task exists only while there is something to renew.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from pymongo.errors import PyMongoError

from .._util.shield import wait_for_event
from .._util.weak import PerLoop
from ..store import LockStore, Renewal
from .lease import Lease, logger
from .queues import LocalQueue, PlaceState

RENEWAL_CHUNK = 100
"""Leases renewed per request (see benchmarks/README.md for the measurement behind it)."""
_RETRY_BASE = 0.05


class _Stored(Protocol):
    @property
    def store(self) -> LockStore: ...


_T = TypeVar("_T", bound=_Stored)


class LeaseKeeper:
    """Renews the heartbeat leases and queue places of one event loop."""

    def __init__(self) -> None:
        self._leases: dict[Lease, float] = {}
        """Heartbeat leases and when each is next due."""
        self._places: dict[LocalQueue, float] = {}
        """Queues whose place on the server this process keeps alive, and when each is next due."""
        self._failures: dict[Lease, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._asleep_until: float | None = None
        """When the task, asleep, wakes next; None while it is not asleep (it is renewing, or it
        looks at what is due next before it sleeps again)."""

    @property
    def running(self) -> bool:
        """Whether the renewal task exists (while something is kept, and until a renewal in flight ends)."""
        return self._task is not None and not self._task.done()

    @property
    def has_work(self) -> bool:
        """Whether any lease or queue place is kept."""
        return bool(self._leases or self._places)

    def keep(self, lease: Lease) -> None:
        """Renew ``lease`` from now on, every ``heartbeat_interval``, until ``drop``."""
        if lease.heartbeat_interval is None:
            raise RuntimeError("the keeper renews only a lease with a heartbeat")
        due = self._leases[lease] = time.monotonic() + lease.heartbeat_interval
        self._wake(due)

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease``."""
        self._leases.pop(lease, None)
        self._failures.pop(lease, None)
        self._stop_if_idle()

    def keep_place(self, queue: LocalQueue) -> None:
        """Keep ``queue``'s place on the server alive while it has waiters."""
        if queue not in self._places:
            queue.kept = True
            due = self._places[queue] = time.monotonic() + _place_interval(queue)
            self._wake(due)

    def drop_place(self, queue: LocalQueue) -> None:
        queue.kept = False
        self._places.pop(queue, None)
        self._stop_if_idle()

    def _wake(self, due: float) -> None:
        """Start the task, or wake it if it sleeps past ``due``. Each wake-up looks at everything
        kept (what is due, what has ended): a wake-up per new lease would make taking the n-th
        lease cost n, and taking 10,000 of them 50 million looks."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="mongolock-keeper", context=contextvars.Context()
            )
        elif self._asleep_until is not None and due < self._asleep_until:
            self._changed.set()

    def _stop_if_idle(self) -> None:
        # Never cancel the task: a renewal in flight completes (within its bound).
        if not self._leases and not self._places:
            self._changed.set()

    async def _run(self) -> None:
        try:
            while self._leases or self._places:
                self._forget_finished()
                now = time.monotonic()
                due_at = min([*self._leases.values(), *self._places.values()], default=now)
                if due_at > now:
                    self._changed.clear()
                    self._asleep_until = due_at
                    try:
                        await wait_for_event(self._changed, due_at - now)
                    finally:
                        self._asleep_until = None
                    continue
                leases = [lease for lease, at in self._leases.items() if at <= now + _batching(lease)]
                places = [queue for queue, at in self._places.items() if at <= now + _place_interval(queue) / 2]
                async with asyncio.TaskGroup() as group:
                    # Collections are renewed side by side; the chunks of one, one after another.
                    for store, lease_chunks in _chunks_by_collection(leases, key=lambda lease: lease.deadline):
                        group.create_task(self._in_turn(self._renew, store, lease_chunks))
                    for store, place_chunks in _chunks_by_collection(places, key=_place_interval):
                        group.create_task(self._in_turn(self._refresh_places, store, place_chunks))
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    @staticmethod
    async def _in_turn(send: Any, store: LockStore, chunks: list[list[Any]]) -> None:
        for chunk in chunks:
            await send(store, chunk)

    def _forget_finished(self) -> None:
        for lease in [lease for lease in self._leases if lease.ended or lease.lost_error is not None]:
            self.drop(lease)
        for queue in [queue for queue in self._places if not queue.waiters or queue.place is PlaceState.ABSENT]:
            self.drop_place(queue)

    async def _renew(self, store: LockStore, leases: list[Lease]) -> None:
        """Renew one chunk; confirm what the write renewed, lose what the server says is not ours."""
        earliest = min(lease.deadline for lease in leases)
        sent_at = time.monotonic()
        try:
            renewed = await store.renew(
                [Renewal(lease.name, lease.owner, _ms(lease.ttl), lease.permits) for lease in leases],
                bound=earliest - sent_at,
            )
        except PyMongoError as error:
            reason = f"{type(error).__name__}: {error}"
            if getattr(error, "timeout", False):
                reason = f"the renewal did not complete before the local deadline ({reason})"
            for lease in leases:
                lease.renewal_error = reason
                failures = self._failures[lease] = self._failures.get(lease, 0) + 1
                retry = random.uniform(0, min((lease.heartbeat_interval or lease.ttl) / 2, _RETRY_BASE * 2**failures))
                if lease in self._leases:
                    self._leases[lease] = min(time.monotonic() + retry, lease.deadline)
            return
        logger.debug("renewed %d of %d leases in %s", len(renewed), len(leases), store.full_name)
        for lease in leases:
            if lease.ended or lease.lost_error is not None:
                continue
            if (lease.name, lease.owner) in renewed:
                lease.confirm(sent_at)
                self._failures.pop(lease, None)
                if lease in self._leases and lease.heartbeat_interval is not None:
                    self._leases[lease] = sent_at + lease.heartbeat_interval
            else:
                lease.mark_lost("the server shows the lease expired or held by another owner")
                self.drop(lease)

    async def _refresh_places(self, store: LockStore, queues: list[LocalQueue]) -> None:
        """Push back the expiry of this process's places; a head whose place is gone queues again."""
        places = [(queue, queue.slot, queue.waiters[0].ttl_ms) for queue in queues if queue.slot and queue.waiters]
        if not places:
            return
        sent_at = time.monotonic()
        failed = False
        try:
            alive = await store.refresh_places(
                [(queue.name, slot, ttl_ms) for queue, slot, ttl_ms in places],
                bound=min(_place_interval(queue) for queue, _, _ in places),
            )
        except PyMongoError:
            alive, failed = set(), True
        for queue, slot, _ in places:
            if queue in self._places:
                self._places[queue] = sent_at + _place_interval(queue)
            if queue.slot != slot:
                continue  # the place changed meanwhile
            if failed:
                queue.on_place_unconfirmed()
            elif alive is None:
                queue.on_place_confirmed(sent_at)
            elif slot not in alive:
                queue.on_place_gone()


def _batching(lease: Lease) -> float:
    return 0.5 * (lease.heartbeat_interval or 0.0)


def _place_interval(queue: LocalQueue) -> float:
    """A place lives for its waiter's TTL; refresh it three times as often."""
    head = queue.head
    return (head.ttl_ms if head is not None else 3000) / 3000


def _chunks_by_collection(items: Iterable[_T], *, key: Any) -> list[tuple[LockStore, list[list[_T]]]]:
    """Items grouped by the collection (and write concern) they are written to, each group sorted
    by ``key`` and cut into chunks of ``RENEWAL_CHUNK``."""
    groups: dict[tuple[int, str, str], list[_T]] = defaultdict(list)
    stores: dict[tuple[int, str, str], LockStore] = {}
    for item in items:
        store = item.store
        group = (id(store.client), store.full_name, repr(store.write_concern.document))
        groups[group].append(item)
        stores[group] = store
    result = []
    for group, members in groups.items():
        members.sort(key=key)
        chunks = [members[start : start + RENEWAL_CHUNK] for start in range(0, len(members), RENEWAL_CHUNK)]
        result.append((stores[group], chunks))
    return result


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


_keepers: PerLoop[LeaseKeeper] = PerLoop(LeaseKeeper)


def keeper_for_running_loop() -> LeaseKeeper:
    """The keeper of the running event loop, created on first use."""
    return _keepers.get()
