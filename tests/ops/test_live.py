"""The live view (``LockWatch``): the events it tells from a real server's writes, expiry noticed on
the server's clock without a write, what it costs the server (one change stream, reads only), and
polling where there is no change stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore
from mongolock_async.live import LockEvent, LockWatch, ViewUpdate, derive_events
from mongolock_async.operations import force_release
from mongolock_async.store.documents import LockState
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.loop import settle

WRITES = {"insert", "update", "delete", "findAndModify", "create", "createIndexes", "drop"}


class Seen:
    """The updates of a view as they come, and a way to wait for one that matters."""

    def __init__(self, watch: LockWatch) -> None:
        self.updates: AsyncIterator[ViewUpdate] = aiter(watch)
        self.events: list[LockEvent] = []
        self.last: ViewUpdate | None = None

    async def until(self, condition: Callable[[Seen], bool], within: float = 10.0) -> None:
        give_up_at = time.monotonic() + within
        while not condition(self):
            left = give_up_at - time.monotonic()
            assert left > 0, f"not seen within {within} s; events: {[(e.event, e.name) for e in self.events]}"
            self.last = await asyncio.wait_for(anext(self.updates), left)
            self.events.extend(self.last.events)

    def told(self, event: str, name: str) -> list[LockEvent]:
        return [seen for seen in self.events if seen.event == event and seen.name == name]


@pytest.mark.timing(margin=1.2)  # the short lease's acquire answered within 1.35 s; 5 s leases
async def test_the_view_tells_each_event_as_it_happens(mongolock_collection: Any) -> None:
    opened = AsyncMongoLock(mongolock_collection, "opened", ttl=5)  # the collection exists before the view opens
    assert await opened.acquire() and await opened.release()
    async with LockWatch(mongolock_collection, max_await=0.2) as watch:
        seen = Seen(watch)
        await seen.until(lambda seen: seen.last is not None)
        assert seen.last is not None and seen.last.first and seen.last.mode == "stream"
        assert list(seen.last.locks) == ["opened"] and seen.last.locks["opened"].status == "released"

        first = AsyncMongoLock(mongolock_collection, "alpha", ttl=5, label="first")
        assert await first.acquire()
        await seen.until(lambda seen: bool(seen.told("acquired", "alpha")))
        second = AsyncMongoLock(mongolock_collection, "alpha", ttl=5, label="second")
        waiting = asyncio.create_task(second.acquire(timeout=10))
        await seen.until(lambda seen: seen.last is not None and len(seen.last.locks["alpha"].waiting) == 1)
        assert await first.release()
        assert await waiting
        await seen.until(lambda seen: bool(seen.told("handed off", "alpha")))
        (handed,) = seen.told("handed off", "alpha")
        assert handed.previous is not None and handed.previous.label == "first"
        assert handed.holder is not None and handed.holder.label == "second"
        assert handed.fencing_token == second.fencing_token
        assert not seen.told("released", "alpha"), "a hand-off is one event"
        assert seen.last is not None and seen.last.locks["alpha"].holders[0].label == "second"

        owner = seen.last.locks["alpha"].holders[0].owner
        assert owner is not None
        assert await force_release(mongolock_collection, "alpha", holder=owner, by="test") is not None
        await seen.until(lambda seen: bool(seen.told("forced", "alpha")))
        assert seen.last is not None and not seen.last.locks["alpha"].held

        # 1.5 s: a grant answered after the lease's local deadline (0.27 s of a 0.3 s TTL, on a loaded
        # machine) is released again, which the view would tell.
        crashed = AsyncMongoLock(mongolock_collection, "short", ttl=1.5, label="crashed")
        assert await crashed.acquire()
        crashed._forget_lease()  # as a process that died: no release, no renewal
        await seen.until(lambda seen: bool(seen.told("expired", "short")))
        (expired,) = seen.told("expired", "short")
        assert expired.holder is not None and expired.at == expired.holder.expires_at, "timed at the expiry itself"
        assert seen.last is not None and seen.last.locks["short"].status == "expired"

        taker = AsyncMongoLock(mongolock_collection, "short", ttl=5, label="taker")
        assert await taker.acquire()
        await seen.until(lambda seen: len(seen.told("acquired", "short")) == 2)
        (lost,) = seen.told("lost", "short")
        assert lost.holder is not None and lost.holder.label == "crashed"
        assert await taker.release()
        await seen.until(lambda seen: bool(seen.told("released", "short")))

    told = [(event.event, event.name, event.holder.label if event.holder else None) for event in seen.events]
    assert told == [
        ("acquired", "alpha", "first"),
        ("handed off", "alpha", "second"),
        ("forced", "alpha", "second"),
        ("acquired", "short", "crashed"),
        ("expired", "short", "crashed"),
        ("lost", "short", "crashed"),
        ("acquired", "short", "taker"),
        ("released", "short", "taker"),
    ]


@pytest.mark.timing(margin=4.0)  # 5 s permits, released at the end
async def test_permits_are_told_apart(pymongo_collection: Any) -> None:
    collection = pymongo_collection
    opened = AsyncMongoSemaphore(collection, "pool", 2, ttl=5, label="a")
    assert await opened.acquire()
    async with LockWatch(collection, max_await=0.2) as watch:
        seen = Seen(watch)
        other = AsyncMongoSemaphore(collection, "pool", 2, ttl=5, label="b")
        assert await other.acquire()
        await seen.until(lambda seen: bool(seen.told("acquired", "pool")))
        assert seen.last is not None and seen.last.locks["pool"].summary == "2/2 held"
        third = AsyncMongoSemaphore(collection, "pool", 2, ttl=5, label="c")
        waiting = asyncio.create_task(third.acquire(timeout=10))
        await seen.until(lambda seen: seen.last is not None and bool(seen.last.locks["pool"].waiting))
        assert await opened.release()
        assert await waiting
        await seen.until(lambda seen: bool(seen.told("handed off", "pool")))
        (handed,) = seen.told("handed off", "pool")
        assert (handed.previous and handed.previous.label, handed.holder and handed.holder.label) == ("a", "c")
        assert await other.release() and await third.release()
        await seen.until(lambda seen: len(seen.told("released", "pool")) == 2)


def test_a_writer_handing_to_readers_is_one_hand_off_each() -> None:
    """A read-write lock's writer releasing to the readers queued before the next writer: one write."""
    then = datetime.now(UTC).replace(microsecond=0)
    released = then + timedelta(seconds=1)

    def holder(token: str, weight: int, at: datetime) -> dict[str, Any]:
        return {"o": token, "w": weight, "exp": at + timedelta(seconds=30), "fence": 7, "ttlMs": 30_000,
                "holder": {"host": "h", "pid": 1, "label": token}, "at": at}  # fmt: skip

    before = {"_id": "rw", "kind": "rwlock", "limit": 10_000, "fence": 7, "holders": [holder("w", 10_000, then)]}
    after = {**before, "holders": [holder("r1", 1, released), holder("r2", 1, released)], "releasedAt": released}
    events = derive_events(LockState.from_document(before), LockState.from_document(after), released)
    assert [(e.event, e.previous and e.previous.label, e.holder and e.holder.role) for e in events] == [
        ("handed off", "w", "reader"),
        ("handed off", "w", "reader"),
    ]


def test_a_lock_taken_and_released_between_two_looks_is_told() -> None:
    """Under load, the lookup of an acquire's event can already see the release: neither state has a
    lease, but the fencing token moved and the document names who held it."""
    then = datetime.now(UTC).replace(microsecond=0)
    released = {"_id": "job", "owner": None, "expiresAt": then, "fence": 7, "ttlMs": 5000, "acquiredAt": then,
                "releasedAt": then, "holder": {"host": "h", "pid": 1, "label": "first"}}  # fmt: skip
    later = then + timedelta(seconds=1)
    again = {**released, "fence": 8, "acquiredAt": later, "releasedAt": later, "holder": {"label": "second"}}
    events = derive_events(LockState.from_document(released), LockState.from_document(again), later)
    assert [(event.event, event.holder and event.holder.label, event.fencing_token) for event in events] == [
        ("acquired", "second", 8),
        ("released", "second", 8),
    ]
    assert derive_events(LockState.from_document(again), LockState.from_document(again), later) == []


async def test_a_viewer_reads_one_stream_and_sends_no_write(
    pymongo_collection: Any, mongolock_uri: str, command_counter: CommandCounter
) -> None:
    collection = pymongo_collection
    opened = AsyncMongoLock(collection, "opened", ttl=5)
    assert await opened.acquire() and await opened.release()
    client = make_client("pymongo", mongolock_uri, event_listeners=[command_counter])
    try:
        async with LockWatch(client[TEST_DATABASE][collection.name], max_await=0.5) as watch:
            seen = Seen(watch)
            await seen.until(lambda seen: seen.last is not None)
            at_open = list(command_counter.names)
            command_counter.clear()
            for cycle in range(6):
                async with AsyncMongoLock(collection, f"churn-{cycle % 3}", ttl=5):
                    pass
            await seen.until(lambda seen: sum(event.event == "released" for event in seen.events) == 6)
            during = list(command_counter.commands)
    finally:
        await close_client(client)
    # Opening: the stream, the server's clock, one read of the documents (then the stream's getMore).
    assert at_open[:3] == ["aggregate", "hello", "find"] and set(at_open[3:]) <= {"getMore"}, at_open
    assert not WRITES & set(command_counter.names), command_counter.names
    # While locks churn: nothing but the one stream's getMores (no read per change, no polling).
    assert {command_name(command) for command in during} == {"getMore"}, during
    assert len({command["getMore"] for command in during}) == 1, "one cursor"


def command_name(command: dict[str, Any]) -> str:
    return next(iter(command))


async def test_without_change_streams_the_view_reads_every_interval_and_says_so() -> None:
    counter = CommandCounter()
    with EmbeddedMongo(replica_set=False) as server:
        viewer: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri, event_listeners=[counter])
        writer: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
        try:
            lock = AsyncMongoLock(writer.mongolock.locks, "standalone", ttl=5, label="solo")
            assert await lock.acquire() and await lock.release()
            async with LockWatch(viewer.mongolock.locks, poll_interval=0.1) as watch:
                seen = Seen(watch)
                await seen.until(lambda seen: seen.last is not None)
                assert seen.last is not None and seen.last.mode == "polling"
                assert seen.last.note is not None and "standalone" in seen.last.note and "0.1 s" in seen.last.note
                assert await lock.acquire()
                await seen.until(lambda seen: bool(seen.told("acquired", "standalone")))
                assert await lock.release()
                await seen.until(lambda seen: bool(seen.told("released", "standalone")))
        finally:
            await writer.close()
            await viewer.close()
    assert "getMore" not in counter.names and not WRITES & set(counter.names), counter.names
    assert counter.count("find") >= 3, "the documents were read again and again"


def test_bad_arguments_are_refused_before_any_io(pymongo_collection: Any) -> None:
    with pytest.raises(TypeError, match="prefix"):
        LockWatch(pymongo_collection, prefix=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll_interval"):
        LockWatch(pymongo_collection, poll_interval=0)
    with pytest.raises(TypeError, match="blocking pymongo Collection"):
        from pymongo import MongoClient

        LockWatch(MongoClient(connect=False).db.locks)


@pytest.mark.one_driver  # asyncio's behaviour, not the driver's
async def test_a_view_cancelled_as_news_arrives_stops(mongolock_collection: Any) -> None:
    """A cancellation in the same loop iteration as the view's news is raised, not lost. On Python
    3.11 ``asyncio.wait_for`` returned the news and dropped the cancellation (CPython gh-86296); a
    dashboard closing its view then waited for ever (its server's shutdown in a test, once in 28)."""
    held = AsyncMongoLock(mongolock_collection, "held", ttl=60)  # an expiry ahead: a bounded wait
    assert await held.acquire()
    async with LockWatch(mongolock_collection, max_await=5.0) as watch:
        updates = aiter(watch)
        await anext(updates)
        following = asyncio.create_task(anext(updates))
        await settle()
        assert not following.done()
        watch._queue.put_nowait(("heard", watch.server_now()))  # news, as the stream's task puts it
        following.cancel()
        done, _ = await asyncio.wait({following}, timeout=5)
        assert following in done and following.cancelled(), "the view went on waiting for news"
    assert await held.release()


@pytest.mark.timing(margin=2.5)  # still closing: its getMore waits up to 3 s
@pytest.mark.one_driver  # asyncio's behaviour, not the driver's
async def test_a_view_cancelled_while_it_closes_raises_the_cancellation(mongolock_collection: Any) -> None:
    """Leaving a view waits for its change stream's ``getMore`` (up to ``max_await``); a
    cancellation that arrives meanwhile is raised when it ends, never swallowed (the code after
    the ``async with`` must not run)."""
    entered, went_on = asyncio.Event(), []

    async def view_and_leave() -> None:
        async with LockWatch(mongolock_collection, max_await=3.0):
            await asyncio.sleep(0.3)  # its stream's task sends a getMore, which waits up to 3 s
            entered.set()
        went_on.append(True)

    task = asyncio.create_task(view_and_leave())
    await entered.wait()
    await asyncio.sleep(0.05)  # in the view's close, its getMore in flight for up to 3 s
    assert not task.done()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)
    assert task in done and task.cancelled() and not went_on
