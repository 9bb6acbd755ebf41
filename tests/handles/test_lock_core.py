"""The lock handle against a real wire server, with both drivers."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import pytest
from bson.codec_options import CodecOptions
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, LockAlreadyHeldError, LockNotOwnedError, LockTimeoutError
from mongolock_async.store import LockStore
from tests.support.commands import CommandCounter
from tests.workers.belief import believes, release_as_promised


async def test_one_of_two_wins_and_the_loser_waits_for_the_release(mongolock_collection: Any) -> None:
    holder = AsyncMongoLock(mongolock_collection, "report", ttl=30.0)
    # A backoff delay uniform in [0, 3600] s hardly ever wakes the waiter in time: the release signal must.
    waiter = AsyncMongoLock(mongolock_collection, "report", ttl=30.0, retry_base=3600.0, retry_cap=3600.0)
    assert await holder.acquire()
    assert not await waiter.acquire(blocking=False)
    started = time.monotonic()
    assert not await waiter.acquire(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    waiting = asyncio.create_task(waiter.acquire(timeout=15))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    assert await holder.release()
    assert await asyncio.wait_for(waiting, 15)
    assert await waiter.owned()
    assert not await holder.owned()
    assert waiter.fencing_token is not None and holder.fencing_token is None
    assert await waiter.release()


async def test_async_with_raises_timeout_when_held(mongolock_collection: Any) -> None:
    holder = AsyncMongoLock(mongolock_collection, "job", ttl=30.0)
    async with holder:
        assert await holder.owned()
        with pytest.raises(LockTimeoutError, match="job"):
            async with AsyncMongoLock(mongolock_collection, "job", timeout=0.1):
                pytest.fail("entered a held lock")
        with pytest.raises(LockTimeoutError):
            async with AsyncMongoLock(mongolock_collection, "job", blocking=False):
                pytest.fail("entered a held lock")
    # The timed-out waiter withdraws its queue place in the background; a release that gets to the
    # server first hands the lease to that place, and the withdrawal then passes it on. Either
    # way the lock is free within a few round trips, never a TTL (30 s): 10 s for them (2.5 s
    # could be a loaded machine's few round trips).
    for _ in range(200):
        if not await holder.locked():
            break
        await asyncio.sleep(0.05)
    assert not await holder.locked()


@pytest.mark.safety
async def test_takeover_only_after_expiry_on_server_time(mongolock_collection: Any) -> None:
    # The contender must try while the lease is live: if a pause of this process let the lease
    # end first (nothing refused), the scenario runs again on a fresh name.
    for attempt in range(3):
        name = f"lease-{attempt}"
        first = AsyncMongoLock(mongolock_collection, name, ttl=1.0)
        second = AsyncMongoLock(mongolock_collection, name, ttl=5.0)
        assert await first.acquire()
        first_token = first.fencing_token
        expires_at = (await mongolock_collection.find_one({"_id": name}))["expiresAt"]
        refusals = 0
        while not await second.acquire(blocking=False):
            refusals += 1
            await asyncio.sleep(0.02)
        assert not believes(first), "taken over while the holder still believed it held the lease"
        doc = await mongolock_collection.find_one({"_id": name})
        assert doc["acquiredAt"] >= expires_at, "taken over before the server's expiry time"
        if refusals:
            break
        await release_as_promised(second)
    else:
        pytest.fail("the lease was taken at once, before its expiry, three times")
    assert first_token is not None and second.fencing_token is not None
    assert second.fencing_token > first_token
    assert first.lost.is_set() and first.fencing_token is None, "the holder was told at its local deadline"
    assert not await first.owned()
    assert await first.release() is False
    with pytest.raises(LockNotOwnedError):
        await first.extend()
    await release_as_promised(second)


@pytest.mark.timing(margin=4.5)  # lost within 5 s
async def test_lost_is_a_fresh_event_per_acquisition(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "lease", ttl=0.5)
    assert await lock.acquire()
    before_loss = lock.lost
    await asyncio.wait_for(before_loss.wait(), 5)  # the local deadline passes without renewal
    assert lock.lost is before_loss and lock.lost_error is not None
    assert await lock.acquire()
    assert not lock.lost.is_set() and lock.lost is not before_loss
    assert await lock.release()
    unasked = AsyncMongoLock(mongolock_collection, "lease", ttl=0.5)
    assert await unasked.acquire()
    await asyncio.sleep(0.8)
    assert unasked.lost.is_set(), "an event first asked for after the loss is set"


async def test_handles_of_one_collection_object_share_its_store(mongolock_collection: Any) -> None:
    first, second = AsyncMongoLock(mongolock_collection, "a"), AsyncMongoLock(mongolock_collection, "b")
    assert first._store is second._store
    stricter = AsyncMongoLock(mongolock_collection, "c", write_concern=WriteConcern(w="majority", j=True))
    assert stricter._store is not first._store and stricter._store.write_concern.document["j"] is True
    again = AsyncMongoLock(mongolock_collection, "d", write_concern=WriteConcern(w="majority", j=True))
    assert again._store is stricter._store, "equal write concerns share a store"
    other_options = mongolock_collection.with_options(codec_options=CodecOptions(uuid_representation=4))
    assert AsyncMongoLock(other_options, "a")._store is not first._store


async def test_non_owner_cannot_release_or_extend(mongolock_collection: Any) -> None:
    owner = AsyncMongoLock(mongolock_collection, "guarded", ttl=30.0)
    stranger = AsyncMongoLock(mongolock_collection, "guarded", ttl=30.0)
    assert await owner.acquire()
    assert await stranger.release() is False
    with pytest.raises(LockNotOwnedError):
        await stranger.extend()
    assert await owner.owned()
    assert await stranger.locked()
    assert await owner.release() is True
    assert await owner.release() is False


async def test_release_after_expiry_returns_false(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "short", ttl=0.3)
    assert await lock.acquire()
    await asyncio.sleep(0.5)
    assert not await lock.locked()
    assert await lock.release() is False


@pytest.mark.timing(margin=1.5)
async def test_extend_starts_a_new_lease_from_now(mongolock_collection: Any) -> None:
    # 2 s: the acquire, the read and the extend have 1.8 s on a loaded machine before the lease ends.
    lock = AsyncMongoLock(mongolock_collection, "extended", ttl=2.0)
    other = AsyncMongoLock(mongolock_collection, "extended", ttl=2.0)
    assert await lock.acquire()
    before = (await mongolock_collection.find_one({"_id": "extended"}))["expiresAt"]
    await lock.extend(ttl=6.0)
    doc = await mongolock_collection.find_one({"_id": "extended"})
    assert doc["expiresAt"] > before and doc["ttlMs"] == 6000
    assert lock.ttl == 6.0
    await asyncio.sleep(2.3)  # past the original TTL
    assert not await other.acquire(blocking=False)
    assert await lock.owned()
    assert await lock.release()


async def test_non_blocking_call_on_a_handle_with_a_default_timeout(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    holder = AsyncMongoLock(counted_collection, "job", ttl=30.0)
    patient = AsyncMongoLock(counted_collection, "job", ttl=30.0, timeout=10.0, retry_base=0.01, retry_cap=0.02)
    assert await holder.acquire()
    assert not await patient.acquire(blocking=False)
    assert command_counter.count("findAndModify") == 2, "a non-blocking call tries exactly once"
    assert await holder.release()


async def test_a_handle_is_not_reentrant(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "single", ttl=30.0)
    assert await lock.acquire()
    with pytest.raises(LockAlreadyHeldError):
        await lock.acquire()
    with pytest.raises(LockAlreadyHeldError):
        async with lock:
            pass
    assert await lock.release()
    async with lock:  # usable again once released
        assert await lock.owned()


@pytest.mark.safety
async def test_concurrent_first_acquires_of_a_new_name(mongolock_collection: Any) -> None:
    locks = [AsyncMongoLock(mongolock_collection, "fresh", ttl=30.0) for _ in range(20)]
    results = await asyncio.gather(*(lock.acquire(blocking=False) for lock in locks))
    winners = [lock for lock, won in zip(locks, results, strict=True) if won]
    assert winners, "nobody took a free name"
    # Two winners only if the first's lease ended before the second's grant (a pause of 27 s).
    assert sum(believes(lock) for lock in winners) == 1, f"{len(winners)} holders at once"
    assert await mongolock_collection.count_documents({}) == 1
    for winner in winners:
        await release_as_promised(winner)


async def test_document_shows_holder_and_clears_owner_on_release(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "diag", ttl=30.0, label="nightly-report@worker-3")
    assert await lock.acquire()
    doc = await mongolock_collection.find_one({"_id": "diag"})
    assert doc["holder"] == {"host": socket.gethostname(), "pid": os.getpid(), "label": "nightly-report@worker-3"}
    assert len(doc["owner"]) >= 32 and int(doc["owner"], 16) >= 0  # at least 128 random bits, hex
    assert doc["fence"] == lock.fencing_token
    assert doc["ttlMs"] == 30_000
    assert await lock.release()
    doc = await mongolock_collection.find_one({"_id": "diag"})
    assert doc["owner"] is None and doc["fence"] > 0, "release keeps the document and its counter"


async def test_owner_tokens_are_fresh_per_acquisition(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "tokens", ttl=30.0)
    owners = set()
    for _ in range(5):
        assert await lock.acquire()
        owners.add((await mongolock_collection.find_one({"_id": "tokens"}))["owner"])
        assert await lock.release()
    assert len(owners) == 5


@pytest.mark.parametrize(
    ("write_concern", "expected"),
    [(None, {"w": "majority"}), (WriteConcern(w="majority", j=True), {"w": "majority", "j": True})],
    ids=["default-majority", "override"],
)
async def test_writes_carry_the_write_concern(
    counted_collection: Any,
    command_counter: CommandCounter,
    write_concern: WriteConcern | None,
    expected: dict[str, Any],
) -> None:
    options = {} if write_concern is None else {"write_concern": write_concern}
    lock = AsyncMongoLock(counted_collection, "durable", ttl=30.0, **options)
    assert await lock.acquire()
    await lock.extend()
    assert await lock.release()
    writes = [c for c in command_counter.commands if c.get("findAndModify") or c.get("update")]
    assert len(writes) == 3
    for command in writes:
        assert command["writeConcern"] == expected


async def test_locked_and_owned_report_server_state(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "state", ttl=30.0)
    assert not await lock.locked() and not await lock.owned()
    assert lock.fencing_token is None and lock.deadline is None
    assert await lock.acquire()
    assert await lock.locked() and await lock.owned()
    assert lock.deadline is not None and lock.deadline > time.monotonic()
    await mongolock_collection.update_one({"_id": "state"}, {"$set": {"owner": "someone-else"}})
    assert not await lock.owned(), "owned() must ask the server, not trust the handle"
    assert await lock.locked()


async def test_reads_of_lock_state_use_majority_read_concern(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    # A read with read concern "local" can show an acquisition a failover then rolls back, or a
    # deposed primary's state; locked(), owned() and what operators are shown read "majority".
    lock = AsyncMongoLock(counted_collection, "majority", ttl=30.0)
    assert await lock.acquire()
    store = LockStore(counted_collection, WriteConcern(w="majority"))
    command_counter.clear()
    assert await lock.locked() and await lock.owned()
    assert [report.name for report in await store.report()] == ["majority"]
    assert (await store.read("majority")) is not None
    reads = [command for command in command_counter.commands if {"aggregate", "find"} & command.keys()]
    assert len(reads) == 4, command_counter.names
    assert all(command.get("readConcern") == {"level": "majority"} for command in reads), reads
    assert await lock.release()
