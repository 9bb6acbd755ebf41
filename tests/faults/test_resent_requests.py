"""Copies of requests that arrive late, replayed on the store: a release sent again is recognised
while its lease would have lasted (the document remembers a bounded number of releases), and an
attempt applied after its waiter withdrew queues nothing and takes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo.write_concern import WriteConcern

from mongolock_async.store import LockStore, Permits
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
