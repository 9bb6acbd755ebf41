"""Waiting at scale: the uncontended path, local FIFO queues and hand-offs, places in the lock's
queue across processes (default and fair), and the change stream that wakes waiters.

"Another process" is a second client here: queues, places and change streams are per client, so a
second client in the same event loop is seen by the lock exactly like another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import MongoClient, common
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, LockTimeoutError
from mongolock_async._runtime import queues as queues_module
from mongolock_async._runtime import watcher as watcher_module
from mongolock_async._runtime.queues import Grant, PlaceState, Turn, existing_queue
from mongolock_async._runtime.waiting import LOCAL_STREAK
from mongolock_async._util.shield import RequestTimeout
from mongolock_async.store import LockStore, expressions, mutex
from mongolock_async.store.documents import LockState
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point
from tests.support.processes import ROOT, WORKERS
from tests.support.run_settings import child_environment
from tests.workers.giving_up_worker import handle

PATIENT = {"retry_base": 3600.0, "retry_cap": 3600.0}
"""A waiter that never polls in a test's lifetime: only a release signal can wake it."""
QUEUE_WORKER = WORKERS / "queue_worker.py"


async def foreign_release(collection: Any, name: str) -> None:
    """What a release by another process looks like here: the document changes, no in-process signal."""
    await collection.update_one({"_id": name}, {"$set": {"owner": None}})


async def watcher_tasks() -> list[asyncio.Task[Any]]:
    await asyncio.sleep(0)
    return [task for task in asyncio.all_tasks() if task.get_name() == "mongolock-release-watcher" and not task.done()]


@contextlib.asynccontextmanager
async def other_process(driver: str, uri: str, collection_name: str) -> AsyncIterator[tuple[Any, CommandCounter]]:
    """A collection reached through a client of its own (a process of its own, to the lock)."""
    counter = CommandCounter()
    client = make_client(driver, uri, event_listeners=[counter])
    try:
        yield client[TEST_DATABASE][collection_name], counter
    finally:
        await close_client(client)


async def test_uncontended_acquire_and_release_is_two_requests_and_nothing_else(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    lock = AsyncMongoLock(counted_collection, "alone", ttl=30.0)
    async with lock:  # connect and create the document
        pass
    command_counter.clear()
    for _ in range(20):
        async with lock:
            pass
    assert command_counter.names == ["findAndModify"] * 40, command_counter.names
    assert command_counter.connections_created == command_counter.connections_closed == 0
    assert await watcher_tasks() == []


async def test_a_local_release_hands_over_in_the_same_write(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    holder = AsyncMongoLock(counted_collection, "job", ttl=30.0)
    waiter = AsyncMongoLock(counted_collection, "job", ttl=30.0, **PATIENT)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await command_counter.settled()  # tried once, queued its place, and looked again as its stream opened
    command_counter.clear()
    assert await holder.release()
    assert await asyncio.wait_for(waiting, 5)
    assert command_counter.count("findAndModify", "update") == 1, command_counter.names
    doc = await counted_collection.find_one({"_id": "job"})
    assert doc["owner"] is not None and doc["fence"] == waiter.fencing_token
    assert holder.fencing_token is None
    assert await waiter.owned()
    assert await waiter.release()


async def test_waiting_tasks_of_one_process_are_served_in_arrival_order(mongolock_collection: Any) -> None:
    holder = AsyncMongoLock(mongolock_collection, "fifo", ttl=30.0)
    assert await holder.acquire()
    served: list[tuple[int, int]] = []

    async def wait_in_line(position: int) -> None:
        async with AsyncMongoLock(mongolock_collection, "fifo", ttl=30.0, **PATIENT) as lock:
            assert lock.fencing_token is not None
            served.append((position, lock.fencing_token))
            await asyncio.sleep(0.005)

    tasks = []
    for position in range(15):
        tasks.append(asyncio.create_task(wait_in_line(position)))
        await asyncio.sleep(0.02)  # each joins the queue before the next
    assert await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert [position for position, _ in served] == list(range(15))
    tokens = [token for _, token in served]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def test_many_waiters_cost_about_one_request_per_acquisition(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    done = 0

    async def worker() -> None:
        nonlocal done
        for _ in range(2):
            async with AsyncMongoLock(counted_collection, "hot", ttl=30.0, **PATIENT):
                await asyncio.sleep(0.001)
                done += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(50))), 120)
    assert done == 100
    writes = command_counter.count("findAndModify", "update")
    # Each release hands over in the same write; only the first head's failed attempt is extra.
    assert writes <= 1.2 * done, f"{writes} writes for {done} acquisitions"
    assert command_counter.count("aggregate") <= 1


@pytest.mark.timing(margin=3.5)  # the hand-off within the safety margin (5 s) of the place's write, 1 s or more before
async def test_a_hand_off_to_another_process_reaches_only_that_process(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    name = mongolock_collection.name
    async with (
        other_process(mongolock_driver, mongolock_uri, name) as (receiving, received),
        other_process(mongolock_driver, mongolock_uri, name) as (bystanding, bystander),
    ):
        holder = AsyncMongoLock(mongolock_collection, "item", ttl=30.0)
        # A hand-off within the safety margin of the place's last write is taken without a claim.
        waiter = AsyncMongoLock(receiving, "item", ttl=30.0, safety_margin=5.0, **PATIENT)
        assert await holder.acquire()
        # The bystander waits for another lock of the same collection: its stream is open too.
        other = AsyncMongoLock(mongolock_collection, "other", ttl=30.0)
        assert await other.acquire()
        bystanding_task = asyncio.create_task(AsyncMongoLock(bystanding, "other", ttl=30.0, **PATIENT).acquire())
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(1.0)
        # Both queued and both streams open, every attempt answered: on a loaded machine a second
        # of sleep can leave the waiter still attempting, and a hand-off then is claimed (safe, but
        # not what is measured here).
        await received.settled()
        await bystander.settled()
        received.clear()
        bystander.clear()
        assert await holder.release()
        assert await asyncio.wait_for(waiting, 10), "the hand-off did not reach the waiting process"
        assert received.events_delivered == 1
        assert bystander.events_delivered == 0, "another process was sent the hand-off"
        # The place was written just before: the hand-off is taken as it is, without a claim.
        assert received.count("findAndModify", "update") == 0, received.names
        doc = await mongolock_collection.find_one({"_id": "item"})
        assert doc["fence"] == waiter.fencing_token and doc["handedOffAt"] == doc["acquiredAt"]
        assert await waiter.release()
        bystanding_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bystanding_task
        assert await other.release()


async def delivered_until(counter: CommandCounter, name: str) -> list[Any]:
    """The names of the documents whose changes ``counter``'s change stream delivered, once one of
    ``name``'s has come (events arrive in the order of their writes)."""
    for _ in range(1000):
        names = [change.get("documentKey", {}).get("_id") for change in counter.changes]
        if name in names:
            return names
        await asyncio.sleep(0.01)
    raise AssertionError(f"no change to {name!r} was delivered within 10 s")


async def test_a_release_nobody_waits_for_is_sent_to_no_process(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """Every waiter has a place in its lock's queue, and a release hands the lease to the first
    live place: a release that clears the owner had no place to hand to, so no waiter of another
    process can want it. Its change event is filtered out on the server; with every process's
    stream delivering every such release, the work of each release grows with the processes."""
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (watching, watched):
        holder = AsyncMongoLock(mongolock_collection, "busy", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(watching, "busy", ttl=30.0, **PATIENT)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await watched.settled()  # queued, its stream open
        watched.clear()
        for name in ("idle", "idle", "unused"):  # released with nobody waiting
            async with AsyncMongoLock(mongolock_collection, name, ttl=30.0):
                pass
        assert await holder.release()  # a hand-off to the waiting process's place: sent to it
        assert await delivered_until(watched, "busy") == ["busy"], "releases nobody waited for were sent"
        assert await asyncio.wait_for(waiting, 10)
        assert await waiter.release()


async def test_a_forced_release_still_wakes_a_waiter_of_another_process(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """An operator's break-glass release clears the owner and leaves the queue as it was: its
    event is let through, and the waiter takes the lock without waiting for the lease's expiry."""
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (watching, watched):
        holder = AsyncMongoLock(mongolock_collection, "stuck", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(watching, "stuck", ttl=30.0, **PATIENT)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await watched.settled()
        assert await LockStore(mongolock_collection, WriteConcern(w="majority")).force_release("stuck") is not None
        assert await asyncio.wait_for(waiting, 10), "the forced release did not wake the waiter"
        assert await delivered_until(watched, "stuck") == ["stuck"]
        assert await waiter.release()


@pytest.fixture
def server_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[datetime | None], None]]:
    """Set what every acquire and release sees as the server's time (None: its real clock). The
    pipelines are cached per shape, so they are built again with it, and after the test."""
    real = expressions.SERVER_NOW

    def clear() -> None:
        mutex._acquire_stages.cache_clear()
        mutex._release_stages.cache_clear()

    def set_clock(moment: datetime | None) -> None:
        monkeypatch.setattr(expressions, "SERVER_NOW", real if moment is None else {"$literal": moment})
        clear()

    yield set_clock
    clear()


@pytest.mark.timing(margin=0.8)  # each waiter queued within the second slept
async def test_hand_offs_in_the_same_millisecond_each_reach_their_process(
    mongolock_driver: str,
    mongolock_uri: str,
    mongolock_collection: Any,
    server_clock: Callable[[datetime | None], None],
) -> None:
    # Every write of this test sees the same server time, as two hand-offs within one millisecond
    # (or one mongos command, whose $$NOW is fixed) would. A hand-off must still show in the change
    # event: a field the write leaves as it was is not in updatedFields.
    frozen = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    server_clock(frozen)
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (elsewhere, _):
        holder = AsyncMongoLock(mongolock_collection, "same-ms", ttl=30.0)
        assert await holder.acquire()
        first = AsyncMongoLock(elsewhere, "same-ms", ttl=30.0, safety_margin=5.0, **PATIENT)
        first_waiting = asyncio.create_task(first.acquire(timeout=10))
        await asyncio.sleep(1.0)  # queued, stream open
        assert await holder.release()
        assert await first_waiting, "the first hand-off did not reach the waiting process"
        second = AsyncMongoLock(mongolock_collection, "same-ms", ttl=30.0, safety_margin=5.0, **PATIENT)
        second_waiting = asyncio.create_task(second.acquire(timeout=10))
        await asyncio.sleep(1.0)
        assert await first.release()
        assert await second_waiting, "a hand-off in the same millisecond as the last one was filtered out"
        doc = await mongolock_collection.find_one({"_id": "same-ms"})
        assert doc["handedOffAt"] == frozen.replace(tzinfo=None) and doc["owner"] == doc["handedOffTo"]
        assert await second.release()


@pytest.mark.safety  # the server's lease outlasts the waiter's belief
async def test_a_hand_off_applied_after_a_later_place_write_lasts_from_that_write(
    mongolock_driver: str,
    mongolock_uri: str,
    mongolock_collection: Any,
    server_clock: Callable[[datetime | None], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A write's $$NOW is fixed when the server parses it, also through write-conflict retries (and
    # on a mongos, for the shards): a release parsed before a waiter's place write can be applied
    # after it. The waiter counts the handed lease from its place write's send time, so the lease
    # must last a TTL from the place's `at` at least, however old the release's $$NOW.
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (elsewhere, counter):
        holder = AsyncMongoLock(mongolock_collection, "delayed", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(elsewhere, "delayed", ttl=20.0, safety_margin=5.0, **PATIENT)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        # Queued, the stream open and the waiter's look as it opens answered: the hand-off is then
        # taken as it is. (Seen while that look is in flight, it is claimed by another attempt.)
        await counter.settled()
        (place,) = (await mongolock_collection.find_one({"_id": "delayed"}))["queue"]
        parsed_long_ago = place["at"].replace(tzinfo=UTC) - timedelta(seconds=10)
        # Only the release is parsed long ago: a claim is a request sent after the hand-off, whose
        # $$NOW is later than the place's write (on a loaded machine a waiter makes one, and with
        # every request's clock set back it ended the lease 10 s early: the test's error, not the
        # library's). The release's own reply is what is checked.
        released: list[LockState | None] = []
        real_pipeline, real_release = mutex.release_pipeline, LockStore.release

        def release_parsed_long_ago(*args: Any, **kwargs: Any) -> Any:
            server_clock(parsed_long_ago)
            try:
                return real_pipeline(*args, **kwargs)
            finally:
                server_clock(None)

        async def recorded_release(self: LockStore, *args: Any, **kwargs: Any) -> LockState | None:
            released.append(await real_release(self, *args, **kwargs))
            return released[-1]

        with monkeypatch.context() as patched:
            patched.setattr(mutex, "release_pipeline", release_parsed_long_ago)
            patched.setattr(LockStore, "release", recorded_release)
            assert await holder.release()
        (handed,) = released
        assert handed is not None and handed.owner is not None and handed.expires_at is not None
        assert handed.expires_at - place["at"].replace(tzinfo=UTC) >= timedelta(seconds=20), (
            "the lease ends before the waiter believes"
        )
        assert await waiting
        doc = await mongolock_collection.find_one({"_id": "delayed"})
        assert doc["owner"] == handed.owner and waiter.fencing_token == doc["fence"]
        assert doc["expiresAt"] - place["at"] >= timedelta(seconds=20), "the lease ends before the waiter believes"
        assert await waiter.release()


@pytest.mark.timing(margin=0.8)  # the waiter's lease (1 s) still live when checked
async def test_a_grant_too_late_to_hold_goes_on_waiting_when_its_release_is_not_answered(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grant answered after its local deadline is released again, and the acquire goes on. On a
    # server slower than the TTL that release goes unanswered as well (at load 26 to 30, 4 of 36
    # runs of test_giving_up's follower test, whose first waiters have 1.5 s leases): nobody holds
    # the lease, which expires by itself, and the acquire must go on, not raise the release's
    # RequestTimeout, which is none of the errors it documents.
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (elsewhere, counter):
        holder = AsyncMongoLock(mongolock_collection, "late", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(elsewhere, "late", ttl=1.0, **PATIENT)
        late: list[str] = []
        real_hold, real_release = AsyncMongoLock._hold, LockStore.release

        def first_grant_too_late(self: AsyncMongoLock, grant: Grant) -> bool:
            if not late:
                late.append(grant.owner)
                return False
            return real_hold(self, grant)

        async def unanswered_for_it(self: LockStore, name: str, owner: str, **kwargs: Any) -> LockState | None:
            if late and owner == late[0]:
                raise RequestTimeout("MongoDB did not answer within 1 s")
            return await real_release(self, name, owner, **kwargs)

        monkeypatch.setattr(AsyncMongoLock, "_hold", first_grant_too_late)
        monkeypatch.setattr(LockStore, "release", unanswered_for_it)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        await counter.settled()
        assert await holder.release()
        assert await waiting, "the acquire gave up"
        assert late and waiter.fencing_token is not None
        doc = await mongolock_collection.find_one({"_id": "late"})
        assert doc["owner"] not in (None, late[0])
        assert await waiter.release()


async def hot_loop(collection: Any, name: str, label: str, rounds: int, log: list[str], **options: Any) -> None:
    for _ in range(rounds):
        async with AsyncMongoLock(collection, name, ttl=30.0, **options):
            log.append(label)
            await asyncio.sleep(0.002)


async def test_a_busy_process_does_not_keep_a_hot_lock_to_itself(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    log: list[str] = []
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (remote, _):
        local = [asyncio.create_task(hot_loop(mongolock_collection, "hot", "local", 6, log)) for _ in range(6)]
        while not log:  # noqa: ASYNC110 - polls a plain list the tasks append to
            await asyncio.sleep(0.001)
        remote_task = asyncio.create_task(hot_loop(remote, "hot", "remote", 1, log, **PATIENT))
        await asyncio.wait_for(asyncio.gather(*local, remote_task), 120)
    first_remote = log.index("remote")
    # Its place is queued after its first attempt (a new client's connection, then one round trip:
    # local hand-offs go on meanwhile, a round trip each, so a loaded machine's slower handshake
    # counts); then LOCAL_STREAK local hand-offs at most. A process keeping the lock to itself
    # would serve its 36 sections first.
    assert first_remote <= LOCAL_STREAK + 8, log


async def test_fair_mode_takes_turns_between_processes(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    log: list[str] = []
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (remote, _):
        tasks = [
            asyncio.create_task(hot_loop(collection, "fair", label, 4, log, fair=True, **PATIENT))
            for collection, label in [(mongolock_collection, "a"), (remote, "b")]
            for _ in range(4)
        ]
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert log.count("a") == log.count("b") == 16
    middle = "".join(log)[2:-2]  # once both processes queue, the lease alternates
    assert "aaa" not in middle and "bbb" not in middle, "".join(log)


async def test_the_place_queued_by_a_winning_attempt_is_covered_too(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (a fair-mode hang under load): the holder releases between a head's first attempt
    and its second, so the second (in a session) wins the lease and, in the same write, queues a
    place for the next waiter, with no change stream running yet. A release by another process must
    still wake that next waiter, which has no backoff to fall back on here."""
    client = mongolock_collection.database.client
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (remote, _):
        holder = AsyncMongoLock(remote, "won", ttl=30.0)
        assert await holder.acquire()
        real_try_acquire = LockStore.try_acquire
        attempts = 0

        async def release_after_the_first_attempt(self: LockStore, *args: Any, **kwargs: Any) -> Any:
            nonlocal attempts
            state = await real_try_acquire(self, *args, **kwargs)
            if self.client is client:
                attempts += 1
                if attempts == 1:
                    assert await holder.release()
            return state

        monkeypatch.setattr(LockStore, "try_acquire", release_after_the_first_attempt)
        first = AsyncMongoLock(mongolock_collection, "won", ttl=30.0, **PATIENT)
        second = AsyncMongoLock(mongolock_collection, "won", ttl=30.0, **PATIENT)
        first_acquired = asyncio.create_task(first.acquire())
        second_acquired = asyncio.create_task(second.acquire())
        assert await first_acquired and attempts == 2, attempts
        await asyncio.sleep(0.3)
        assert not second_acquired.done()
        # Another process frees the lock (an operator's forced release: no hand-off, just news).
        assert await LockStore(remote, WriteConcern(w="majority")).force_release("won") is not None
        assert await asyncio.wait_for(second_acquired, 10), "the next waiter never heard of the release"
        assert await second.release()
        assert await first.release() is False


async def test_no_release_is_missed_before_the_stream_starts(mongolock_driver: str, fault_server: FaultServer) -> None:
    holder_client = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-holder")
    counter = CommandCounter()
    waiter_client = fault_server.client(mongolock_driver, event_listeners=[counter])
    locks = fault_server.collection
    try:
        holder = AsyncMongoLock(holder_client[TEST_DATABASE][locks], "gap", ttl=60.0)
        waiter = AsyncMongoLock(waiter_client[TEST_DATABASE][locks], "gap", ttl=60.0, **PATIENT)
        assert await holder.acquire()
        # The waiter's stream opens a second after its failed attempt; the release falls in between.
        await set_fail_point(
            holder_client[TEST_DATABASE][locks],
            {"times": 1},
            failCommands=["aggregate"],
            blockConnection=True,
            blockTimeMS=1000,
            appName=fault_server.app_name,
        )
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        while counter.count("aggregate") == 0:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.01)
        assert await holder.release()
        assert await asyncio.wait_for(waiting, 10), "the release before the stream's start was missed"
        (aggregate,) = [command for command in counter.commands if "aggregate" in command]
        assert "startAtOperationTime" in aggregate["pipeline"][0]["$changeStream"]
        assert await waiter.release()
    finally:
        await close_client(holder_client)
        await close_client(waiter_client)


async def test_no_hand_off_is_missed_when_the_stream_starts_past_it(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mongod answers a write with that write's own optime, but a server may answer with its latest
    # cluster time (the embedded one does, under concurrent writes): a stream started there begins
    # past a hand-off that followed the attempt. Here the stream starts after the hand-off.
    holder_client = make_client(mongolock_driver, mongolock_uri)
    waiter_client = make_client(mongolock_driver, mongolock_uri)
    locks = mongolock_collection.name
    asked: list[tuple[watcher_module.ReleaseWatcher, LockStore]] = []
    start_stream = watcher_module.ReleaseWatcher.cover_from

    def start_nothing_yet(self: watcher_module.ReleaseWatcher, store: LockStore, operation_time: Any) -> bool:
        asked.append((self, store))
        return True

    monkeypatch.setattr(watcher_module.ReleaseWatcher, "cover_from", start_nothing_yet)
    try:
        holder = AsyncMongoLock(holder_client[TEST_DATABASE][locks], "late", ttl=60.0)
        waiter = AsyncMongoLock(waiter_client[TEST_DATABASE][locks], "late", ttl=60.0, **PATIENT)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        while not asked:  # noqa: ASYNC110 - waits for the waiter's place
            await asyncio.sleep(0.01)
        assert await holder.release()
        handed = await holder_client[TEST_DATABASE][locks].find_one({"_id": "late"})
        assert handed["owner"] is not None, "the release handed the lease to the waiter's place"
        watcher, store = asked[0]
        async with store.session() as session:
            await waiter_client[TEST_DATABASE][locks].insert_one({"_id": "a write after the hand-off"}, session=session)
            after_the_hand_off = session.operation_time
        monkeypatch.undo()
        assert start_stream(watcher, store, after_the_hand_off)
        assert await asyncio.wait_for(waiting, 10), "the hand-off before the stream's start was missed"
        assert await waiter.release()
    finally:
        await close_client(holder_client)
        await close_client(waiter_client)


@pytest.mark.timing(margin=1.5)  # the dead place (TTL 2 s) still live at the release
async def test_a_dead_waiters_place_stops_blocking_after_it_expires(
    mongolock_uri: str, mongolock_collection: Any
) -> None:
    name, place_ttl = "queued", 2.0
    holder = AsyncMongoLock(mongolock_collection, name, ttl=30.0, fair=True)

    async def queue_a_process_and_kill_it() -> int:
        """Start a process that waits for the lock (fair), and SIGKILL it once its place is queued."""
        worker = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block
            [sys.executable, str(QUEUE_WORKER), mongolock_uri, TEST_DATABASE, mongolock_collection.name, name,
             str(place_ttl)],
            cwd=ROOT,
            env=child_environment(),
        )
        try:
            for _ in range(200):
                doc = await mongolock_collection.find_one({"_id": name})
                if any(place["holder"]["pid"] == worker.pid for place in doc.get("queue", [])):
                    return worker.pid
                await asyncio.sleep(0.05)
            pytest.fail("the worker never took a place")
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait()

    # While the dead process's place is live, a release hands the lease to it: the queue is honoured.
    assert await holder.acquire()
    dead = await queue_a_process_and_kill_it()
    assert await holder.release()
    doc = await mongolock_collection.find_one({"_id": name})
    assert doc["owner"] is not None and doc["holder"]["pid"] == dead
    assert (doc["expiresAt"] - doc["acquiredAt"]).total_seconds() == pytest.approx(place_ttl, abs=0.01)
    # ... and nobody claims it: the next waiter gets it when that lease expires, no later.
    newcomer = AsyncMongoLock(mongolock_collection, name, ttl=30.0, fair=True)
    assert await newcomer.acquire(timeout=place_ttl + 10)
    taken = await mongolock_collection.find_one({"_id": name})
    assert taken["acquiredAt"] >= doc["expiresAt"]
    assert await newcomer.release()

    # Once the place has expired unrefreshed, it no longer counts: the release goes to a live waiter.
    assert await holder.acquire()
    await queue_a_process_and_kill_it()
    await asyncio.sleep(place_ttl + 0.5)
    waiter = AsyncMongoLock(mongolock_collection, name, ttl=30.0, fair=True, **PATIENT)
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await asyncio.sleep(0.5)
    assert await holder.release()
    assert await asyncio.wait_for(waiting, 5)
    assert await waiter.release()


SLOW_MS = 150
"""How long the server holds each findAndModify of a slow line's waiters: three times their spacing."""
_BAD_VALUE = 2  # the error code a refused request carries: one that retrying cannot fix


async def line_of_waiters(
    collection: Any, kind: str, name: str, started: float, *, length: float, spacing: float, patience: float
) -> tuple[list[float], list[str]]:
    """Waiters for ``name`` coming every ``spacing`` seconds until ``length`` seconds after
    ``started``, each giving up after ``patience``; one that takes the lock releases it at once.
    Returns when each taker took it (seconds since ``started``) and every waiter's outcome. A waiter
    whose request is still unanswered when its patience ends raises ``LockTimeoutError`` (the server
    was too slow to be counted as reached): a way of giving up too, as acquire promises."""
    taken: list[float] = []
    outcomes: list[str] = []

    async def come_and_give_up() -> None:
        waiter = handle(collection, kind, name)
        try:
            acquired = await waiter.acquire(timeout=patience)
        except LockTimeoutError as error:
            outcomes.append(type(error).__name__)
            return
        outcomes.append(str(acquired))
        if acquired:
            taken.append(time.monotonic() - started)
            assert await waiter.release()

    line = []
    while time.monotonic() - started < length:
        line.append(asyncio.create_task(come_and_give_up()))
        await asyncio.sleep(spacing)
    await asyncio.gather(*line)
    return taken, outcomes


@pytest.mark.timing(margin=3.0)  # the line goes on 3.4 s past the expiry
@pytest.mark.parametrize("spacing", [0.05, 0.2, 0.4])
@pytest.mark.parametrize("kind", ["lock", "fair-lock", "semaphore", "rwlock", "rwlock-reader"])
async def test_waiters_that_each_give_up_before_a_ttl_still_take_an_expired_lease(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any, kind: str, spacing: float
) -> None:
    # A process whose waiters come one after another, each giving up after 0.5 s (a web handler's
    # acquire timeout) but never all at once, keeps its place in the queue. The lease they wait
    # behind expires (its holder died; or it was handed to the place unseen): one of them must
    # look again then, although each would sleep out a TTL of its own. Seen in the two-worker
    # uvicorn sale under load: a lock refused for minutes after its lease expired. The line goes on
    # 3.4 s past the expiry (it was 1.9 s: in a full run at load 4, waiters 0.05 s apart, each on a
    # server slower than its 0.5 s patience, let that pass once with nobody taking the lock).
    name, dead_ttl, line_length, patience = f"line-{kind}-{spacing}", 0.6, 4.0, 0.5
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (remote, _):
        dead = handle(remote, "rwlock" if kind == "rwlock-reader" else kind, name, dead_ttl)
        started = time.monotonic()  # before the lease's request: it expires dead_ttl after that, at the earliest
        assert await dead.acquire()
        taken, _ = await line_of_waiters(
            mongolock_collection, kind, name, started, length=line_length, spacing=spacing, patience=patience
        )
        assert taken, f"nobody took the lease that expired {dead_ttl} s into a {line_length} s line of waiters"
        assert taken[0] >= dead_ttl - 0.05, "a waiter took the lease before it expired"
        await dead.release()


@pytest.mark.timing(margin=2.0)  # the line goes on 2.4 s past the expiry
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_a_line_of_waiters_on_a_server_slower_than_their_patience_takes_an_expired_lease(
    mongolock_driver: str, fault_server: FaultServer, kind: str
) -> None:
    # The slow-server case of the test above, made certain: the server holds every findAndModify of
    # the waiters' client for 150 ms, and waiters come 0.05 s apart with 0.5 s of patience, so each
    # is first in line with about 0.05 s left. An attempt bounded by that was cut every time, and
    # nobody took the lease that expired behind the line (every waiter answered False). The attempt
    # belongs to the line: it runs to its answer, which the waiter first in line by then acts on.
    holder_client = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-holder")
    waiter_client = fault_server.client(mongolock_driver)
    name, dead_ttl, line_length, patience, spacing = f"slow-line-{kind}", 0.6, 3.0, 0.5, 0.05
    try:
        dead = handle(holder_client[TEST_DATABASE][fault_server.collection], kind, name, dead_ttl)
        waiters = waiter_client[TEST_DATABASE][fault_server.collection]
        await waiters.database.command("ping")
        await set_fail_point(
            waiters, "alwaysOn", failCommands=["findAndModify"], blockConnection=True, blockTimeMS=SLOW_MS
        )
        started = time.monotonic()
        assert await dead.acquire()
        taken, outcomes = await line_of_waiters(
            waiters, kind, name, started, length=line_length, spacing=spacing, patience=patience
        )
        assert taken, f"nobody took the lease that expired {dead_ttl} s into the line: {outcomes}"
        assert taken[0] >= dead_ttl - 0.05, "a waiter took the lease before it expired"
    finally:
        await set_fail_point(waiter_client[TEST_DATABASE][fault_server.collection], "off")
        await close_client(holder_client)
        await close_client(waiter_client)


@pytest.mark.timing(margin=0.7)  # the last waiter's refusal about 1.3 s into its 2 s
async def test_a_refusal_of_the_lines_attempt_reaches_the_first_waiter(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    # The server holds each of the waiters' findAndModify 150 ms, then refuses it with an error
    # retrying cannot fix. Waiters come 0.05 s apart, so most attempts belong to the line, not to
    # the waiter that sent them: the refusal must still be raised by an acquire (the one first in
    # line when it comes), never lost in the background while the line times out or sends again.
    waiter_client = fault_server.client(mongolock_driver)
    waiters = waiter_client[TEST_DATABASE][fault_server.collection]
    try:
        await waiters.database.command("ping")
        await set_fail_point(
            waiters,
            "alwaysOn",
            failCommands=["findAndModify"],
            blockConnection=True,
            blockTimeMS=SLOW_MS,
            errorCode=_BAD_VALUE,
        )
        outcomes: list[str] = []

        async def come_and_give_up() -> None:
            try:
                outcomes.append(str(await handle(waiters, "lock", "refused-line").acquire(timeout=2.0)))
            except OperationFailure as error:
                outcomes.append(f"refused {error.code}")

        line = []
        for _ in range(12):
            line.append(asyncio.create_task(come_and_give_up()))
            await asyncio.sleep(0.05)
        await asyncio.gather(*line)
        assert outcomes == [f"refused {_BAD_VALUE}"] * 12, outcomes
    finally:
        await set_fail_point(waiters, "off")
        await close_client(waiter_client)


@pytest.mark.timing(margin=0.8)  # still open just after the release, within its 1 s linger
async def test_the_stream_lingers_then_closes_without_dropping_a_connection(
    counted_collection: Any, command_counter: CommandCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher_module, "LINGER", 1.0)
    holder = AsyncMongoLock(counted_collection, "linger", ttl=30.0)
    waiter = AsyncMongoLock(counted_collection, "linger", ttl=30.0, **PATIENT)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await asyncio.sleep(0.5)
    await foreign_release(counted_collection, "linger")
    assert await asyncio.wait_for(waiting, 10)
    assert await waiter.release()
    assert len(await watcher_tasks()) == 1, "closed at once: the next contention would open it again"
    command_counter.clear()
    for _ in range(50):
        if not await watcher_tasks():
            break
        await asyncio.sleep(0.1)
    assert await watcher_tasks() == [], "still open long after its linger time"
    # A kill the server refused, PyMongo sends again from its background task, once a second.
    await asyncio.sleep(common.KILL_CURSOR_FREQUENCY + 0.5)
    assert command_counter.count("killCursors") == 1, "the stream's cursor was not killed at the first try"
    assert command_counter.connections_closed == 0, "closing the stream tore down a pooled connection"


# Three renewals are waited for (within a fixed second, each had 0.13 s for its round trip); they
# must come before the waiter wakes at the expiry it was told of, 6 s after the acquire.
@pytest.mark.timing(margin=4.0)
async def test_renewals_do_not_wake_waiters(counted_collection: Any, command_counter: CommandCounter) -> None:
    holder = AsyncMongoLock(counted_collection, "busy", ttl=6.0, heartbeat=0.2)
    waiter = AsyncMongoLock(counted_collection, "busy", ttl=6.0, **PATIENT)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await command_counter.settled()
    attempts_before = command_counter.count("findAndModify")
    renewals_before = command_counter.count("update")
    give_up_at = time.monotonic() + 4
    while command_counter.count("update") - renewals_before < 3:
        assert time.monotonic() < give_up_at, "the holder did not keep renewing"
        await asyncio.sleep(0.05)
    assert command_counter.count("findAndModify") == attempts_before, "a renewal woke the waiter"
    await foreign_release(counted_collection, "busy")
    assert await asyncio.wait_for(waiting, 15)
    assert command_counter.count("findAndModify") == attempts_before + 1
    await asyncio.wait_for(holder.lost.wait(), 5)  # and the holder notices it lost the lease
    assert await waiter.release()


async def watch_then_break(
    driver: str,
    server: FaultServer,
    break_it: Any,
    *,
    reopens: bool = True,
    client_options: dict[str, Any] | None = None,
) -> None:
    """A waiter of one process must still be woken by a release through the change stream after
    ``break_it`` broke it (the watcher reopens it: ``reopens``), or tried to."""
    counter = CommandCounter()
    waiter_client = server.client(driver, event_listeners=[counter], **(client_options or {}))
    other_client = server.client(driver, app_name=f"{server.app_name}-other")
    try:
        mine = waiter_client[TEST_DATABASE][server.collection]
        theirs = other_client[TEST_DATABASE][server.collection]
        holder = AsyncMongoLock(theirs, "first", ttl=60.0)
        assert await holder.acquire()
        waiting = asyncio.create_task(AsyncMongoLock(mine, "first", ttl=60.0, **PATIENT).acquire(timeout=30))
        # Until the waiter's stream is open, not a fixed 0.5 s: a full run at load 7 once took longer.
        await asyncio.wait_for(counter.settled(), 20)
        assert counter.count("aggregate") == 1
        await break_it(Breakage(theirs, server.admin[TEST_DATABASE][server.collection], server.app_name))
        for _ in range(100 if reopens else 0):
            if counter.count("aggregate") >= 2:
                break
            await asyncio.sleep(0.1)
        if reopens:  # by the watcher (and for a resumable error, by the driver first)
            assert counter.count("aggregate") >= 2, "the stream was not reopened"
        else:
            assert counter.count("aggregate") == 1, "the stream failed and had to be reopened"
        await asyncio.sleep(0.5)
        if not waiting.done():
            await holder.release()
        assert await asyncio.wait_for(waiting, 10)
        # A fresh contention after the break is reported by the reopened stream.
        second = AsyncMongoLock(theirs, "second", ttl=60.0)
        assert await second.acquire()
        waiter = AsyncMongoLock(mine, "second", ttl=60.0, **PATIENT)
        sent = counter.count("findAndModify")
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        # Its place stored (after a fixed 0.5 s it could be on its way still on a loaded machine:
        # the release would then have nobody to hand to, and tell no waiting process).
        await asyncio.wait_for(counter.queued(sent), 20)
        assert await second.release()
        assert await asyncio.wait_for(waiting, 10), "the reopened stream did not report the release"
        assert await waiter.release()
    finally:
        await set_fail_point(other_client[TEST_DATABASE][server.collection], "off")
        await close_client(waiter_client)
        await close_client(other_client)
        server.admin[TEST_DATABASE].drop_collection(f"{server.collection}_renamed")


@dataclass(frozen=True)
class Breakage:
    """What a way of breaking the waiter's change stream gets: a collection of another client, the
    same collection for a user allowed to drop and rename it, and the waiter's appName."""

    collection: Any
    admin: Any
    waiter: str


async def drop_collection(breakage: Breakage) -> None:
    breakage.admin.drop()


async def rename_collection(breakage: Breakage) -> None:
    breakage.admin.rename(f"{breakage.admin.name}_renamed")


def fail_get_more(**failure: Any) -> Any:
    async def arm(breakage: Breakage) -> None:
        await set_fail_point(
            breakage.collection, {"times": 2}, failCommands=["getMore"], appName=breakage.waiter, **failure
        )

    return arm


@pytest.mark.parametrize(
    "break_it",
    [
        drop_collection,
        rename_collection,
        fail_get_more(errorCode=237),  # CursorKilled: the stream ends, not resumable
        fail_get_more(errorCode=11601),  # Interrupted: not resumable
        fail_get_more(errorCode=43, errorLabels=["ResumableChangeStreamError"]),  # CursorNotFound, twice
        fail_get_more(closeConnection=True),  # network error, twice
    ],
    ids=["invalidate-drop", "invalidate-rename", "cursor-killed", "interrupted", "resumable-twice", "network"],
)
async def test_the_watcher_survives(mongolock_driver: str, fault_server: FaultServer, break_it: Any) -> None:
    await watch_then_break(mongolock_driver, fault_server, break_it)


@pytest.mark.timing(margin=0.6)  # each getMore's round trip within the 0.9 s timeout, after waiting 0.3 s
async def test_the_watcher_works_within_the_clients_operation_timeout(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    async def idle(breakage: Breakage) -> None:
        await asyncio.sleep(2.0)  # several getMores under a 0.9 s client timeout: none may fail

    # timeoutMS is shorter than the watcher's usual getMore wait (1 s): it waits a third of the
    # timeout instead, which leaves a loaded machine 0.6 s for each getMore's round trip (0.3 s,
    # when it waited half of a 0.6 s timeout, was missed once in a fresh-clone run of the suite).
    await watch_then_break(mongolock_driver, fault_server, idle, reopens=False, client_options={"timeoutMS": 900})


async def test_without_a_stream_waiters_poll(mongolock_driver: str, fault_server: FaultServer) -> None:
    client = fault_server.client(mongolock_driver)
    try:
        collection = client[TEST_DATABASE][fault_server.collection]
        await set_fail_point(collection, "alwaysOn", failCommands=["aggregate"], errorCode=40573)
        holder = AsyncMongoLock(collection, "polled", ttl=60.0)
        waiter = AsyncMongoLock(collection, "polled", ttl=60.0, retry_base=0.05, retry_cap=0.2)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        await asyncio.sleep(0.5)
        await foreign_release(collection, "polled")
        assert await asyncio.wait_for(waiting, 15)
        assert await waiter.release()
    finally:
        await set_fail_point(client[TEST_DATABASE][fault_server.collection], "off")
        await close_client(client)


async def test_without_change_streams_waiters_use_backoff(
    mongolock_driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mongolock_async")
    with EmbeddedMongo(replica_set=False) as server:
        client = make_client(mongolock_driver, server.uri)
        try:
            collection = client[TEST_DATABASE]["locks"]
            holder = AsyncMongoLock(collection, "standalone", ttl=60.0)
            waiter = AsyncMongoLock(collection, "standalone", ttl=60.0, retry_base=0.05, retry_cap=0.2)
            assert await holder.acquire()
            waiting = asyncio.create_task(waiter.acquire(timeout=10))
            await asyncio.sleep(0.5)
            await foreign_release(collection, "standalone")
            assert await asyncio.wait_for(waiting, 15)
            assert await waiter.release()
            assert "change stream" in caplog.text and "failed" in caplog.text
        finally:
            await close_client(client)


@pytest.mark.timing(margin=4.5)  # the stream notices the closed client within 5 s
async def test_a_closed_client_leaves_nothing_behind(
    mongolock_driver: str, mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    gc.collect()
    # Earlier tests' clients may still be alive (a raised error's traceback keeps its test's frame
    # until the cycle is collected): this test judges only the entries it adds.
    watched_before = len(watcher_module._watchers)
    client = make_client(mongolock_driver, mongolock_uri)
    client_ref = weakref.ref(client)
    collection = client[TEST_DATABASE][f"locks_{uuid.uuid4().hex[:8]}"]
    holder = AsyncMongoLock(collection, "busy", ttl=30.0)
    waiter = AsyncMongoLock(collection, "busy", ttl=30.0, heartbeat=True, **PATIENT)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    give_up_at = time.monotonic() + 10  # for its attempt's answer, then its stream
    while not await watcher_tasks():
        assert time.monotonic() < give_up_at, "waiting opened no change stream"
        await asyncio.sleep(0.05)
    assert await holder.release()
    assert await asyncio.wait_for(waiting, 10)
    assert await waiter.release()
    mongolock_admin_client[TEST_DATABASE].drop_collection(collection.name)  # the test's user may not drop
    await close_client(client)
    del client, collection, holder, waiter, waiting
    for _ in range(50):  # the stream notices the closed client
        if not await watcher_tasks():
            break
        await asyncio.sleep(0.1)
    gc.collect()
    assert client_ref() is None, "something still holds the closed client: " + repr(
        [type(referrer).__name__ for referrer in gc.get_referrers(client_ref())]
    )
    assert len(watcher_module._watchers) <= watched_before


@pytest.mark.safety
async def test_a_release_to_waiters_that_gave_up_meanwhile_leaves_the_lock_free(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    counter = CommandCounter()
    client = fault_server.client(mongolock_driver, event_listeners=[counter])
    try:
        collection = client[TEST_DATABASE][fault_server.collection]
        holder = AsyncMongoLock(collection, "x", ttl=30.0)
        assert await holder.acquire()
        first = AsyncMongoLock(collection, "x", ttl=30.0, **PATIENT)
        second = AsyncMongoLock(collection, "x", ttl=30.0, **PATIENT)
        waiting = [asyncio.create_task(first.acquire(timeout=1.5)), asyncio.create_task(second.acquire(timeout=1.5))]
        # Both queued (the first's place, with a follower for the second), the stream open and every
        # attempt answered: the fail point below must catch the release, not a late attempt.
        await counter.settled()
        # The release names the first waiter, but reaches the server only after both have given up.
        await set_fail_point(
            collection, {"times": 1}, failCommands=["findAndModify"], blockConnection=True, blockTimeMS=3000
        )
        releasing = asyncio.create_task(holder.release())
        assert await asyncio.gather(*waiting) == [False, False]
        assert await releasing
        # The pass-on: a round trip (0.3 s for it was tight on a loaded machine). A lease left with
        # a place nobody waits on would stay for its TTL, 30 s.
        give_up_at = time.monotonic() + 10
        while (doc := await collection.find_one({"_id": "x"}))["owner"] is not None:
            assert time.monotonic() < give_up_at, f"the lease went to a place nobody waits on: {doc}"
            await asyncio.sleep(0.05)
        newcomer = AsyncMongoLock(collection, "x", ttl=30.0)
        assert await newcomer.acquire(blocking=False)
        assert await newcomer.release()
    finally:
        await close_client(client)


@pytest.mark.safety
async def test_a_waiter_cancelled_as_it_is_handed_the_lease_passes_it_on(mongolock_collection: Any) -> None:
    holder = AsyncMongoLock(mongolock_collection, "race", ttl=30.0)
    first = AsyncMongoLock(mongolock_collection, "race", ttl=30.0, **PATIENT)
    second = AsyncMongoLock(mongolock_collection, "race", ttl=30.0, **PATIENT)
    assert await holder.acquire()
    first_task = asyncio.create_task(first.acquire())
    await asyncio.sleep(0.3)
    second_task = asyncio.create_task(second.acquire(timeout=20))
    await asyncio.sleep(0.3)
    releasing = asyncio.create_task(holder.release())
    await asyncio.sleep(0)  # the release is on its way, naming the first waiter
    first_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first_task
    assert await releasing
    assert await asyncio.wait_for(second_task, 10), "the lease was stranded with the cancelled waiter"
    assert first.fencing_token is None
    assert await second.release()


@pytest.mark.timing(margin=2.0)  # the held refresh fails before the waiter's 5 s timeout
async def test_a_place_refresh_that_fails_in_transit_leaves_the_place_uncertain_not_gone(
    mongolock_driver: str, fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The heartbeat refreshes a waiting process's place; a refresh that fails in transit says
    # nothing of whether the place is there (a refresh never writes one). Taken as gone, a waiter
    # giving up before it looked again withdrew nothing, and a release could hand the lock to the
    # place, which nobody keeps (the model found it: model/check.py's refresh-failed-gone control).
    # The server holds one refresh past its bound; what the queue believes as it is woken is recorded.
    holder_client = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-holder")
    waiter_client = fault_server.client(mongolock_driver)
    locks = fault_server.collection
    seen: list[PlaceState] = []
    on_news = queues_module.LocalQueue.on_news

    def recording(queue: queues_module.LocalQueue) -> None:
        seen.append(queue.place)
        on_news(queue)

    try:
        holder = AsyncMongoLock(holder_client[TEST_DATABASE][locks], "refreshed", ttl=30.0)
        assert await holder.acquire()
        # A TTL of 3 s: the place is refreshed every second, each refresh bounded by that (shorter,
        # a loaded machine's refreshes time out by themselves, and the place is rarely seen stored).
        waiter = AsyncMongoLock(waiter_client[TEST_DATABASE][locks], "refreshed", ttl=3.0, **PATIENT)
        waiting = asyncio.create_task(waiter.acquire(timeout=5.0))
        for _ in range(500):
            queue = existing_queue(waiter._store, "refreshed", 1)
            head = None if queue is None else queue.head
            if queue is not None and queue.place is PlaceState.STORED and head is not None and head.turn is Turn.PLACED:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the waiter's place was never stored")
        monkeypatch.setattr(queues_module.LocalQueue, "on_news", recording)
        await set_fail_point(
            waiter_client[TEST_DATABASE][locks],
            {"times": 1},
            failCommands=["update"],
            blockConnection=True,
            blockTimeMS=2500,
        )
        with contextlib.suppress(LockTimeoutError):  # its next attempt may meet the held server too
            assert not await waiting
        # (News from elsewhere wakes the waiter too: the stream's, its own attempts'.)
        assert PlaceState.ABSENT not in seen, f"a refresh that failed in transit was taken as gone: {seen}"
        assert PlaceState.UNCERTAIN in seen, f"the failed refresh woke nobody: {seen}"
        assert await holder.release()
        fresh = AsyncMongoLock(holder_client[TEST_DATABASE][locks], "refreshed", ttl=30.0)
        assert await fresh.acquire(blocking=False), "the release handed the lock to a place nobody keeps"
        assert await fresh.release()
    finally:
        await set_fail_point(waiter_client[TEST_DATABASE][locks], "off")
        await close_client(holder_client)
        await close_client(waiter_client)


@pytest.mark.safety
async def test_a_late_report_of_an_old_hand_off_is_not_taken_as_fresh(
    mongolock_collection: Any, mongolock_driver: str, mongolock_uri: str
) -> None:
    # A change stream that the driver resumed after an outage can report a hand-off to this
    # process's place long after it happened: after that lease expired, someone else took the lock,
    # and this process wrote its place again with the same token. Such a report carries a fence no
    # higher than the one the place's last write saw; the waiter must claim (and find it gone),
    # never take the old lease as its own (seen once in the soak as an overlap).
    async with other_process(mongolock_driver, mongolock_uri, mongolock_collection.name) as (remote, _):
        holder = AsyncMongoLock(remote, "late-news", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(mongolock_collection, "late-news", ttl=30.0, fair=True, **PATIENT)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        queue = None
        for _ in range(100):
            queue = existing_queue(waiter._store, "late-news", 1)
            stored = queue is not None and queue.place is PlaceState.STORED
            if stored and queue is not None and queue.head is not None and queue.head.turn is Turn.PLACED:
                break
            await asyncio.sleep(0.05)
        assert queue is not None and queue.slot is not None and queue.head is not None
        old_fence = holder.fencing_token
        assert old_fence is not None
        queue.on_handed_to_place(queue.slot, old_fence)  # the late report: the holder's own fence
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the waiter took a lease that another holder has"
        assert await holder.release()
        assert await asyncio.wait_for(waiting, 10)
        assert waiter.fencing_token is not None and waiter.fencing_token > old_fence
        assert await waiter.release()
