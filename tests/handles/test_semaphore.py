"""AsyncMongoSemaphore: never more than ``limit`` holders, across OS processes and tasks, with the
lock's promises (server time, owner-only release, rising fencing tokens, heartbeat, loss).

A holder's section is what it believed the way the library promises it (``belief.Belief``: from
an entry observed while its permit's lease was live, to its exit or that lease's local deadline),
so no pause can make a correct semaphore show more than ``limit`` at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from datetime import datetime
from typing import Any

import bson
import pytest
from bson import Decimal128
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore, LockDataError, LockLostError
from mongolock_async.store import LockStore, Permits, PlaceRequest
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.commands import CommandCounter
from tests.support.overlap import most_at_once
from tests.support.permits import expire_every_permit
from tests.support.processes import WORKERS, run_workers
from tests.workers.belief import Belief, release_as_promised

WORKER = WORKERS / "semaphore_worker.py"
PROCESSES, TASKS, LIMIT, SECONDS = 4, 6, 3, 4.0
Section = tuple[float, float, int, float]
"""(entered, left, fencing token, when its acquire began), on the machine's monotonic clock."""


def test_the_detector_counts_holders_at_once() -> None:
    assert most_at_once([(0.0, 1.0, 1, 0.0), (1.0, 2.0, 2, 0.0), (1.5, 3.0, 3, 0.0)]) == 2
    assert most_at_once([(0.0, 5.0, 1, 0.0), (1.0, 2.0, 2, 0.0), (1.5, 3.0, 3, 0.0)]) == 3


def run_contention(uri: str, kind: str) -> list[Section]:
    collection = f"semaphore_{kind}_{uuid.uuid4().hex[:8]}"
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    arguments = [uri, TEST_DATABASE, collection, kind, str(LIMIT), str(TASKS), str(SECONDS), str(start_at)]
    sections: list[Section] = []
    for out in run_workers(WORKER, arguments, PROCESSES):
        assert out, "every process held a permit at least once"
        sections += [tuple(json.loads(line)) for line in out]  # type: ignore[misc]
    return sections


@pytest.mark.safety
@pytest.mark.parametrize("kind", ["real", "fair", "broken"])
def test_never_more_than_limit_holders_across_processes(mongolock_uri: str, kind: str) -> None:
    sections = run_contention(mongolock_uri, kind)
    assert len(sections) >= 40, f"too little contention to judge ({len(sections)} sections)"
    peak = most_at_once(sections)
    if kind == "broken":
        assert peak > LIMIT, f"the detector found at most {peak} holders at once in a broken semaphore"
        return
    assert peak <= LIMIT, f"{peak} holders at once, limit {LIMIT}"
    assert peak >= 2, "the permits were used in parallel"
    # A permit's token is above the token of every section that ended before its acquire began
    # (a permit handed to a waiting place can be entered after later permits were used and ended).
    assert len({section[2] for section in sections}) == len(sections), "two permits had one token"
    for _, _, token, asked in sections:
        before = [earlier[2] for earlier in sections if earlier[1] < asked]
        assert not before or token > max(before), "a fencing token went down"


async def test_permits_are_handed_on_and_tokens_rise(mongolock_collection: Any) -> None:
    first, second, third = (AsyncMongoSemaphore(mongolock_collection, "pool", 2, ttl=10.0) for _ in range(3))
    assert await first.acquire(blocking=False) and await second.acquire(blocking=False)
    assert await first.locked(), "every permit is taken"
    assert not await third.acquire(blocking=False)
    waiting = asyncio.create_task(third.acquire(timeout=10))
    await asyncio.sleep(0.3)
    assert await first.release()
    assert await waiting, "the freed permit reached the waiting task"
    assert first.fencing_token is None and third.fencing_token is not None and second.fencing_token is not None
    assert third.fencing_token > second.fencing_token
    assert await third.owned() and not await first.owned()
    assert not await first.release(), "a permit is released once"
    assert await second.release() and await third.release()
    doc = await mongolock_collection.find_one({"_id": "pool"})
    assert doc["holders"] == [] and doc["kind"] == "semaphore" and doc["limit"] == 2


@pytest.mark.timing(margin=1.3)  # the dead permit must still be live at the first attempt (1.35 s)
async def test_a_dead_holders_permit_is_taken_after_its_ttl(mongolock_collection: Any) -> None:
    # A TTL that a slow round trip cannot eat (an answer past the local deadline is no lease): with
    # 0.5 s, the rehearsed access-control job's one busy embedded server answered too late once.
    dead = AsyncMongoSemaphore(mongolock_collection, "expiring", 1, ttl=1.5)
    assert await dead.acquire(blocking=False)
    token = dead.fencing_token
    assert token is not None
    dead._forget_lease()  # the holder stops without releasing, as a killed process would
    other = AsyncMongoSemaphore(mongolock_collection, "expiring", 1, ttl=10.0)
    assert not await other.acquire(blocking=False)
    assert await other.acquire(timeout=5), "the expired permit was taken over"
    assert other.fencing_token is not None and other.fencing_token > token
    assert await other.release()


@pytest.mark.timing(margin=2.2)  # a renewal every 0.5 s, each lease ending 2.7 s after its send
async def test_the_heartbeat_keeps_a_permit_and_its_loss_cancels_the_block(mongolock_collection: Any) -> None:
    # A 3 s TTL renewed every 0.5 s: over 2 s for a renewal's round trip. At 1 s and 0.3 s (0.6 s
    # for it), a fresh clone's make test in 8 workers lost the permit on a loaded machine.
    semaphore = AsyncMongoSemaphore(mongolock_collection, "kept", 2, ttl=3.0, heartbeat=0.5)
    async with semaphore:
        await asyncio.sleep(6.0)  # two TTLs
        assert await semaphore.owned()
    with pytest.raises(LockLostError):
        async with semaphore:
            # An operator takes every permit away; the next renewal finds ours gone.
            await mongolock_collection.update_one({"_id": "kept"}, {"$set": {"holders": []}})
            await asyncio.sleep(5)
            pytest.fail("the block ran on after its permit was lost")


async def test_a_lowered_limit_revokes_nobody_and_holds_new_holders_back(mongolock_collection: Any) -> None:
    held = [AsyncMongoSemaphore(mongolock_collection, "shrinking", 3, ttl=10.0) for _ in range(3)]
    for semaphore in held:
        assert await semaphore.acquire(blocking=False)
    smaller = AsyncMongoSemaphore(mongolock_collection, "shrinking", 2, ttl=10.0)
    assert not await smaller.acquire(blocking=False)
    assert all([await semaphore.owned() for semaphore in held]), "no holder was revoked"
    assert await held[0].release()
    assert not await smaller.acquire(blocking=False), "two held: not under the new limit of 2"
    assert await held[1].release()
    assert await smaller.acquire(blocking=False)
    assert await held[2].release() and await smaller.release()


@pytest.mark.safety
async def test_many_tasks_never_exceed_the_limit(mongolock_collection: Any) -> None:
    sections: list[tuple[float, float]] = []

    async def worker() -> None:
        semaphore = AsyncMongoSemaphore(mongolock_collection, "tasks", 3, ttl=10.0)
        for _ in range(4):
            belief = Belief(semaphore)
            with contextlib.suppress(LockLostError):  # a loss ends what it believed: its section
                async with semaphore:
                    belief.holds()
                    await asyncio.sleep(0.05)
                    belief.leaves()
            belief.leaves()
            if belief.section is not None:
                sections.append(belief.section)

    await asyncio.gather(*(worker() for _ in range(12)))
    peak = most_at_once(sections)
    assert 2 <= peak <= 3, f"{peak} holders at once, limit 3"


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ValueError), (-1, ValueError), (10_001, ValueError), (True, TypeError), (1.5, TypeError), ("3", TypeError)],
)
async def test_hostile_limits_are_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter, limit: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="limit"):
        AsyncMongoSemaphore(counted_collection, "bad", limit)
    assert command_counter.names == []


@pytest.mark.parametrize(
    "edit",
    [
        {"holders": "everyone"},
        {"holders": [{"o": "x", "fence": 1}]},
        {"holders": [{"o": 7, "exp": "soon", "fence": 1}]},
        {"limit": "3"},
        {"kind": "barrier"},
    ],
    ids=["holders-not-array", "holder-without-expiry", "holder-malformed", "limit-string", "unknown-kind"],
)
async def test_documents_edited_by_hand_are_refused(mongolock_collection: Any, edit: dict[str, Any]) -> None:
    semaphore = AsyncMongoSemaphore(mongolock_collection, "edited", 1, ttl=10.0)
    assert await semaphore.acquire(blocking=False)
    await mongolock_collection.update_one({"_id": "edited"}, {"$set": edit})
    other = AsyncMongoSemaphore(mongolock_collection, "edited", 5, ttl=10.0)
    with pytest.raises(LockDataError):
        await other.acquire(blocking=False)
    doc = await mongolock_collection.find_one({"_id": "edited"})
    assert {key: doc[key] for key in edit} == edit, "nothing was written to the edited document"


async def test_a_name_is_a_lock_or_a_semaphore(mongolock_collection: Any) -> None:
    semaphore = AsyncMongoSemaphore(mongolock_collection, "one-kind", 2, ttl=10.0)
    assert await semaphore.acquire(blocking=False)
    with pytest.raises(LockDataError, match="semaphore, not a lock"):
        await AsyncMongoLock(mongolock_collection, "one-kind", ttl=10.0).acquire(blocking=False)
    assert await semaphore.release()
    lock = AsyncMongoLock(mongolock_collection, "other-kind", ttl=10.0)
    assert await lock.acquire(blocking=False)
    with pytest.raises(LockDataError, match="lock, not a semaphore"):
        await AsyncMongoSemaphore(mongolock_collection, "other-kind", 2, ttl=10.0).acquire(blocking=False)
    assert await lock.release()


@pytest.mark.safety
async def test_tokens_rise_across_release_expiry_force_release_and_purge(
    mongolock_collection: Any, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    tokens: list[int] = []

    async def take() -> AsyncMongoSemaphore:
        # Each acquire finds a permit free: the timeout only bounds a server that does not answer.
        semaphore = AsyncMongoSemaphore(mongolock_collection, "fenced", 2, ttl=10.0)
        assert await semaphore.acquire(timeout=30)
        assert semaphore.fencing_token is not None
        tokens.append(semaphore.fencing_token)
        return semaphore

    await release_as_promised(await take())  # released
    expiring = await take()
    expiring._forget_lease()  # never released: expires (set by hand: a pause cannot stretch or end it early)
    await expire_every_permit(mongolock_collection, "fenced")
    held = await take()
    forced = await store.force_release("fenced")  # an operator breaks it
    assert forced is not None and [permit[2] for permit in forced.permits] == tokens[-1:]
    held._forget_lease()
    held = await take()
    held._forget_lease()
    # Purged by the idle-cleanup index (which the server runs; the test's user may not delete).
    mongolock_admin_client[TEST_DATABASE][mongolock_collection.name].delete_one({"_id": "fenced"})
    await asyncio.sleep(0.01)
    await take()
    assert tokens == sorted(set(tokens)), f"fencing tokens went down: {tokens}"


@pytest.mark.safety
async def test_a_late_release_hands_no_permit_to_a_token_that_is_done(mongolock_collection: Any) -> None:
    # A release of this process names its first waiter's place as the successor. If that waiter
    # took a permit by its own attempt meanwhile, and already returned it (or gave up waiting), a
    # release arriving late must not hand it a permit: nobody would use it until it expired.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    permits = Permits("semaphore", 2)
    holder = {"host": "test", "pid": 1, "label": None}
    assert (await store.try_acquire("late", "held", 10_000, holder, permits=permits)).holds("held")
    assert (await store.try_acquire("late", "done", 10_000, holder, permits=permits)).holds("done")
    assert await store.release("late", "done", permits=permits) is not None
    await store.leave("late", ["gave-up"], fair=False, permits=permits)
    for finished in ("done", "gave-up"):
        releasing = f"releasing-to-{finished}"  # a token, like every one, never used again once released
        assert (await store.try_acquire("late", releasing, 10_000, holder, permits=permits)).holds(releasing)
        successor = PlaceRequest(finished, 10_000, holder)
        state = await store.release("late", releasing, successor=successor, permits=permits)
        assert state is not None and not state.holds(finished), f"a permit went to {finished!r}, which is done"
        assert state.queue == (), "nor does it wait in the queue"


@pytest.mark.safety
async def test_a_hand_off_names_one_place_only_when_one_permit_went(mongolock_collection: Any) -> None:
    # A waiting process takes a hand-off to its one place with the document's fence as its token,
    # without a claim. So when a release hands permits to another process's place and to a place
    # of its own in one write, the change must name both: else the other process would take the
    # fence of the releaser's successor as its own.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    permits = Permits("semaphore", 3)
    holder = {"host": "test", "pid": 1, "label": None}
    for owner in ("a", "b", "c"):
        assert (await store.try_acquire("both", owner, 10_000, holder, permits=permits)).holds(owner)
    queued = await store.try_acquire("both", "z", 10_000, holder, enqueue=True, fair=True, permits=permits)
    assert queued.place_of("z") is not None
    # c's permit expires (set by hand: a 0.3 s TTL ran out before z queued on a loaded machine), so
    # b's release frees two.
    expired = await mongolock_collection.update_one(
        {"_id": "both"}, {"$set": {"holders.$[c].exp": datetime(2000, 1, 1)}}, array_filters=[{"c.o": "c"}]
    )
    assert expired.modified_count == 1
    successor = PlaceRequest("s", 10_000, holder)
    state = await store.release("both", "b", successor=successor, fair=True, permits=permits)
    assert state is not None and state.holds("z") and state.holds("s")
    doc = await mongolock_collection.find_one({"_id": "both"})
    assert sorted(doc["handedOffTo"].split(" ")) == ["s", "z"], doc["handedOffTo"]
    assert state.fence_of("z") != state.fence_of("s")


# A fence edited by hand into what $toLong cannot convert: NaN, a string, an object, a double above
# 2**63 (and a numeric string, which it can, but which is not a token either).
HAND_EDITED_FENCES = [math.nan, "twelve", {"n": 12}, 1e19, Decimal128("1e30"), "12"]


@pytest.mark.parametrize("mongolock_driver", ["pymongo"])  # the store's pipelines, whatever the driver
@pytest.mark.parametrize("fence", HAND_EDITED_FENCES, ids=["nan", "string", "object", "double-2e63", "decimal", "12"])
@pytest.mark.parametrize("permits", [Permits("semaphore", 2), Permits("rwlock", 10_000), Permits("election", 1)])
async def test_a_hand_edited_fence_changes_nothing_and_is_named(
    mongolock_collection: Any, permits: Permits, fence: Any
) -> None:
    # The permits' pipelines computed the next fence ($toLong of the stored one) before they knew
    # the document was sane: the server failed the request with a conversion error (a raw
    # OperationFailure) instead of changing nothing and letting LockDataError name the field.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    assert (await store.try_acquire("edited", "holder", 30_000, {}, permits=permits)).holds("holder")
    await mongolock_collection.update_one({"_id": "edited"}, {"$set": {"fence": fence}})
    before = await mongolock_collection.find_one({"_id": "edited"})
    with pytest.raises(LockDataError, match="fence"):
        await store.try_acquire("edited", "newcomer", 30_000, {}, enqueue=True, permits=permits)
    with pytest.raises(LockDataError, match="fence"):
        await store.release("edited", "holder", permits=permits)
    await store.leave("edited", ["newcomer"], fair=True, permits=permits)  # a withdrawal: no error, no change
    after = await mongolock_collection.find_one({"_id": "edited"})
    assert bson.encode(after) == bson.encode(before), "the edited document was written"
