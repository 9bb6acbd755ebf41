"""What the heartbeat renews, and that a lost lease is never silent: a dropped handle is no longer
renewed and is released, nothing is renewed once release() is called, a renewal confirms only the
leases it renewed, and a lease broken during a block raises."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoLock,
    LockLostError,
)
from mongolock_async.store import LockStore
from mongolock_async.testing.clients import TEST_DATABASE, close_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point


@pytest.mark.timing(margin=2.4)  # a 3 s lease renewed every 0.2 s, live until it is dropped
async def test_a_dropped_handle_is_no_longer_renewed_and_is_released(
    counted_collection: Any, command_counter: CommandCounter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mongolock_async")
    lock: AsyncMongoLock | None = AsyncMongoLock(counted_collection, "dropped", ttl=3.0, heartbeat=0.2)
    assert lock is not None and await lock.acquire()
    # A renewal, sent 0.2 s after the acquire (a fixed 0.5 s, before, left 0.3 s on a loaded machine).
    for _ in range(100):
        if command_counter.count("update") >= 1:
            break
        await asyncio.sleep(0.05)
    assert command_counter.count("update") >= 1, "it was being renewed"
    del lock
    gc.collect()
    for _ in range(50):
        doc = await counted_collection.find_one({"_id": "dropped"})
        if doc["owner"] is None:
            break
        await asyncio.sleep(0.1)
    assert doc["owner"] is None, "the lease of a dropped handle was not released"
    assert "'dropped' was garbage-collected" in caplog.text
    command_counter.names.clear()
    await asyncio.sleep(0.6)
    assert command_counter.count("update") == 0, "a dropped handle's lease is still renewed"


@pytest.mark.timing(margin=2.4)  # the release (held 1 s) answered within the 4 s lease
async def test_nothing_is_renewed_once_release_is_called(fault_server: FaultServer, mongolock_driver: str) -> None:
    counter = CommandCounter()
    client = fault_server.client(mongolock_driver, event_listeners=[counter])
    try:
        collection = client[TEST_DATABASE][fault_server.collection]
        # A TTL well above the release's 1 s on the server: a release that outlasts the lease raises
        # (as it promises), and with a 1.5 s TTL a loaded machine made it (one full run in five).
        lock = AsyncMongoLock(collection, "slow-release", ttl=4.0, heartbeat=0.2)
        assert await lock.acquire()
        await asyncio.sleep(0.5)
        await set_fail_point(
            collection, {"times": 1}, failCommands=["findAndModify"], blockConnection=True, blockTimeMS=1000
        )
        counter.names.clear()
        assert await lock.release()
        assert counter.count("update") == 0, "a renewal was sent while the release was in flight"
    finally:
        await close_client(client)


@pytest.mark.timing(margin=2.4)  # the kept lease (3 s) renewed every 0.3 s
async def test_a_renewal_confirms_only_what_it_renewed(mongolock_collection: Any) -> None:
    kept = AsyncMongoLock(mongolock_collection, "kept", ttl=3.0, heartbeat=0.3)
    lapsed = AsyncMongoLock(mongolock_collection, "lapsed", ttl=3.0, heartbeat=0.3)
    assert await kept.acquire() and await lapsed.acquire()
    # Still ours by owner, but expired on the server: a later read could not tell it from renewed.
    await mongolock_collection.update_one({"_id": "lapsed"}, [{"$set": {"expiresAt": "$$NOW"}}])
    await asyncio.wait_for(lapsed.lost.wait(), 5)
    assert lapsed.lost_error is not None and "expired or held by another owner" in lapsed.lost_error.reason
    assert not kept.lost.is_set() and await kept.owned()
    assert await kept.release()


async def test_a_lease_broken_during_a_block_without_heartbeat_raises(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "broken", ttl=30.0)
    operator = LockStore(mongolock_collection, WriteConcern(w="majority"))
    with pytest.raises(LockLostError, match="gone"):
        async with lock:
            assert await operator.force_release("broken") is not None
    assert lock.fencing_token is None


async def test_renewals_do_not_reschedule_the_deadline_timer(
    counted_collection: Any, command_counter: CommandCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A renewal moves the deadline later: the timer armed at the acquire waits on, finds the
    # deadline moved when it fires, and re-arms then. A new timer per renewal would leave a
    # cancelled one per lease in the loop's heap, and cost every renewal of thousands of leases.
    loop = asyncio.get_running_loop()
    deadline_timers = 0
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal deadline_timers
        deadline_timers += getattr(callback, "__name__", "") == "_deadline_passed"
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    # Renewed every 0.3 s; the deadline is 29 s after each renewal's send, so the timer armed at
    # the acquire does not fire (and re-arm) while the test runs, even on a slow machine.
    lock = AsyncMongoLock(counted_collection, "renewed-often", ttl=30.0, heartbeat=0.3)
    assert await lock.acquire()
    command_counter.names.clear()
    async with asyncio.timeout(20):
        while command_counter.count("update") < 4:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.05)
    assert deadline_timers == 1, f"{deadline_timers} deadline timers for 1 acquire and 4 renewals"
    assert lock.deadline is not None and not lock.lost.is_set()
    assert await lock.release()


async def test_extend_to_a_shorter_ttl_moves_the_deadline_timer_earlier(mongolock_collection: Any) -> None:
    # Without the heartbeat, nothing renews the shorter lease: it must be lost at its own deadline
    # (0.9 s after the extend), not at the 27 s one its timer was first armed for.
    lock = AsyncMongoLock(mongolock_collection, "shortened", ttl=30.0)
    with pytest.raises(LockLostError, match="without renewal"):
        async with asyncio.timeout(10), lock:
            await lock.extend(ttl=1.0)
            await asyncio.sleep(20)
    assert not await lock.owned()
