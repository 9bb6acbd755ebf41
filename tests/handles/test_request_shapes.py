"""Every request the library sends on its hot paths names its lock document by ``_id``.

Recorded with command monitoring (``pymongo.monitoring.CommandListener``) on real requests to the
session's server, for a lock, a semaphore and a read-write lock: acquire (a free name, a held one,
where the waiter's place is queued, and the claim of a lease handed to it), release (with a waiter:
the hand-off; without), withdrawal (a waiter giving up), renewal (one lease, ``update_one``; many
leases of one process, the keeper's ``bulk_write`` chunks and the read-back ``find`` of what a chunk
renewed), the refresh of a queued place and the transaction guard. Each lock-document request must
carry an ``_id`` equality (or ``_id: {$in: [...]}``) at the top of its filter: ``findAndModify``'s
``query``, each ``update`` statement's ``q``, ``find``'s ``filter``, an ``aggregate``'s first
``$match``. Any command name outside the known set fails the test, so a new kind of request cannot
slip in unnoticed; the exceptions (``EXCEPTIONS``) say why each is bounded.

Why an ``_id`` equality keeps a request's cost flat on MongoDB whatever the collection's size (read
in mongodb/mongo, recent revisions):

- ``isSimpleIdQuery`` (src/mongo/db/query/query_utils.cpp) accepts a query whose only field is
  ``_id``, compared for equality (``{_id: v}`` or ``{_id: {$eq: v}}``). For an update and a
  ``findAndModify``, ``ParsedUpdateBase::parseQuery``
  (src/mongo/db/query/write_ops/parsed_update_base.cpp) then skips canonicalisation, and
  ``getExecutorUpdate`` (src/mongo/db/query/get_executor.cpp) answers it without the planner: the
  express executor (``makeExpressExecutorForUpdate``) for a plain update, and
  ``InternalPlanner::updateWithIdHack`` (an ``IDHackStage`` under the ``UpsertStage``) for an
  upsert; when the request has a projection (our ``findAndModify``s return a few ``fields``) it
  canonicalises the query (``parseQueryToCQ``) and ``ClassicPrepareExecutionHelper::buildIdHackPlan``
  (same file) still builds an ``IDHackStage`` when ``isIdHackEligibleQuery``
  (src/mongo/db/query/query_utils.h) holds, before any plan cache or planning. The update's
  pipeline is parsed apart from the query (``ParsedUpdateBase::parseUpdate``, via ``UpdateDriver``),
  so a pipeline update takes the same path as a modifier update.
- With other predicates beside the ``_id`` equality (``{_id: name, owner: token}``, an ``$or`` of
  owner fields, ``holders: {$elemMatch: ...}``), the query goes to the planner:
  ``QueryPlannerIXSelect::rateIndices`` (src/mongo/db/query/planner_ixselect.cpp) tags every
  bounds-generating predicate with the indexes on its path, so the ``_id`` equality is answered by
  the ``_id`` index, and ``QueryPlanner::plan`` (src/mongo/db/query/query_planner.cpp) adds a
  collection scan only when no indexed solution exists (``collScanRequired = 0 == out.size()``).
  The library indexes none of the other fields (its one optional index, the idle cleanup's, is on
  ``expiresAt``, which no filter names), so the one solution reads the ``_id`` index's single key,
  the other predicates a filter on the fetched document.
- ``_id: {$in: [...]}`` (the renewal read-back) is answered by the same index, one point per name:
  ``Indexability::nodeCanUseIndexOnOwnField`` (src/mongo/db/query/indexability.h) lists ``EQ`` and
  ``MATCH_IN`` among the predicates an index on their own field serves (read in an older revision;
  master delegates to ``isIndexOnOwnFieldTypeNode``, not read).

The embedded server cannot show any of this: its ``findAndModify`` scans the collection (see
docs/testing.md). This test checks what we send; the citations say what MongoDB does with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from pymongo import monitoring

from mongolock_async import AsyncMongoLock, AsyncMongoRWLock, AsyncMongoSemaphore
from mongolock_async._runtime import keeper
from mongolock_async.admin import operations  # what the `mongolock` command calls
from mongolock_async.store import reports
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.sessions import transaction

# The commands that read or write lock documents, and where each keeps its filters.
DOCUMENT_REQUESTS = {"findAndModify", "update", "find", "aggregate"}

# The commands that are not requests for lock documents, and why each is bounded: none is sent per
# acquire, release or renewal.
EXCEPTIONS = {
    "aggregate with $changeStream": "the wake-up stream: one per process and collection, opened only "
    "once someone has to wait (DESIGN: shared per collection and process), never per request",
    "getMore": "on a change stream's cursor only: one outstanding per stream, each waiting up to "
    "maxAwaitTimeMS; the listing's batches are checked apart (test_operator_reads)",
    "killCursors": "closes a change stream's cursor (the last waiter of the process is gone)",
    "ping": "the server-version check: once per client (sending.check_server)",
    "commitTransaction": "ends the caller's own transaction around the guard: one per transaction",
    "endSessions": "the driver's goodbye when a client closes",
}
NOT_DOCUMENT_REQUESTS = {"getMore", "killCursors", "ping", "commitTransaction", "endSessions"}


@dataclass
class Recorder(monitoring.CommandListener):
    """Every command a client starts, and the cursors its change streams opened."""

    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stream_cursors: set[int] = field(default_factory=set)
    _streams_pending: set[int] = field(default_factory=set)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        command = copy.deepcopy(dict(event.command))
        self.commands.append((event.command_name, command))
        if is_change_stream(event.command_name, command):
            self._streams_pending.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self._streams_pending:
            self._streams_pending.discard(event.request_id)
            self.stream_cursors.add(event.reply["cursor"]["id"])

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._streams_pending.discard(event.request_id)

    def names(self) -> Counter[str]:
        return Counter(name for name, _ in self.commands)


def is_change_stream(name: str, command: Mapping[str, Any]) -> bool:
    pipeline = command.get("pipeline") if name == "aggregate" else None
    return isinstance(pipeline, list) and bool(pipeline) and "$changeStream" in pipeline[0]


def id_match(query: Any) -> str | None:
    """How ``query`` names documents by ``_id`` at its top level: ``"eq"``, ``"in"``, or None (it
    does not, or not by equality: a range, a regex, an operator inside ``$or``)."""
    if not isinstance(query, Mapping) or "_id" not in query:
        return None
    value = query["_id"]
    if isinstance(value, Mapping) and any(str(key).startswith("$") for key in value):
        if set(value) == {"$eq"} and not isinstance(value["$eq"], Mapping):
            return "eq"
        if set(value) == {"$in"} and isinstance(value["$in"], list):
            return "in"
        return None
    return "eq"


def document_filters(name: str, command: Mapping[str, Any]) -> list[Any]:
    """The filters of a lock-document request, as the server receives them."""
    if name == "findAndModify":
        return [command.get("query", {})]
    if name == "update":
        return [statement.get("q", {}) for statement in command["updates"]]
    if name == "find":
        return [command.get("filter", {})]
    if name == "aggregate":
        first = command["pipeline"][0] if command["pipeline"] else {}
        return [first.get("$match", {})]
    raise AssertionError(f"not a document request: {name}")


def problems_of(recorder: Recorder, collection: str) -> list[str]:
    """What breaks the rule in ``recorder``'s commands (empty: every one keeps it)."""
    problems = []
    for name, command in recorder.commands:
        if name == "aggregate" and is_change_stream(name, command):
            if command["aggregate"] != collection:
                problems.append(f"a change stream on {command['aggregate']!r}, not the lock collection")
            continue
        if name in ("getMore", "killCursors"):
            cursors = [command["getMore"]] if name == "getMore" else command["cursors"]
            if not set(cursors) <= recorder.stream_cursors:
                problems.append(f"{name} on a cursor that is not a change stream's: {command}")
            continue
        if name in NOT_DOCUMENT_REQUESTS:
            continue
        if name not in DOCUMENT_REQUESTS:
            problems.append(f"unknown command {name!r} (add it to the known set with its bound): {command}")
            continue
        if command[name] != collection:
            problems.append(f"{name} on {command[name]!r}, not the lock collection")
        for query in document_filters(name, command):
            if id_match(query) is None:
                problems.append(f"{name} without an _id equality or $in in its filter: {query}")
    return problems


def shape(name: str, command: Mapping[str, Any]) -> str:
    """A request's shape for the table: command, filter keys (``_id`` how), upsert, pipeline."""

    def keys(query: Mapping[str, Any]) -> str:
        named = [f"_id:{id_match(query)}" if key == "_id" else key for key in query]
        return "{" + ", ".join(named) + "}"

    if is_change_stream(name, command):
        return "aggregate $changeStream"
    if name == "findAndModify":
        upsert = " upsert" if command.get("upsert") else ""
        kind = " pipeline" if isinstance(command.get("update"), list) else ""
        return f"findAndModify {keys(command['query'])}{upsert}{kind}"
    if name == "update":
        statements = command["updates"]
        first = statements[0]
        upsert = " upsert" if first.get("upsert") else ""
        kind = " pipeline" if isinstance(first.get("u"), list) else ""
        return f"update x{len(statements)} {keys(first['q'])}{upsert}{kind}"
    if name in ("find", "aggregate"):
        return f"{name} {keys(document_filters(name, command)[0])}"
    return name


def shapes(recorder: Recorder) -> set[str]:
    return {shape(name, command) for name, command in recorder.commands}


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for ``condition`` (polled), failing the test with ``what`` after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def monitored(driver: str, uri: str, collection: Any) -> AsyncIterator[tuple[Any, Recorder]]:
    """The lock collection through a client of its own (one "process"), every command recorded."""
    recorder = Recorder()
    client = make_client(driver, uri, event_listeners=[recorder])
    try:
        yield client[TEST_DATABASE][collection.name], recorder
    finally:
        await close_client(client)


def assert_point_requests(recorder: Recorder, collection: Any) -> None:
    problems = problems_of(recorder, collection.name)
    assert not problems, "\n".join(problems)
    open_streams = 0
    for name, command in recorder.commands:
        if is_change_stream(name, command):
            open_streams += 1
            assert open_streams == 1, "a second change stream opened by one process on one collection"
        elif name == "killCursors":
            open_streams -= len(set(command["cursors"]) & recorder.stream_cursors)
    assert recorder.names()["ping"] <= 1, "the version check ran more than once on one client"


Handles = Callable[[Any], Any]

PRIMITIVES: dict[str, Handles] = {
    "lock": lambda collection: AsyncMongoLock(collection, "shapes", ttl=10.0),
    "semaphore": lambda collection: AsyncMongoSemaphore(collection, "shapes", 1, ttl=10.0),
    "rwlock": lambda collection: AsyncMongoRWLock(collection, "shapes", ttl=10.0).write(),
}


@pytest.mark.parametrize("primitive", sorted(PRIMITIVES))
async def test_acquire_release_hand_off_and_withdrawal_name_their_document(
    primitive: str, mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """Two processes (clients): one holds, the other waits with its place queued, is handed the
    lease at the release and claims it; later it waits again and gives up (withdrawal)."""
    make = PRIMITIVES[primitive]
    async with (
        monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (first, first_recorder),
        monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (second, second_recorder),
    ):
        holder = make(first)
        assert await holder.acquire()  # a free name: the upserting acquire
        waiter = make(second)
        waiting = asyncio.ensure_future(waiter.acquire(timeout=20.0))
        await until(lambda: bool(second_recorder.stream_cursors) and second_recorder.names()["findAndModify"] >= 1,
                    "the waiter's queued place and its change stream")  # fmt: skip
        assert await make(second).locked()  # a read of the lock's state (aggregate, $match by _id)
        assert await holder.release()  # the hand-off to the waiter's place
        assert await waiting  # the waiter's claim
        assert await waiter.release()  # nobody waits: a plain release

        assert await holder.acquire()
        giving_up = make(second)
        before = second_recorder.names()["update"]
        assert not await giving_up.acquire(timeout=0.5)
        await until(lambda: second_recorder.names()["update"] > before, "the withdrawal of the place")
        assert await holder.release()

    for recorder in (first_recorder, second_recorder):
        assert_point_requests(recorder, mongolock_collection)
    seen = shapes(first_recorder) | shapes(second_recorder)
    acquires = {shape for shape in seen if shape.startswith("findAndModify {_id:eq} upsert pipeline")}
    releases = {shape for shape in seen if shape.startswith("findAndModify {_id:eq, $or} pipeline")}
    withdrawals = {shape for shape in seen if shape.startswith("update x1 {_id:eq} upsert pipeline")}
    assert acquires and releases and withdrawals, seen
    assert any(shape.startswith("aggregate {_id:eq") for shape in seen), seen
    assert "aggregate $changeStream" in seen


@pytest.mark.timing(margin=2.5)  # 4 s leases renewed every second
async def test_renewals_and_their_read_back_name_their_documents(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One lease extended (``update_one``); five leases of one process renewed by the keeper in
    chunks (of two here: ``RENEWAL_CHUNK`` is 100); one of them broken by an operator, so that its
    chunk renews fewer than it sent and reads back what it renewed (``_id: {$in: [...]}``)."""
    monkeypatch.setattr(keeper, "RENEWAL_CHUNK", 2)
    async with monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (collection, recorder):
        single = AsyncMongoLock(collection, "extended", ttl=10.0)
        assert await single.acquire()
        await single.extend()
        assert await single.release()

        names = [f"leased-{index}" for index in range(5)]
        leases = [AsyncMongoLock(collection, name, ttl=4.0, heartbeat=1.0) for name in names]
        for lease in leases:
            assert await lease.acquire()

        def chunks() -> list[int]:
            return [len(command["updates"]) for name, command in recorder.commands if name == "update"]

        await until(lambda: chunks().count(2) >= 4, "two rounds of renewals in chunks of two")
        broken = await operations.inspect_lock(mongolock_collection, names[0])
        assert broken is not None
        await operations.force_release(mongolock_collection, names[0], holder=broken.holders[0].owner)
        await until(lambda: leases[0].lost.is_set(), "the broken lease to be found lost")
        for lease in leases[1:]:
            assert await lease.release()

    assert_point_requests(recorder, mongolock_collection)
    seen = shapes(recorder)
    assert "update x1 {_id:eq, owner} pipeline" in seen  # extend
    assert "update x2 {_id:eq, owner} pipeline" in seen  # a chunk of the keeper's
    assert "find {_id:in, $or}" in seen  # the read-back of a chunk that renewed fewer than it sent


@pytest.mark.timing(margin=2.5)  # a 4 s permit renewed every second
async def test_places_semaphore_renewal_and_guard_name_their_documents(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """A semaphore's permit renewed by its heartbeat, a queued place refreshed by the keeper while
    its waiter waits, and the transaction guard."""
    async with (
        monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (first, first_recorder),
        monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (second, second_recorder),
    ):
        holder = AsyncMongoSemaphore(first, "permits", 1, ttl=4.0, heartbeat=1.0)
        assert await holder.acquire()
        waiter = AsyncMongoSemaphore(second, "permits", 1, ttl=4.0)
        waiting = asyncio.ensure_future(waiter.acquire(timeout=20.0))
        await until(lambda: first_recorder.names()["update"] >= 2 and second_recorder.names()["update"] >= 1,
                    "the permit's renewals and the place's refresh")  # fmt: skip
        assert await holder.release()
        assert await waiting
        assert await waiter.release()

        guarded = AsyncMongoLock(first, "guarded", ttl=10.0)
        assert await guarded.acquire()
        async with transaction(first.database.client) as session:
            await guarded.guard_transaction(session)
        assert await guarded.release()

    for recorder in (first_recorder, second_recorder):
        assert_point_requests(recorder, mongolock_collection)
    seen = shapes(first_recorder) | shapes(second_recorder)
    assert "update x1 {_id:eq, kind, holders.o} pipeline" in seen  # the permit's renewal
    assert "update x1 {_id:eq, queue.t} pipeline" in seen  # the place's refresh
    assert "findAndModify {_id:eq, owner, fence} pipeline" in seen  # the guard
    assert first_recorder.names()["commitTransaction"] == 1


async def test_operator_reads_are_bounded(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """``mongolock list`` (``iterate_locks``) scans by design: in ``_id`` order, a batch of
    ``reports.ITERATE_BATCH`` at a time, from ``--after`` on and up to ``--limit``; its clock is
    ``hello``. ``inspect`` (``inspect_lock``) reads one document, by ``_id``. ``list_locks`` reads
    them all in one aggregate."""
    async with monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (collection, recorder):
        await collection.insert_many([{"_id": f"listed-{index:04}"} for index in range(ITERATE_DOCUMENTS)])
        recorder.commands.clear()
        listed = [info.name async for info in operations.iterate_locks(collection)]
        assert len(listed) == ITERATE_DOCUMENTS
        page = [info.name async for info in operations.iterate_locks(collection, after="listed-0009", limit=5)]
        assert page == [f"listed-{index:04}" for index in range(10, 15)]
        listing = list(recorder.commands)
        recorder.commands.clear()
        assert (await operations.inspect_lock(collection, "listed-0003")) is not None
        inspecting = list(recorder.commands)
        recorder.commands.clear()
        assert len(await operations.list_locks(collection)) == ITERATE_DOCUMENTS
        listing_whole = list(recorder.commands)

    finds = [command for name, command in listing if name == "find"]
    assert [command["filter"] for command in finds] == [{}, {"_id": {"$gt": "listed-0009"}}]
    for command in finds:
        assert command["sort"] == {"_id": 1}
        assert command["batchSize"] == reports.ITERATE_BATCH
    assert finds[1]["limit"] == 5
    more = [command for name, command in listing if name == "getMore"]
    assert more and all(command["batchSize"] == reports.ITERATE_BATCH for command in more)
    assert {name for name, _ in listing} <= {"find", "getMore", "hello", "ping"}
    assert [name for name, _ in inspecting] == ["aggregate"]
    assert id_match(document_filters("aggregate", inspecting[0][1])[0]) == "in"
    # ``list_locks`` (the API's all-at-once listing, not the command's) reads the whole collection
    # in one aggregate, in ``_id`` order: unbounded by design, for callers that want every lock.
    whole = [command for name, command in listing_whole if name == "aggregate"]
    assert len(whole) == 1 and whole[0]["pipeline"][:2] == [{"$match": {}}, {"$sort": {"_id": 1}}]


# Enough documents for the listing to need more than one batch.
ITERATE_DOCUMENTS = reports.ITERATE_BATCH + 50


def test_the_checker_flags_a_filter_without_its_id() -> None:
    """The control: the same check rejects what the rule forbids."""
    recorder = Recorder()
    good = {"findAndModify": "locks", "query": {"_id": "a", "owner": "t"}, "update": [{"$set": {}}]}
    recorder.commands.append(("findAndModify", good))
    assert problems_of(recorder, "locks") == []
    cases: Iterable[tuple[str, dict[str, Any]]] = [
        ("findAndModify", {"findAndModify": "locks", "query": {"owner": "t"}, "update": [{"$set": {}}]}),
        ("findAndModify", {"findAndModify": "locks", "query": {"$or": [{"_id": "a"}]}, "update": []}),
        ("update", {"update": "locks", "updates": [{"q": {"_id": "a"}}, {"q": {"owner": "t"}}]}),
        ("find", {"find": "locks", "filter": {"_id": {"$gte": "a"}}}),
        ("aggregate", {"aggregate": "locks", "pipeline": [{"$match": {}}]}),
        ("count", {"count": "locks", "query": {"_id": "a"}}),
        ("getMore", {"getMore": 42, "collection": "locks"}),
    ]
    for name, command in cases:
        recorder = Recorder(commands=[(name, command)])
        assert problems_of(recorder, "locks"), f"not flagged: {name} {command}"


async def test_the_checker_flags_a_recorded_request_without_its_id(
    mongolock_driver: str, mongolock_uri: str, mongolock_collection: Any
) -> None:
    """The control on real traffic: a recorded acquire passes and fails once its ``_id`` is taken
    out; a raw ``find_one_and_update({"owner": ...})`` through a monitored client is flagged."""
    async with monitored(mongolock_driver, mongolock_uri, mongolock_collection) as (collection, recorder):
        lock = AsyncMongoLock(collection, "control", ttl=10.0)
        assert await lock.acquire()
        assert await lock.release()
        assert problems_of(recorder, collection.name) == []
        acquire = next(command for name, command in recorder.commands if name == "findAndModify")
        stripped = copy.deepcopy(acquire)
        del stripped["query"]["_id"]
        assert problems_of(Recorder(commands=[("findAndModify", stripped)]), collection.name)

        recorder.commands.clear()
        await collection.find_one_and_update({"owner": "someone"}, {"$set": {"owner": None}})
        assert [name for name, _ in recorder.commands] == ["findAndModify"]
        assert problems_of(recorder, collection.name)
