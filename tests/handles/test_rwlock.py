"""AsyncMongoRWLock: many readers or one writer, across OS processes and tasks; writers are not
starved by readers nor readers by writers; a writer's token is above every token before it.

The safety tests judge a holder by what its handle says (``tests/workers/belief.py``): a section
runs from an entry observed while its lease was live to its exit or that lease's local deadline, and
a grant beside a writer counts only if the writer still said it held after it. No pause can make a
correct lock fail them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoRWLock, AsyncMongoSemaphore, LockDataError, LockLostError, RWLockHandle
from mongolock_async.store import LockStore, Permits, PlaceRequest
from mongolock_async.store.permit_release import release_pipeline
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.overlap import most_at_once
from tests.support.permits import expire_every_permit
from tests.support.processes import WORKERS, run_workers
from tests.workers.belief import believes, release_as_promised

WORKER = WORKERS / "rwlock_worker.py"
PROCESSES, READERS, WRITERS, SECONDS = 4, 4, 1, 4.0
Section = tuple[str, float, float, int, float]
"""(mode, entered, left, fencing token, when its acquire began), on the machine's monotonic clock."""


def conflicts(sections: list[Section]) -> int:
    """Pairs of sections that overlapped in time with a writer in the pair."""
    ordered = sorted(sections, key=lambda section: section[1])
    found = 0
    for index, (mode, _, left, _, _) in enumerate(ordered):
        for other in ordered[index + 1 :]:
            if other[1] >= left:
                break
            if "write" in (mode, other[0]):
                found += 1
    return found


def most_readers_at_once(sections: list[Section]) -> int:
    return most_at_once([(entered, left) for mode, entered, left, _, _ in sections if mode == "read"])


def test_the_detectors_count_what_they_should() -> None:
    read, write = "read", "write"
    assert conflicts([(read, 0.0, 2.0, 1, 0.0), (read, 1.0, 3.0, 2, 0.0), (write, 3.0, 4.0, 3, 0.0)]) == 0
    assert conflicts([(read, 0.0, 2.0, 1, 0.0), (write, 1.0, 3.0, 2, 0.0), (read, 2.5, 3.5, 3, 0.0)]) == 2
    assert most_readers_at_once([(read, 0.0, 2.0, 1, 0.0), (read, 1.0, 3.0, 2, 0.0), (write, 3.0, 4.0, 3, 0.0)]) == 2


def run_contention(uri: str, kind: str) -> list[Section]:
    collection = f"rwlock_{kind}_{uuid.uuid4().hex[:8]}"
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    arguments = [uri, TEST_DATABASE, collection, kind, str(READERS), str(WRITERS), str(SECONDS), str(start_at)]
    sections: list[Section] = []
    for out in run_workers(WORKER, arguments, PROCESSES):
        sections += [tuple(json.loads(line)) for line in out]  # type: ignore[misc]
    return sections


@pytest.mark.safety
@pytest.mark.parametrize("kind", ["real", "broken"])
def test_never_a_writer_with_anyone_else_across_processes(mongolock_uri: str, kind: str) -> None:
    sections = run_contention(mongolock_uri, kind)
    writes = [section for section in sections if section[0] == "write"]
    assert len(sections) >= 40 and writes, f"too little contention to judge ({len(sections)} sections)"
    found = conflicts(sections)
    if kind == "broken":
        assert found > 0, f"the detector found no writer overlapping anyone in {len(sections)} sections"
        return
    assert found == 0, f"{found} overlaps with a writer in {len(sections)} sections"
    assert most_readers_at_once(sections) >= 2, "readers held the lock together"
    # A grant's token is above the token of every section that ended before its acquire began.
    assert len({section[3] for section in sections}) == len(sections), "two grants had one token"
    for _, _, _, token, asked in sections:
        before = [earlier[3] for earlier in sections if earlier[2] < asked]
        assert not before or token > max(before), "a fencing token went down"


async def test_a_waiting_writer_holds_new_readers_back(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    rw = AsyncMongoRWLock(counted_collection, "index", ttl=10.0)
    first, second = rw.read(), rw.read()
    assert await first.acquire(blocking=False) and await second.acquire(blocking=False)
    writer = rw.write()
    assert await writer.locked() and not await rw.read().locked()
    writing = asyncio.create_task(writer.acquire(timeout=10))
    await command_counter.settled()  # the writer's place is stored
    late = rw.read()
    assert not await late.acquire(blocking=False), "a reader came in past a waiting writer"
    sent = command_counter.count("findAndModify")
    reading = asyncio.create_task(late.acquire(timeout=10))
    await command_counter.queued(sent)  # and the late reader's, behind it
    assert await first.release() and await second.release()
    assert await writing, "the writer got the lock once the readers in before it left"
    assert not reading.done(), "the late reader waits for the writer"
    written = writer.fencing_token
    assert written is not None and first.fencing_token is None
    assert await writer.release()
    assert await reading
    assert late.fencing_token is not None and late.fencing_token > written
    assert await late.release()


async def test_readers_queued_behind_a_writer_all_get_in_at_its_release(mongolock_collection: Any) -> None:
    rw = AsyncMongoRWLock(mongolock_collection, "batch", ttl=10.0)
    writer = rw.write()
    assert await writer.acquire(blocking=False)
    readers = [rw.read() for _ in range(3)]
    waiting = [asyncio.create_task(reader.acquire(timeout=10)) for reader in readers]
    await asyncio.sleep(0.5)
    assert not any(task.done() for task in waiting)
    token = writer.fencing_token
    assert token is not None and await writer.release()
    assert all(await asyncio.gather(*waiting))
    tokens = [reader.fencing_token for reader in readers]
    assert all(t is not None and t > token for t in tokens) and len(set(tokens)) == 3
    doc = await mongolock_collection.find_one({"_id": "batch"})
    assert len(doc["holders"]) == 3, "the three readers hold it together"
    for reader in readers:
        assert await reader.release()


async def test_a_stream_of_writers_does_not_starve_a_reader(mongolock_collection: Any) -> None:
    rw = AsyncMongoRWLock(mongolock_collection, "busy", ttl=10.0)
    stop = asyncio.Event()
    writes = 0

    async def keep_writing() -> None:
        nonlocal writes
        while not stop.is_set():
            async with rw.write():
                writes += 1
                await asyncio.sleep(0.05)

    writers = [asyncio.create_task(keep_writing()) for _ in range(3)]
    await asyncio.sleep(0.5)
    reader = rw.read()
    started = time.monotonic()
    assert await reader.acquire(timeout=10), "the reader got its turn"
    waited = time.monotonic() - started
    assert await reader.release()
    stop.set()
    await asyncio.gather(*writers)
    assert writes >= 3, f"the writers wrote ({writes})"
    assert waited < 10


@pytest.mark.timing(margin=2.2)  # a renewal every 0.5 s, each lease ending 2.7 s after its send
async def test_the_heartbeat_keeps_a_write_and_its_loss_cancels_the_block(mongolock_collection: Any) -> None:
    # A 3 s TTL renewed every 0.5 s: over 2 s for a renewal's round trip (as the semaphore's test:
    # 0.6 s was not always enough on a loaded machine).
    rw = AsyncMongoRWLock(mongolock_collection, "kept", ttl=3.0, heartbeat=0.5)
    async with rw.write() as writer:
        await asyncio.sleep(6.0)  # two TTLs
        assert await writer.owned()
    with pytest.raises(LockLostError):
        async with rw.read():
            await mongolock_collection.update_one({"_id": "kept"}, {"$set": {"holders": []}})
            await asyncio.sleep(5)
            pytest.fail("the block ran on after its read was lost")


async def test_hostile_arguments_are_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    with pytest.raises(TypeError, match="fair"):
        AsyncMongoRWLock(counted_collection, "bad", fair=True)
    with pytest.raises(ValueError, match="ttl"):
        AsyncMongoRWLock(counted_collection, "bad", ttl=-1)
    with pytest.raises(ValueError, match="name"):
        AsyncMongoRWLock(counted_collection, "")
    with pytest.raises(ValueError, match="heartbeat"):
        AsyncMongoRWLock(counted_collection, "bad", ttl=1.0).write(heartbeat=0.9)
    assert command_counter.names == []


@pytest.mark.parametrize(
    "edit",
    [{"holders": [{"o": "x", "w": "heavy", "fence": 1}]}, {"holders": [{"o": "x", "w": 0, "fence": 1}]}],
    ids=["weight-string", "weight-zero"],
)
async def test_documents_edited_by_hand_are_refused(mongolock_collection: Any, edit: dict[str, Any]) -> None:
    rw = AsyncMongoRWLock(mongolock_collection, "edited", ttl=10.0)
    reader = rw.read()
    assert await reader.acquire(blocking=False)
    await mongolock_collection.update_one({"_id": "edited"}, {"$set": edit})
    with pytest.raises(LockDataError):
        await rw.write().acquire(blocking=False)
    doc = await mongolock_collection.find_one({"_id": "edited"})
    assert doc["holders"] == edit["holders"], "nothing was written to the edited document"


async def test_a_name_is_of_one_kind(mongolock_collection: Any) -> None:
    semaphore = AsyncMongoSemaphore(mongolock_collection, "shared-name", 2, ttl=10.0)
    assert await semaphore.acquire(blocking=False)
    with pytest.raises(LockDataError, match="semaphore, not a read-write lock"):
        await AsyncMongoRWLock(mongolock_collection, "shared-name").read().acquire(blocking=False)
    assert await semaphore.release()


@pytest.mark.safety
async def test_tokens_rise_across_release_expiry_force_release_and_purge(
    mongolock_collection: Any, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    rw = AsyncMongoRWLock(mongolock_collection, "fenced", ttl=10.0)
    tokens: list[int] = []

    async def take(handle: RWLockHandle) -> RWLockHandle:
        # Each finds the lock free: the timeout only bounds a server that does not answer.
        assert await handle.acquire(timeout=30)
        assert handle.fencing_token is not None
        tokens.append(handle.fencing_token)
        return handle

    await release_as_promised(await take(rw.write()))  # released
    dead = await take(rw.write())
    dead._forget_lease()  # never released, as by a killed process: the writer's hold expires
    await expire_every_permit(mongolock_collection, "fenced")  # by hand: no pause stretches or ends it early
    reader = await take(rw.read())  # taken over after the expiry
    forced = await store.force_release("fenced")  # an operator breaks it
    assert forced is not None and [permit[2] for permit in forced.permits] == tokens[-1:]
    reader._forget_lease()
    writer = await take(rw.write())
    writer._forget_lease()
    # Purged by the idle-cleanup index (which the server runs; the test's user may not delete).
    mongolock_admin_client[TEST_DATABASE][mongolock_collection.name].delete_one({"_id": "fenced"})
    await asyncio.sleep(0.01)
    await take(rw.write())
    assert tokens == sorted(set(tokens)), f"fencing tokens went down: {tokens}"


@pytest.mark.safety
async def test_a_writer_never_waits_in_a_readers_place(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    # A reader of this process waits (its place, weighing one reader, is stored) and a writer of the
    # same process queues behind it. When the reader gives up, the writer must not inherit that
    # place: a hand-off to it would grant a reader's weight, and readers would come in beside the writer.
    other = make_client(mongolock_driver, mongolock_uri)

    async def place_stored(name: str) -> bool:
        return bool((await mongolock_collection.find_one({"_id": name})).get("queue"))

    try:
        # The reader's timeout leaves a loaded machine 2 s to store its place; a pause longer than
        # that leaves nothing to judge, and the scenario runs again on a fresh name.
        for attempt in range(3):
            name = f"index-{attempt}"
            elsewhere = AsyncMongoRWLock(other[TEST_DATABASE][mongolock_collection.name], name, ttl=10.0)
            held = elsewhere.write()
            assert await held.acquire(blocking=False)
            rw = AsyncMongoRWLock(mongolock_collection, name, ttl=10.0, retry_base=60.0, retry_cap=60.0)
            reader, writer = rw.read(), rw.write()
            reading = asyncio.create_task(reader.acquire(timeout=2.0))
            while not reading.done() and not await place_stored(name):  # noqa: ASYNC110 - polls the server
                await asyncio.sleep(0.01)
            if not reading.done():
                break
            assert await reading is False
            await release_as_promised(held)
        else:
            pytest.fail("the reader gave up before its place was stored, three times")
        writing = asyncio.create_task(writer.acquire(timeout=30))
        assert await reading is False
        await release_as_promised(held)
        assert await writing
        late = elsewhere.read()
        if await late.acquire(blocking=False):
            assert not believes(writer), "a reader came in beside the writer"
        await release_as_promised(writer)
    finally:
        await close_client(other)


async def test_readers_leaving_before_a_waiting_writer_wake_no_one(mongolock_driver: str, mongolock_uri: str) -> None:
    # While a writer waits for the readers in before it, a reader's release lets nobody in (the
    # writer does not fit yet; everyone else is behind it), so it must not wake the waiting
    # processes: each would send an attempt to the one document, and with many processes those
    # attempts delay the very release that hands the writer its turn.
    collection = f"rw_wake_{uuid.uuid4().hex[:8]}"
    counter = CommandCounter()
    readers_client = make_client(mongolock_driver, mongolock_uri)
    waiting_client = make_client(mongolock_driver, mongolock_uri, event_listeners=[counter])
    try:
        elsewhere = AsyncMongoRWLock(readers_client[TEST_DATABASE][collection], "index", ttl=10.0)
        held = [elsewhere.read() for _ in range(4)]
        for reader in held:
            assert await reader.acquire(blocking=False)
        rw = AsyncMongoRWLock(waiting_client[TEST_DATABASE][collection], "index", ttl=10.0)
        writer, late_reader = rw.write(), rw.read()
        writing = asyncio.create_task(writer.acquire(timeout=10))
        await counter.settled()  # the writer's place is stored, the stream open
        sent = counter.count("findAndModify")
        reading = asyncio.create_task(late_reader.acquire(timeout=10))
        await counter.queued(sent)  # and the late reader's place, behind it
        attempts_before = counter.count("findAndModify")
        for reader in held[:-1]:
            assert await reader.release()
            await asyncio.sleep(0.3)  # time for the change event to arrive
        assert counter.count("findAndModify") == attempts_before, "a release that let nobody in woke the waiters"
        assert not writing.done() and not reading.done()
        assert await held[-1].release()
        assert await writing, "the last reader's release handed the writer its turn"
        assert await writer.release()
        assert await reading
        assert await late_reader.release()
    finally:
        await close_client(readers_client)
        await close_client(waiting_client)


# What a writer's release hands on, and what it leaves queued, in every arrangement of its own
# process's next waiter (the successor): the release picks them by index rather than rebuilding
# arrays in a loop (linear in the places queued), so it is checked against this model of the rule.
READER, WRITER = Permits("rwlock", 10_000, 1), Permits("rwlock", 10_000, 10_000)
QUEUE = [("r1", READER), ("r2", READER), ("w1", WRITER), ("r3", READER)]


def expected_hand_off(successor: str | None, fair: bool, successor_first: bool) -> tuple[list[str], list[str]]:
    """(handed, left queued): the live places with the successor queued last if it has none, in
    the order of hand-offs (the successor first or last unless fair), the longest run from the
    first that fits in the writer's freed weight; the rest keep the stored order."""
    stored = [token for token, _ in QUEUE] + ([successor] if successor and successor not in dict(QUEUE) else [])
    order = stored
    if successor and not fair:
        others = [token for token in stored if token != successor]
        order = [successor, *others] if successor_first else [*others, successor]
    weight = {token: permits.weight for token, permits in QUEUE} | ({successor: 1} if successor else {})
    handed, room = [], 10_000
    for token in order:
        if weight[token] > room:
            break
        handed.append(token)
        room -= weight[token]
    return handed, [token for token in stored if token not in handed]


# Each way the queue left behind is computed: the handed places the first of the stored queue (a
# slice), without a successor or with one where the hand-off order puts it anyway; the successor
# moved to the front or the back (the rest picked by index); a successor new to the queue; fair.
ARRANGEMENTS = [
    (None, False, True),
    (None, True, True),
    ("r1", False, True),
    ("r2", False, True),
    ("r2", False, False),
    ("r3", False, False),
    ("s-new", False, True),
    ("s-new", False, False),
    ("r2", True, True),
]


# The pipeline is the store's, whatever the driver that sends it.
@pytest.mark.safety  # a hand-off grants no more than the writer's release freed
@pytest.mark.parametrize("mongolock_driver", ["pymongo"])
@pytest.mark.parametrize(
    ("successor", "fair", "successor_first"),
    ARRANGEMENTS,
    ids=[
        f"{s}-{'fair' if f else 'default'}-{'successor' if first else 'others'}-first" for s, f, first in ARRANGEMENTS
    ],
)
async def test_a_writers_release_hands_on_and_keeps_the_queue_in_order(
    mongolock_collection: Any, successor: str | None, fair: bool, successor_first: bool
) -> None:
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    assert (await store.try_acquire("order", "writer", 60_000, {}, permits=WRITER)).holds("writer")
    for token, permits in QUEUE:
        await store.try_acquire("order", token, 60_000, {}, enqueue=True, fair=True, permits=permits)
    request = None if successor is None else PlaceRequest(successor, 60_000, {}, weight=1)
    state = await store.release(
        "order", "writer", successor=request, fair=fair, successor_first=successor_first, permits=WRITER
    )
    assert state is not None
    handed, left = expected_hand_off(successor, fair, successor_first)
    assert sorted(permit.token for permit in state.permits) == sorted(handed)
    assert [place.token for place in state.queue] == left
    if len(handed) > 1:  # what a change stream looks for
        doc = await mongolock_collection.find_one({"_id": "order"})
        assert sorted(doc["handedOffTo"].split(" ")) == sorted(handed), doc["handedOffTo"]


def _grows_its_accumulator(expression: Any) -> bool:
    """Whether ``expression`` (a $reduce's ``in``) concatenates onto ``$$value``."""
    if isinstance(expression, Mapping):
        for key, value in expression.items():
            if key in ("$concat", "$concatArrays") and isinstance(value, list) and "$$value" in value:
                return True
            if _grows_its_accumulator(value):
                return True
    elif isinstance(expression, list):
        return any(_grows_its_accumulator(item) for item in expression)
    return False


def _unbounded_growing_reductions(expression: Any) -> list[Any]:
    """Every $reduce that appends to its accumulator over an input of unbounded length (anything
    but a $slice of a constant number of elements): work quadratic in that input."""
    found = []
    if isinstance(expression, Mapping):
        reduce = expression.get("$reduce")
        if isinstance(reduce, Mapping) and _grows_its_accumulator(reduce.get("in")):
            bounded = reduce.get("input")
            if not (isinstance(bounded, Mapping) and isinstance((bounded.get("$slice") or [None])[-1], int)):
                found.append(reduce)
        for value in expression.values():
            found += _unbounded_growing_reductions(value)
    elif isinstance(expression, list):
        for item in expression:
            found += _unbounded_growing_reductions(item)
    return found


@pytest.mark.parametrize("leaving", [False, True], ids=["release", "withdrawal"])
@pytest.mark.parametrize("fair", [False, True], ids=["default", "fair"])
def test_a_release_grows_nothing_place_by_place(fair: bool, leaving: bool) -> None:
    # A writer's release hands on to every reader queued before the next writer (up to
    # MAX_PERMITS): appending them one by one to an array or a string inside $reduce copies the
    # accumulator each time, quadratic in the places (the benchmark's 1,000 against 10 places).
    for successor in (None, PlaceRequest("s", 1_000, {}, weight=1)):
        pipeline = release_pipeline(
            None if leaving else "w",
            successor,
            WRITER,
            fair=fair,
            successor_first=True,
            leaving=["gone"] if leaving else (),
        )
        assert not _unbounded_growing_reductions(pipeline)
    # The walk reads stages encoded already (the pipelines' fixed stages are: requests.encoded_once).
    growing = {"$reduce": {"input": "$queue", "initialValue": [], "in": {"$concatArrays": ["$$value", ["$$this"]]}}}
    assert _unbounded_growing_reductions([RawBSONDocument(bson.encode({"$set": {"grown": growing}}))])
