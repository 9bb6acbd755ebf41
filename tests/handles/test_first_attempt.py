"""A task that waits alone for a lock sends its first attempt before its queue is made
(``queues.FirstAttempt``): most acquires find the lock free and never need one. Whoever looks the
name up while that attempt is in flight must find the queue as it would stand had it been made
first: a task that comes for the same lock queues behind it (arrival order), and a release of this
process hands the lease to it in the same write.

The attempt is held in flight on the server (``failCommand`` with ``blockConnection``, the next
``findAndModify`` only), and the moment the other task comes, or the release is sent, is swept
across that window. An implementation that let the later task send its own attempt would have it
served first (its request is not held); one whose releases did not see the attempt would free the
lock rather than hand it over.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mongolock_async import AsyncMongoLock
from mongolock_async._runtime import queues
from mongolock_async.testing.clients import TEST_DATABASE, close_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point

HELD_FOR = 1.0
"""Seconds the first attempt is held on the server: 0.7 s more than the sweep's latest moment, so
that a loaded machine's late wake-up still falls inside the window."""
SWEEP = [0.0, 0.05, 0.1, 0.2, 0.3]
"""When, after the first attempt is sent, the other task comes or the release is sent."""


async def hold_next_find_and_modify(collection: Any) -> None:
    """Hold the next ``findAndModify`` of ``collection``'s client (its appName scopes the fail point)."""
    await set_fail_point(
        collection, {"times": 1}, failCommands=["findAndModify"], blockConnection=True, blockTimeMS=int(HELD_FOR * 1000)
    )


async def first_attempt_sent(counter: CommandCounter, before: int) -> None:
    while counter.count("findAndModify") == before:  # noqa: ASYNC110 - polls a command listener
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("held_elsewhere", [False, True], ids=["free", "held-by-another-process"])
async def test_a_task_that_comes_during_the_first_attempt_is_served_after_it(
    mongolock_driver: str, fault_server: FaultServer, held_elsewhere: bool
) -> None:
    counter = CommandCounter()
    client = fault_server.client(mongolock_driver, event_listeners=[counter])
    other_process = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-other")
    collection = client[TEST_DATABASE][fault_server.collection]
    try:
        for round_, delay in enumerate(SWEEP):
            name = f"order-{round_}"
            holder = AsyncMongoLock(other_process[TEST_DATABASE][fault_server.collection], name, ttl=30.0)
            if held_elsewhere:
                assert await holder.acquire()
            served: list[str] = []

            async def take(who: str, name: str = name, served: list[str] = served) -> None:
                async with AsyncMongoLock(collection, name, ttl=30.0, timeout=20) as lock:
                    served.append(who)
                    assert lock.fencing_token is not None
                    await asyncio.sleep(0.01)

            await hold_next_find_and_modify(collection)
            before = counter.count("findAndModify")
            first = asyncio.create_task(take("first"))
            await first_attempt_sent(counter, before)
            await asyncio.sleep(delay)
            second = asyncio.create_task(take("second"))
            if held_elsewhere:
                await asyncio.sleep(HELD_FOR)
                assert await holder.release()
            await asyncio.wait_for(asyncio.gather(first, second), 30)
            assert served == ["first", "second"], f"came {delay:.2f} s into the first attempt: served {served}"
    finally:
        await close_client(client)
        await close_client(other_process)


@pytest.mark.timing(margin=0.7)  # the release within the held attempt's 1 s, sent 0 to 0.3 s into it
async def test_a_release_during_the_first_attempt_hands_the_lease_to_it(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    counter = CommandCounter()
    client = fault_server.client(mongolock_driver, event_listeners=[counter])
    collection = client[TEST_DATABASE][fault_server.collection]
    try:
        for round_, delay in enumerate(SWEEP):
            name = f"handed-{round_}"
            holder = AsyncMongoLock(collection, name, ttl=30.0)
            waiter = AsyncMongoLock(collection, name, ttl=30.0, timeout=20)
            assert await holder.acquire()
            await hold_next_find_and_modify(collection)
            before = counter.count("findAndModify")
            waiting = asyncio.create_task(waiter.acquire())
            await first_attempt_sent(counter, before)
            await asyncio.sleep(delay)
            assert await holder.release()
            assert await asyncio.wait_for(waiting, 30)
            doc = await collection.find_one({"_id": name})
            # Handed over in the release's own write: taken then, not when the held attempt ran.
            assert doc["acquiredAt"] == doc["releasedAt"], f"released {delay:.2f} s into the attempt: not handed over"
            assert doc["fence"] == waiter.fencing_token
            assert counter.count("findAndModify") == before + 2, "the acquire sent more than its first attempt"
            assert await waiter.release()
    finally:
        await close_client(client)


async def test_an_uncontended_acquire_makes_no_queue(
    mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[queues.LocalQueue] = []
    make = queues.LocalQueue.__init__

    def counted(self: queues.LocalQueue, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        make(self, *args, **kwargs)

    monkeypatch.setattr(queues.LocalQueue, "__init__", counted)
    lock = AsyncMongoLock(mongolock_collection, "alone", ttl=30.0)
    for _ in range(3):
        async with lock:
            pass
    assert made == []
    contender = AsyncMongoLock(mongolock_collection, "alone", ttl=30.0)
    async with lock:
        assert not await contender.acquire(timeout=0.2)
    assert len(made) == 1, "a first attempt that finds the lock held goes on in a queue"
