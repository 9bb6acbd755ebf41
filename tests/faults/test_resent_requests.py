"""Copies of requests that arrive late, replayed on the store: a release sent again is recognised
while its lease would have lasted (the document remembers a bounded number of releases), and an
attempt applied after its waiter withdrew queues nothing and takes nothing, nor does any request
queue a follower that was withdrawn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo.write_concern import WriteConcern

from mongolock_async.store import LockStore, Permits, PlaceRequest
from mongolock_async.store.mutex import LOCK_RELEASES_REMEMBERED


async def test_a_release_sent_again_after_the_next_holders_release_is_still_recognised(
    mongolock_collection: Any
) -> None:
    # A release whose reply was lost is sent again; before the copy arrives, the lease it handed on
    # (or the free lock) was taken and released by the next holder. The copy must find its own
    # earlier release, not report a lost lease (a lock remembered only its last releaser).
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    assert (await store.try_acquire("resent", "first", 30_000, {})).holds("first")
    assert await store.release("resent", "first") is not None  # applied; say its reply was lost
    for later in ("second", "third"):
        assert (await store.try_acquire("resent", later, 30_000, {})).holds(later)
        assert await store.release("resent", later) is not None
    assert await store.release("resent", "first") is not None, "our own earlier release was taken for a lost lease"
    assert await store.release("resent", "never-held") is None


async def test_a_release_is_remembered_while_its_lease_would_have_lasted(mongolock_collection: Any) -> None:
    # A copy can arrive only while the lease it ended would still have been live (the library stops
    # sending it at the lease's local deadline): the document forgets releases whose leases would
    # have expired, so it does not grow with every release of a busy name.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    assert (await store.try_acquire("remembered", "short", 300, {})).holds("short")
    assert await store.release("remembered", "short") is not None
    await asyncio.sleep(0.5)
    for later in ("long", "longer"):
        assert (await store.try_acquire("remembered", later, 30_000, {})).holds(later)
        assert await store.release("remembered", later) is not None
    doc = await mongolock_collection.find_one({"_id": "remembered"})
    assert [entry["o"] for entry in doc["recentReleases"]] == ["long", "longer"]


async def test_a_hot_name_remembers_a_bounded_number_of_releases(mongolock_collection: Any) -> None:
    # Every write of the name carries the list: on a name handed on faster than its leases expire,
    # it keeps the latest releases only, and the latest is still recognised when sent again.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    owners = [f"owner-{index}" for index in range(LOCK_RELEASES_REMEMBERED + 4)]
    for owner in owners:
        assert (await store.try_acquire("hot", owner, 30_000, {})).holds(owner)
        assert await store.release("hot", owner) is not None
    doc = await mongolock_collection.find_one({"_id": "hot"})
    assert [entry["o"] for entry in doc["recentReleases"]] == owners[-LOCK_RELEASES_REMEMBERED:]
    assert await store.release("hot", owners[-LOCK_RELEASES_REMEMBERED]) is not None
    assert await store.release("hot", owners[0]) is None


@pytest.mark.safety
@pytest.mark.parametrize("permits", [None, Permits("semaphore", 2)], ids=["lock", "semaphore"])
async def test_an_attempt_applied_after_its_withdrawal_queues_nothing_and_takes_nothing(
    mongolock_collection: Any, permits: Permits | None
) -> None:
    # A waiter gives up while its attempt, cut off by the acquire's timeout, is still on its way;
    # the server applies it after the withdrawal. It must not queue a place nobody keeps (the next
    # release would hand the lease to it, idle for a TTL), nor take the lock for nobody.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    holders = [f"holder-{index}" for index in range(permits.limit if permits else 1)]
    for holder in holders:
        assert (await store.try_acquire("late", holder, 30_000, {}, permits=permits)).holds(holder)
    await store.leave("late", ["gave-up"], fair=False, permits=permits)
    state = await store.try_acquire("late", "gave-up", 30_000, {}, enqueue=True, permits=permits)
    assert state.place_of("gave-up") is None and not state.holds("gave-up")
    for holder in holders:
        assert await store.release("late", holder, permits=permits) is not None
    state = await store.try_acquire("late", "gave-up", 30_000, {}, enqueue=True, permits=permits)
    assert not state.holds("gave-up") and state.place_of("gave-up") is None
    assert (await store.try_acquire("late", "someone-else", 30_000, {}, permits=permits)).holds("someone-else")


@pytest.mark.safety
async def test_a_late_claim_naming_a_withdrawn_follower_does_not_queue_it(mongolock_collection: Any) -> None:
    # The trace of docs/model.md (issue 40, 5): a waiter's claim, naming the next waiter's place as
    # its follower, is held on its way; meanwhile that claim's work is done again by the next first
    # waiter of the process, which then withdraws the follower (nobody waits behind it any more).
    # The held claim lands: it must not queue the withdrawn follower, or the holder's release hands
    # the lock to a place nobody keeps, held by nobody for a TTL.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    follower = PlaceRequest("follower", 30_000, {})
    assert (await store.try_acquire("gap", "holder", 30_000, {})).holds("holder")
    assert (await store.try_acquire("gap", "place", 30_000, {}, enqueue=True)).place_of("place") is not None
    handed = await store.release("gap", "holder")
    assert handed is not None and handed.holds("place")
    state = await store.try_acquire("gap", "place", 30_000, {}, enqueue=True, follower=follower)
    assert state.holds("place") and state.place_of("follower") is not None, "a claim queues its follower"
    await store.leave("gap", ["follower"], fair=False)
    state = await store.try_acquire("gap", "place", 30_000, {}, enqueue=True, follower=follower)  # the late copy
    assert state.holds("place") and state.place_of("follower") is None, "the withdrawn follower was queued again"
    released = await store.release("gap", "place")
    assert released is not None and released.owner is None, "the release handed the lock to the withdrawn follower"


@pytest.mark.safety
async def test_a_hand_off_to_a_place_recording_a_withdrawn_follower_does_not_queue_it(
    mongolock_collection: Any
) -> None:
    # A place records the follower its hand-off queues. If that follower was withdrawn meanwhile,
    # the hand-off gives the lease to the place and queues nobody behind it.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    follower = PlaceRequest("follower", 30_000, {})
    assert (await store.try_acquire("recorded", "holder", 30_000, {})).holds("holder")
    state = await store.try_acquire("recorded", "place", 30_000, {}, enqueue=True, follower=follower)
    assert state.place_of("place") is not None and state.place_of("follower") is None
    await store.leave("recorded", ["follower"], fair=False)
    handed = await store.release("recorded", "holder")
    assert handed is not None and handed.holds("place")
    assert handed.place_of("follower") is None, "the hand-off queued the withdrawn follower"
