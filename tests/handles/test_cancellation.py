"""Cancelling at each await of acquire and release: only the cancellation surfaces, no lease stays.
Each test runs with a lock, a semaphore of one permit and a read-write lock's writer (so a
contender shows a permit left).

The server is made slow with the ``failCommand`` fail point (``blockConnection``) so the cancel lands
while a request is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from mongolock_async import AsyncMongoLock, AsyncMongoRWLock, AsyncMongoSemaphore
from tests.support.commands import CommandCounter
from tests.support.fail_points import set_fail_point

BLOCK_MS = 600
Handle = Callable[[Any, str], AsyncMongoLock]


@pytest.fixture(params=["lock", "semaphore", "rwlock"])
def handle(request: pytest.FixtureRequest) -> Handle:
    """Makes a lock, a semaphore of one permit, or a read-write lock's writer, for a collection and name."""
    if request.param == "lock":
        return lambda collection, name: AsyncMongoLock(collection, name, ttl=30.0)
    if request.param == "semaphore":
        return lambda collection, name: AsyncMongoSemaphore(collection, name, 1, ttl=30.0)
    return lambda collection, name: AsyncMongoRWLock(collection, name, ttl=30.0).write()


def nothing_held(doc: dict[str, Any]) -> bool:
    return doc.get("owner") is None and not doc.get("holders")


async def block_next(collection: Any, command: str) -> None:
    await set_fail_point(collection, {"times": 1}, failCommands=[command], blockConnection=True, blockTimeMS=BLOCK_MS)


async def cancel_while_blocked(operation: Coroutine[Any, Any, Any]) -> None:
    """Start ``operation``, cancel it while its blocked request is in flight, expect only the cancel."""
    task = asyncio.create_task(operation)
    await asyncio.sleep(BLOCK_MS / 3000)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def assert_not_held_by(collection: Any, lock: AsyncMongoLock, name: str, handle: Handle) -> None:
    assert lock.fencing_token is None
    contender = handle(collection, name)
    assert await contender.acquire(blocking=False), "the cancelled task's lease is still there"
    assert await contender.release()


@pytest.mark.timing(margin=0.4)  # the cancel lands 0.2 s into a request held 0.6 s
async def test_cancel_during_the_acquire_request(fault_collection: Any, handle: Handle) -> None:
    lock = handle(fault_collection, "job")
    await block_next(fault_collection, "findAndModify")
    await cancel_while_blocked(lock.acquire())
    doc = await fault_collection.find_one({"_id": "job"})
    assert doc is not None and doc["fence"] > 0, "the blocked acquire did reach the server"
    assert nothing_held(doc) and doc.get("releasedAt") is not None, "and was released after the cancel"
    await assert_not_held_by(fault_collection, lock, "job", handle)


@pytest.mark.timing(margin=0.4)  # the cancel lands 0.2 s into a request held 0.6 s
async def test_timeout_during_the_acquire_request(fault_collection: Any, handle: Handle) -> None:
    lock = handle(fault_collection, "job")
    await block_next(fault_collection, "findAndModify")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(BLOCK_MS / 3000):
            await lock.acquire()
    await assert_not_held_by(fault_collection, lock, "job", handle)


@pytest.mark.timing(margin=0.4)  # the cancel lands 0.2 s into a request held 0.6 s
async def test_anyio_scope_cancel_during_the_acquire_request(fault_collection: Any, handle: Handle) -> None:
    lock = handle(fault_collection, "job")
    await block_next(fault_collection, "findAndModify")
    with anyio.move_on_after(BLOCK_MS / 3000) as scope:
        await lock.acquire()
    assert scope.cancelled_caught
    await assert_not_held_by(fault_collection, lock, "job", handle)


async def test_cancel_while_waiting_for_the_holder(mongolock_collection: Any, handle: Handle) -> None:
    holder = handle(mongolock_collection, "job")
    waiter = handle(mongolock_collection, "job")
    assert await holder.acquire()
    task = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiter.fencing_token is None
    assert await holder.owned()
    assert await holder.release()
    assert await waiter.acquire(blocking=False), "the cancelled acquire left the handle usable"
    assert await waiter.release()


@pytest.mark.timing(margin=0.4)  # the cancel lands 0.2 s into a request held 0.6 s
async def test_cancel_during_the_release_request(fault_collection: Any, handle: Handle) -> None:
    lock = handle(fault_collection, "job")
    assert await lock.acquire()
    await block_next(fault_collection, "findAndModify")
    await cancel_while_blocked(lock.release())
    doc = await fault_collection.find_one({"_id": "job"})
    assert nothing_held(doc), "release ran to completion despite the cancel"
    await assert_not_held_by(fault_collection, lock, "job", handle)


async def test_cancel_in_the_body_releases_shielded(fault_collection: Any, handle: Handle) -> None:
    lock = handle(fault_collection, "job")
    entered = asyncio.Event()

    async def work() -> None:
        async with lock:
            await block_next(fault_collection, "findAndModify")  # the release on exit will be slow
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(work())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(BLOCK_MS / 3000)
    task.cancel()  # a second cancel while the release is in flight
    with pytest.raises(asyncio.CancelledError):
        await task
    assert nothing_held(await fault_collection.find_one({"_id": "job"}))
    await assert_not_held_by(fault_collection, lock, "job", handle)


@pytest.mark.safety  # no hand-off to a waiter that is gone
async def test_a_waiter_cancelled_as_a_release_hands_it_the_lock_is_cancelled(
    counted_collection: Any, command_counter: CommandCounter, handle: Handle
) -> None:
    # The release of a task of the same process hands the lease to the waiting task (and wakes
    # it); the waiter is cancelled before it runs again. On Python 3.11, asyncio.wait_for returned
    # normally then, the cancellation was lost, and the cancelled task went on holding the lock.
    for round_ in range(10):
        name = f"handed-{round_}"
        holder, waiter = handle(counted_collection, name), handle(counted_collection, name)
        assert await holder.acquire()
        sent = command_counter.count("findAndModify")
        task = asyncio.create_task(waiter.acquire())
        await command_counter.queued(sent)  # behind the holder
        assert await holder.release()  # hands it to the waiting task, and wakes it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiter.fencing_token is None
        await assert_not_held_by(counted_collection, waiter, name, handle)
