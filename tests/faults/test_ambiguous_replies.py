"""Writes the server applied but did not confirm (a write concern error, a lost reply, a dropped
connection): an unconfirmed acquire is undone or retried with its own token, a release is retried
and recognised when sent again, and waiters that give up leave nothing behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo.errors import PyMongoError

from mongolock_async import (
    AsyncMongoLock,
    LockTimeoutError,
)
from mongolock_async.testing.clients import TEST_DATABASE, close_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point


async def test_an_acquire_applied_but_not_acknowledged_is_undone(fault_collection: Any) -> None:
    # The server applies the write, then reports that it could not confirm it.
    failure = {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}
    await set_fail_point(fault_collection, {"times": 1}, failCommands=["findAndModify"], **failure)
    lock = AsyncMongoLock(fault_collection, "ambiguous", ttl=30.0)
    with pytest.raises(PyMongoError):
        await lock.acquire(blocking=False)
    doc = await fault_collection.find_one({"_id": "ambiguous"})
    assert doc["fence"] > 0, "it was applied"
    assert doc["owner"] is None and doc.get("releasedOwner"), "and released before the error was raised"
    other = AsyncMongoLock(fault_collection, "ambiguous", ttl=30.0)
    assert await other.acquire(timeout=5), "the unacknowledged lease blocked the lock"
    assert await other.release()


async def test_a_blocking_acquire_retries_an_ambiguous_attempt_with_the_same_token(
    fault_collection: Any,
) -> None:
    failure = {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}
    await set_fail_point(fault_collection, {"times": 1}, failCommands=["findAndModify"], **failure)
    lock = AsyncMongoLock(fault_collection, "ambiguous", ttl=30.0, retry_base=0.01, retry_cap=0.05)
    assert await lock.acquire(timeout=10)
    doc = await fault_collection.find_one({"_id": "ambiguous"})
    assert doc["fence"] == lock.fencing_token, "the retry claimed the lease the first attempt took"
    assert await lock.release()


async def test_a_release_that_fails_transiently_is_retried(fault_collection: Any) -> None:
    lock = AsyncMongoLock(fault_collection, "flaky", ttl=30.0)
    assert await lock.acquire()
    # The driver retries a retryable write once; the lock retries past that.
    await set_fail_point(fault_collection, {"times": 3}, failCommands=["findAndModify"], closeConnection=True)
    assert await lock.release()
    assert (await fault_collection.find_one({"_id": "flaky"}))["owner"] is None


# live: the 1.5 s lease must still be live when its release is sent, two requests after the acquire.
@pytest.mark.parametrize(
    "lost", [pytest.param(False, id="live", marks=pytest.mark.timing(margin=1.1)), pytest.param(True, id="lost")]
)
async def test_a_release_that_gets_no_answer_raises_only_for_a_live_lease(fault_collection: Any, lost: bool) -> None:
    # A lost lease's loss was reported already (lost, on_lost, LockLostError): a release that
    # cannot reach MongoDB fails the caller's clean-up only for a lease still live, which would
    # otherwise stay held until it expires.
    lock = AsyncMongoLock(fault_collection, "unreachable", ttl=1.5)
    assert await lock.acquire()
    if lost:
        await asyncio.wait_for(lock.lost.wait(), timeout=10)
    await set_fail_point(
        fault_collection, "alwaysOn", failCommands=["findAndModify"], blockConnection=True, blockTimeMS=5000
    )
    try:
        if lost:
            assert await lock.release() is False
        else:
            with pytest.raises(PyMongoError, match="did not answer"):
                await lock.release()
    finally:
        await set_fail_point(fault_collection, "off")


@pytest.mark.parametrize("local_waiter", [False, True], ids=["free", "handed-on"])
async def test_a_release_whose_reply_was_lost_is_still_a_release(
    mongolock_driver: str, fault_server: FaultServer, local_waiter: bool
) -> None:
    # The server applies the release, then cannot confirm it (a wtimeout, which the driver does not
    # retry); the release sent again must recognise its own earlier success, not report a lost lease.
    counter = CommandCounter()
    client = fault_server.client(mongolock_driver, event_listeners=[counter])
    try:
        collection = client[TEST_DATABASE][fault_server.collection]
        lock = AsyncMongoLock(collection, "reply-lost", ttl=30.0)
        successor = AsyncMongoLock(collection, "reply-lost", ttl=30.0)
        waiting = None
        async with lock:
            if local_waiter:
                sent = counter.count("findAndModify")
                waiting = asyncio.create_task(successor.acquire(timeout=20))
                # Queued behind the holder, with every attempt answered: the fail point is the release's.
                await counter.queued(sent)
            failure = {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}
            await set_fail_point(collection, {"times": 1}, failCommands=["findAndModify"], **failure)
        # The block ended without LockLostError: the release was recognised.
        doc = await collection.find_one({"_id": "reply-lost"})
        if waiting is None:
            assert doc["owner"] is None
        else:
            assert await waiting, "the lease handed on by the release reached the waiting task"
            assert doc["owner"] is not None and successor.fencing_token == doc["fence"]
            assert await successor.release()
    finally:
        await close_client(client)


@pytest.mark.safety
async def test_an_attempt_that_queued_a_follower_leaves_nothing_behind_when_its_waiters_give_up(
    fault_collection: Any,
) -> None:
    # Two tasks of this process wait; the head's attempts take the free lock and queue a place for
    # the second task in the same write, but every reply is lost (write concern errors). When both
    # give up, withdrawing their places must free the lock, not hand it to the follower's place.
    first = AsyncMongoLock(fault_collection, "orphan", ttl=30.0, retry_base=0.01, retry_cap=0.02)
    second = AsyncMongoLock(fault_collection, "orphan", ttl=30.0, retry_base=0.01, retry_cap=0.02)
    failure = {"writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"}}
    await set_fail_point(fault_collection, "alwaysOn", failCommands=["findAndModify"], **failure)
    try:
        results = await asyncio.gather(
            first.acquire(timeout=0.5), second.acquire(timeout=0.5), return_exceptions=True
        )
    finally:
        await set_fail_point(fault_collection, "off")
    assert all(isinstance(result, LockTimeoutError) and result.unreachable for result in results), results
    for _ in range(100):  # the withdrawal runs in the background (for seconds, if the server stalls)
        doc = await fault_collection.find_one({"_id": "orphan"})
        if doc["owner"] is None and not doc["queue"]:
            break
        await asyncio.sleep(0.1)
    assert doc["owner"] is None and doc["queue"] == [], f"left behind: {doc}"
    other = AsyncMongoLock(fault_collection, "orphan", ttl=30.0)
    assert await other.acquire(blocking=False), "the lock stayed blocked after every waiter gave up"
    assert await other.release()
