"""A request the server applies after its process has moved on leaves no lease and no place.

An attempt that lands after its token's lease was released
----------------------------------------------------------

A waiter's acquire request that its timeout cuts off is still on its way: the server may apply it
later (here a fail point holds it). The process does not know its outcome, so the next waiter in
line attempts again with the same owner token: it takes the lock (or claims what the first
request took), runs, and releases. When the first request lands after that release, it used to
take the free lock for that token, a lease nobody holds, for a whole TTL; or, with the lock held by
someone else by then, queue a place for it, which that holder's release then handed the lock to:
a lease nobody holds for a TTL after a place that lasted a TTL, two TTLs after the outcome was
lost (issue 36's chaos run saw a lease nobody held live for 3.0 s with a 1.5 s TTL: one way there).

A token whose lease (or permit) was released is done with: a request of it that lands later
takes, claims and queues nothing. The sweep moves the release across the late request's landing,
on several names at once, so that a regression fails every run; the check is the one a user
makes: once the last holder has released, a fresh handle takes the lock at once. Every release
may find its lease gone only past its local deadline, so no pause can make a correct library fail
these (marked ``safety``): a pause only moves the moments the sweep aims at.

A release that lands after its successor gave up
------------------------------------------------
A release names the first waiter of its process as the successor. If that waiter gives up while
the release is on its way, it withdraws its process's place; the release, landing after that, used
to queue the successor's place again when the lease went to another process's place first (served
in turn, or past the local streak): a place nobody waits behind, which the next release handed the
lock to. The chaos run found this one (benchmarks/lease_chaos.py). A successor that is done with
is neither handed the lease nor queued; the sweep moves the waiter's giving up across the
release's flight.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from mongolock_async import AsyncMongoLock
from tests.support.fail_points import FaultServer
from tests.support.held_requests import held_by_nobody, hold_requests, two_processes
from tests.workers.belief import release_as_promised
from tests.workers.giving_up_worker import acquire, handle

pytestmark = pytest.mark.safety

TTL = 1.5
HELD_FOR = 1.0
"""How long the fail point holds each first attempt: they land about this long after the start."""
GIVE_UP_AFTER = 0.3
RELEASES = [0.5, 0.85]
"""When the second waiter (which takes the lock once the first gives up) releases it: before the
late requests land, and as they land. Few names: Motor runs each request in a thread of a pool of
six here, and a held request keeps its thread until it lands."""


@pytest.mark.parametrize("kind", ["lock", "fair-lock", "semaphore", "rwlock"])
async def test_an_attempt_that_lands_after_its_token_was_released_takes_nothing(
    mongolock_driver: str, fault_server: FaultServer, kind: str
) -> None:
    async with two_processes(fault_server, mongolock_driver) as (collection, elsewhere):
        await collection.find_one({})  # connected, and the server's version checked, before the clock starts
        names = [f"late-{n}" for n in range(2 * len(RELEASES))]
        # Each name's first waiter sends its first attempt at once: the fail point holds each of them.
        await hold_requests(collection, len(names), HELD_FOR)
        started = time.monotonic()
        # Each gives up: its only attempt is held (LockTimeoutError, or False, says so).
        firsts = [asyncio.ensure_future(acquire(handle(collection, kind, name, TTL), GIVE_UP_AFTER)) for name in names]
        await asyncio.sleep(0.05)  # their attempts are on their way
        runs = [
            _second_waiter(kind, collection, elsewhere, name, started, release_at, later_holder=index >= len(RELEASES))
            for index, (name, release_at) in enumerate(zip(names, RELEASES * 2, strict=True))
        ]
        *_, gave_up = await asyncio.gather(asyncio.gather(*runs), asyncio.gather(*firsts))
        assert not any(gave_up), "a first waiter got the lock: its attempt was not held"
        await asyncio.sleep(max(0.0, started + HELD_FOR + 0.2 - time.monotonic()))  # every late attempt has landed
        refused = await held_by_nobody(elsewhere, names, lambda name: handle(elsewhere, kind, name, TTL))
        assert not refused, f"held by nobody after the last release: {refused}"


async def _second_waiter(
    kind: str, collection: Any, elsewhere: Any, name: str, started: float, release_at: float, *, later_holder: bool
) -> None:
    """The second waiter of the same process, in line behind the first: it attempts again with the
    same token once the first gives up, takes the lock, and releases it at ``release_at``. With
    ``later_holder``, another process takes the lock right after and holds it past the late
    request's landing."""
    lock = handle(collection, kind, name, TTL)
    assert await lock.acquire(timeout=30)  # the first gave up: a free lock, unless the server stalls
    await asyncio.sleep(max(0.0, started + release_at - time.monotonic()))
    await release_as_promised(lock)
    if later_holder:
        holder = handle(elsewhere, kind, name, TTL)
        assert await holder.acquire(blocking=False)
        await asyncio.sleep(max(0.0, started + HELD_FOR + 0.2 - time.monotonic()))
        await release_as_promised(holder)


GIVE_UPS = [0.4, 0.7, 0.95, 1.3]
"""When each name's waiter gives up: while the release naming it is held (it lands at about
``HELD_FOR + 0.2``), and after it landed."""
OUR_TTL = 30.0
"""Our places' TTL: a lease handed to one of them lasts this long, far past the check below however
long a pause delays it."""


async def test_a_release_that_lands_after_its_successor_gave_up_queues_it_nowhere(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    # Served in turn (fair): the release hands the lease to the other process's place, which is
    # older, and used to queue its successor's place behind it.
    async with two_processes(fault_server, mongolock_driver) as (collection, elsewhere):
        names = [f"successor-{n}" for n in range(len(GIVE_UPS))]
        # The holders' leases outlast their held releases (a release's bound is its lease's time left).
        holders = [AsyncMongoLock(collection, name, ttl=10 * TTL, fair=True) for name in names]
        for holder in holders:
            assert await holder.acquire(blocking=False)
        others = [AsyncMongoLock(elsewhere, name, ttl=TTL, fair=True) for name in names]
        theirs = [asyncio.ensure_future(other.acquire(timeout=30)) for other in others]
        await places_queued(collection, names, 1)  # the other process's places are queued first
        # Our places' TTL is the length of a lease handed to them: long, so that one is still there
        # when the check below comes, however loaded the machine.
        ours = [
            asyncio.ensure_future(acquire(AsyncMongoLock(collection, name, ttl=OUR_TTL, fair=True), give_up))
            for name, give_up in zip(names, GIVE_UPS, strict=True)
        ]
        # Our places are queued behind theirs (a fixed 0.2 s each, before, is tight on a loaded machine).
        await places_queued(collection, names, 2)
        # Each release (naming our waiter as its successor) is held; our waiters give up meanwhile.
        await hold_requests(collection, len(names), HELD_FOR)
        await asyncio.gather(*(release_as_promised(holder) for holder in holders))
        assert not any(await asyncio.gather(*ours)), "our waiters were never handed the lock: theirs were first"
        assert all(await asyncio.gather(*theirs))
        await asyncio.gather(*(release_as_promised(other) for other in others))
        released_at = time.monotonic()
        refused = await held_by_nobody(elsewhere, names, lambda name: AsyncMongoLock(elsewhere, name, ttl=TTL))
        assert not refused, f"handed to a place nobody waits behind: {refused}"
        assert time.monotonic() - released_at < OUR_TTL, "checked too late to tell: such a lease would have expired"


async def places_queued(collection: Any, names: list[str], count: int) -> None:
    """Wait until each of ``names`` has ``count`` places queued."""
    give_up_at = time.monotonic() + 30
    for name in names:
        while len((await collection.find_one({"_id": name}) or {}).get("queue") or []) < count:
            assert time.monotonic() < give_up_at, f"{name!r}: fewer than {count} places were queued"
            await asyncio.sleep(0.02)


PATIENCE = [1.0 + 0.25 * index for index in range(9)]
"""When the waiters of this process give up, one after another, for 2 s after the lock was handed
to their place (at 0.8 s): each becomes first as the one before it gives up, and its request is
held past its own patience."""


async def test_requests_cut_off_one_after_another_keep_no_lease_alive(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    # The lock is handed to this process's place; each of its waiters in turn sends the request
    # that would claim it, which the server holds 300 ms, and gives up before it lands. Each used
    # to claim the lease anew as it landed, moving its expiry on: a lease nobody heard of, live for
    # as long as such waiters came (until the last gave up, 2.2 s here, with a 1.5 s TTL). Now a
    # claim sent while an earlier request of the place is unanswered leaves the expiry as it is:
    # the lease expires a TTL after the first unanswered claim landed.
    async with two_processes(fault_server, mongolock_driver) as (collection, elsewhere):
        holder = AsyncMongoLock(elsewhere, "cut-off", ttl=10.0)
        assert await holder.acquire(blocking=False)
        started = time.monotonic()
        # A hand-off seen within the safety margin of the place's last write is taken without a
        # claim: with a margin this small, every one is claimed.
        waits = [
            asyncio.ensure_future(
                _wait_and_release(AsyncMongoLock(collection, "cut-off", ttl=TTL, safety_margin=0.01), patience)
            )
            for patience in PATIENCE
        ]
        await asyncio.sleep(0.5)  # their place is queued
        await hold_requests(collection, 2 * len(PATIENCE), 0.3)
        await asyncio.sleep(max(0.0, started + 0.8 - time.monotonic()))
        assert await holder.release()  # hands the lease to this process's place
        handed = await elsewhere.find_one({"_id": "cut-off"}, {"fence": 1, "expiresAt": 1})
        expiry, renewals = handed["expiresAt"], 0  # how often the handed lease's expiry moved on
        waiting = asyncio.gather(*waits)
        while not waiting.done():
            doc = await elsewhere.find_one({"_id": "cut-off"}, {"fence": 1, "expiresAt": 1})
            if doc["fence"] == handed["fence"] and doc["expiresAt"] > expiry:
                expiry, renewals = doc["expiresAt"], renewals + 1
            await asyncio.sleep(0.02)
        heard = sum(await waiting)  # on a loaded machine, a waiter may become first with time to hear
        # At most the first cut-off claim's, landing after its waiter gave up; none by the claims
        # after it (a waiter that heard back holds the lease as it was, and releases it).
        assert renewals <= 1, f"the lease was renewed {renewals} times by claims nobody heard ({heard} heard)"


async def _wait_and_release(lock: AsyncMongoLock, patience: float) -> bool:
    """Whether ``lock`` was acquired within ``patience`` (then released at once)."""
    if not await acquire(lock, patience):
        return False
    await release_as_promised(lock)
    return True
