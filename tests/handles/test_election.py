"""AsyncMongoElection: one leader at a time across OS processes, terms that only go up, hand-over
on resignation, failover when the leader dies, and the lock's promises (loss cancels the work,
arguments checked before I/O, documents of another kind refused).

The safety tests judge a leader by what its handle says (``tests/workers/belief.py``): it leads
from a moment observed while its lease was live to its work's end or that lease's local deadline,
and a new leader beside it counts only while it still says it leads; the failover's bound is the
old term's expiry as the server reported it. No pause can make a correct election fail them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoElection,
    AsyncMongoLock,
    AsyncMongoSemaphore,
    Leadership,
    LockDataError,
    LockManager,
    LockTimeoutError,
)
from mongolock_async.fencing import fenced_update_one
from mongolock_async.store import LockStore
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point
from tests.support.overlap import most_at_once
from tests.support.permits import expire_every_permit
from tests.support.processes import ROOT, WORKERS, run_workers
from tests.support.run_settings import child_environment
from tests.workers.belief import Belief, believes, release_as_promised

pytestmark = pytest.mark.one_driver  # above the requests: the drivers never differ here

WORKER = WORKERS / "election_worker.py"
PROCESSES, CANDIDATES, SECONDS = 4, 3, 4.0
Term = tuple[float, float, int, int]
"""(entered, left, term, pid), on the machine's monotonic clock."""


async def candidates_waiting(election: AsyncMongoElection, count: int) -> Leadership:
    """Wait until ``count`` candidates' places are stored behind the leader, as ``leader()`` reports;
    return that report."""
    while (seen := await election.leader()) is None or seen.candidates < count:  # noqa: ASYNC110 - polls the server
        await asyncio.sleep(0.01)
    return seen


def run_contention(uri: str, kind: str) -> list[Term]:
    collection = f"election_{kind}_{uuid.uuid4().hex[:8]}"
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    arguments = [uri, TEST_DATABASE, collection, kind, str(CANDIDATES), str(SECONDS), str(start_at)]
    terms: list[Term] = []
    for out in run_workers(WORKER, arguments, PROCESSES):
        assert out, "every process led at least once"
        terms += [tuple(json.loads(line)) for line in out]
    return terms


@pytest.mark.safety
@pytest.mark.parametrize("kind", ["contend", "broken"])
def test_never_two_leaders_across_processes(mongolock_uri: str, kind: str) -> None:
    terms = run_contention(mongolock_uri, kind)
    assert len(terms) >= 30, f"too few terms to judge ({len(terms)})"
    peak = most_at_once(terms)
    if kind == "broken":
        assert peak > 1, "the detector found no two leaders at once in a broken election"
        return
    assert peak == 1, f"{peak} leaders at once"
    by_entry = sorted(terms)
    assert [term for _, _, term, _ in by_entry] == sorted({term for _, _, term, _ in terms}), (
        "terms do not rise strictly with each new leader"
    )


async def test_a_resignation_hands_leadership_to_the_next_candidate_at_once(
    mongolock_driver: str, mongolock_uri: str
) -> None:
    # Two clients stand for two processes. A TTL of 60 s: a hand-over by expiry would miss the
    # follower's 20 s campaign timeout, so leading within it means the resignation handed it over.
    collection = f"election_{uuid.uuid4().hex[:8]}"
    clients = [make_client(mongolock_driver, mongolock_uri) for _ in range(2)]
    try:
        first, second = (
            AsyncMongoElection(client[TEST_DATABASE][collection], "scheduler", ttl=60.0, label=label)
            for client, label in zip(clients, ("first", "second"), strict=True)
        )
        assert await first.leader() is None, "nobody leads an election nobody campaigned in"
        first_term = await first.campaign(timeout=5)
        assert first.leading and first.term == first_term
        following = asyncio.create_task(second.campaign(timeout=20))
        seen = await candidates_waiting(second, 1)  # asked by a candidate that does not lead
        assert seen.term == first_term and seen.holder["label"] == "first"
        assert seen.holder["pid"] == os.getpid() and seen.candidates == 1 and 0 < seen.time_left <= 60
        assert not second.leading and second.term is None
        assert await first.resign()
        second_term = await following
        assert second_term > first_term and second.leading and not first.leading
        seen = await first.leader()
        assert seen is not None and seen.term == second_term and seen.holder["label"] == "second"
        assert seen.since is not None
        assert await second.resign()
        assert await first.leader() is None
    finally:
        for client in clients:
            await close_client(client)


@pytest.mark.safety
async def test_terms_rise_across_resignation_expiry_force_release_and_purge(
    mongolock_collection: Any, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    terms: list[int] = []

    async def win() -> AsyncMongoElection:
        # Each finds nobody leading: the timeout only bounds a server that does not answer.
        election = AsyncMongoElection(mongolock_collection, "terms", ttl=10.0)
        terms.append(await election.campaign(timeout=30))
        return election

    await release_as_promised(await win())  # a resignation
    expiring = await win()
    expiring._forget_lease()  # the leader dies: its term expires
    await expire_every_permit(mongolock_collection, "terms")  # by hand: no pause stretches or ends it early
    deposed = await win()
    forced = await store.force_release("terms")
    assert forced is not None and [permit[2] for permit in forced.permits] == terms[-1:]
    deposed._forget_lease()
    purged = await win()
    purged._forget_lease()
    # Purged by the idle-cleanup index (which the server runs; the test's user may not delete).
    mongolock_admin_client[TEST_DATABASE][mongolock_collection.name].delete_one({"_id": "terms"})
    await asyncio.sleep(0.01)
    await win()
    assert terms == sorted(set(terms)), f"terms went down: {terms}"


@pytest.mark.timing(margin=2.2)  # the first term must last until it is deposed: renewed every 0.5 s, 2.7 s each
async def test_lead_cancels_the_work_on_loss_and_starts_it_again_in_a_new_term(mongolock_collection: Any) -> None:
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    election = AsyncMongoElection(mongolock_collection, "worker", ttl=3.0, heartbeat=0.5)
    started: asyncio.Queue[int] = asyncio.Queue()
    cancelled: list[int] = []

    async def work(term: int) -> None:
        started.put_nowait(term)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(term)
            raise

    leading = asyncio.create_task(election.lead(work))
    first = await started.get()
    await store.force_release("worker")  # an operator deposes the leader
    async with asyncio.timeout(10):
        second = await started.get()
    assert cancelled == [first], "the first term's work was cancelled when its leadership was lost"
    assert second > first, "the work started again in a new, higher term"
    leading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leading
    assert cancelled == [first, second], "cancelling lead cancelled the work"
    assert await election.leader() is None, "cancelling lead resigned"


async def test_lead_returns_and_resigns_when_the_work_returns(mongolock_collection: Any) -> None:
    election = AsyncMongoElection(mongolock_collection, "once", ttl=10.0)
    seen: list[bool] = []

    async def work(term: int) -> None:
        seen.append(election.leading and election.term == term)

    await election.lead(work)
    assert seen == [True] and not election.leading
    assert await election.leader() is None


@pytest.mark.safety  # no hand-over to a candidate that is gone
async def test_a_cancelled_campaign_leaves_no_candidacy(mongolock_collection: Any) -> None:
    leader = AsyncMongoElection(mongolock_collection, "cancel", ttl=10.0)
    await leader.campaign()
    candidate = AsyncMongoElection(mongolock_collection, "cancel", ttl=10.0)
    campaigning = asyncio.create_task(candidate.campaign())
    await asyncio.sleep(0.3)
    campaigning.cancel()
    with pytest.raises(asyncio.CancelledError):
        await campaigning
    await release_as_promised(leader)  # a resignation
    assert await leader.leader() is None, "the resignation handed leadership to a withdrawn candidate"
    assert not candidate.leading


async def test_a_campaign_times_out_with_lock_timeout_error(mongolock_collection: Any) -> None:
    leader = AsyncMongoElection(mongolock_collection, "busy", ttl=10.0)
    await leader.campaign()
    with pytest.raises(LockTimeoutError, match=r"within 0\.3 s"):
        await AsyncMongoElection(mongolock_collection, "busy", ttl=10.0).campaign(timeout=0.3)
    assert await leader.resign()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"heartbeat": False}, ValueError, "heartbeat"),
        ({"fair": False}, TypeError, "fair"),
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": 3.0, "heartbeat": 2.0}, ValueError, "heartbeat"),
        ({"name": ""}, ValueError, "name"),
        ({"name": 7}, TypeError, "name"),
        ({"timeout": -1}, ValueError, "timeout"),
    ],
)
async def test_hostile_arguments_are_refused_before_any_io(
    counted_collection: Any,
    command_counter: CommandCounter,
    arguments: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    arguments = {"name": "job", **arguments}
    with pytest.raises(error, match=match):
        AsyncMongoElection(counted_collection, **arguments)
    assert command_counter.names == []


async def test_a_name_is_an_election_or_something_else(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "a-lock", ttl=10.0)
    assert await lock.acquire(blocking=False)
    with pytest.raises(LockDataError, match="a lock, not an election"):
        await AsyncMongoElection(mongolock_collection, "a-lock").campaign(timeout=1)
    with pytest.raises(LockDataError, match="a lock, not an election"):
        await AsyncMongoElection(mongolock_collection, "a-lock").leader()
    election = AsyncMongoElection(mongolock_collection, "an-election", ttl=10.0)
    await election.campaign()
    with pytest.raises(LockDataError, match="an election, not a semaphore"):
        await AsyncMongoSemaphore(mongolock_collection, "an-election", 1).acquire(blocking=False)
    with pytest.raises(LockDataError, match="an election, not a lock"):
        await AsyncMongoLock(mongolock_collection, "an-election").acquire(blocking=False)
    assert await election.resign()
    assert await lock.release()


@pytest.mark.parametrize(
    "edit",
    [{"holders": "everyone"}, {"holders": [{"o": "x", "fence": 1}]}, {"limit": 2}, {"kind": "monarchy"}],
    ids=["holders-not-array", "holder-without-expiry", "two-leaders-allowed", "unknown-kind"],
)
async def test_documents_edited_by_hand_are_refused(mongolock_collection: Any, edit: dict[str, Any]) -> None:
    election = AsyncMongoElection(mongolock_collection, "edited", ttl=10.0)
    await election.campaign()
    await mongolock_collection.update_one({"_id": "edited"}, {"$set": edit})
    other = AsyncMongoElection(mongolock_collection, "edited", ttl=10.0)
    if "limit" in edit:
        # A limit the election never writes: the next attempt writes 1 again, and the leader
        # keeps the one permit, so nobody leads beside it.
        with pytest.raises(LockTimeoutError):
            await other.campaign(timeout=0.5)
        return
    with pytest.raises(LockDataError):
        await other.campaign(timeout=1)
    with pytest.raises(LockDataError):
        await other.leader()
    doc = await mongolock_collection.find_one({"_id": "edited"})
    assert {key: doc[key] for key in edit} == edit, "nothing was written to the edited document"


@pytest.mark.timing(margin=1.5)  # a campaign for a free election, within 2 s
async def test_the_manager_hands_out_candidates(mongolock_collection: Any) -> None:
    locks = LockManager(mongolock_collection, ttl=8.0, label="replica", fair=False, blocking=False, heartbeat=False)
    election = locks.election("cron")
    assert election.ttl == 8.0
    term = await election.campaign(timeout=2)
    seen = await election.leader()
    assert seen is not None and seen.term == term and seen.holder["label"] == "replica"
    assert await election.resign()
    with pytest.raises(ValueError, match="heartbeat"):
        locks.election("cron", heartbeat=False)


def _start_leader(uri: str, collection: str, ttl: float, fenced: bool = False) -> tuple[subprocess.Popen[str], int]:
    """A process that leads the election and keeps leading (writing to "resource" with its term,
    if ``fenced``); returns it and its term."""
    leader = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            uri,
            TEST_DATABASE,
            collection,
            "lead",
            "-",
            str(ttl),
            "fenced" if fenced else "-",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_environment(),
    )
    assert leader.stdout is not None
    line = leader.stdout.readline().split()
    assert line[:1] == ["leading"], f"the leader process said {line}"
    return leader, int(line[1])


@pytest.mark.safety
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
async def test_failover_after_the_leader_dies_or_stalls(mongolock_driver: str, mongolock_uri: str, fault: str) -> None:
    # With SIGSTOP the stalled leader's process keeps writing to a resource with its term as the
    # fencing token (code it handed the term to): once it resumes after the next leader wrote
    # there, each of those writes is refused.
    collection, ttl = f"election_{uuid.uuid4().hex[:8]}", 2.0
    leader, old_term = _start_leader(mongolock_uri, collection, ttl, fenced=fault == "SIGSTOP")
    client = make_client(mongolock_driver, mongolock_uri)
    try:
        candidate = AsyncMongoElection(client[TEST_DATABASE][collection], "leader", ttl=ttl)
        read_at = time.monotonic()
        seen = await candidate.leader()
        assert seen is not None and seen.term == old_term and seen.holder["pid"] == leader.pid
        # The old term lasts at least what the server said was left of it then (a renewal since
        # only moves its end later): the bound whatever the leader's heartbeat did. One that
        # assumed a renewal at most ttl / 3 before the signal failed when the leader lagged.
        expires_no_sooner = read_at + seen.time_left
        os.kill(leader.pid, getattr(signal, fault))
        term = await candidate.campaign(timeout=30)
        took_over_at = time.monotonic()
        assert term > old_term, "the new leader's term is above the old leader's"
        # (The server's clock counts in milliseconds.)
        assert took_over_at >= expires_no_sooner - 0.01, (
            f"leadership changed {expires_no_sooner - took_over_at:.3f} s before the old term expired"
        )
        if fault == "SIGSTOP":
            resource = client[TEST_DATABASE]["resource"]
            written = await fenced_update_one(
                resource, {"_id": "resource"}, {"$inc": {"writes": 1}}, token=term, upsert=True
            )
            assert written.applied
            resumed_at = time.monotonic()
            os.kill(leader.pid, signal.SIGCONT)
            assert leader.stdout is not None
            said = await asyncio.to_thread(_lines_after_resuming, leader.stdout, resumed_at, old_term)
            assert said.count("lost") == 1, said
            assert said.count("refused") >= 3 and "applied" not in said, f"the resumed leader's writes: {said}"
            stored = await resource.find_one({"_id": "resource"})
            seen = await candidate.leader()
            assert stored is not None and stored["fence"] >= term
            # Unless this test's own process was paused past the new leader's lease (then the
            # resumed process may lead again, rightly, in a later term), nobody else led meanwhile.
            if believes(candidate):
                assert seen is not None and seen.term == term, "the resumed process took leadership back"
                assert stored["fence"] == term
        await release_as_promised(candidate)  # a resignation
    finally:
        leader.kill()
        leader.wait()
        await close_client(client)


def _lines_after_resuming(stdout: Any, resumed_at: float, term: int) -> list[str]:
    """What a resumed leader process said after ``resumed_at``: "lost", and the outcomes of the
    writes with ``term`` it sent after it (one in flight at the stop may have been applied before
    the new leader wrote), until it has said "lost" and written three times."""
    said: list[str] = []
    for line in stdout:
        kind, at, *outcome = line.split()
        if kind == "wrote" and int(outcome[1]) != term:
            continue  # a term it won again after the loss
        if kind in ("wrote", "lost") and float(at) >= resumed_at:
            said.append(outcome[0] if kind == "wrote" else kind)
        if "lost" in said and len(said) >= 4:
            return said
    raise AssertionError(f"the resumed leader process ended saying only {said}")


async def test_observers_see_each_change_of_leader_without_campaigning(
    mongolock_driver: str, mongolock_uri: str
) -> None:
    # A TTL of 60 s: an observer reading only every ttl / 3 would miss the 10 s bound below, so
    # seeing each change within it means the change stream brought it.
    collection = f"election_{uuid.uuid4().hex[:8]}"
    clients = [make_client(mongolock_driver, mongolock_uri) for _ in range(2)]
    try:
        observer = AsyncMongoElection(clients[0][TEST_DATABASE][collection], "cache-warmer", ttl=60.0)
        first, second = (
            AsyncMongoElection(clients[1][TEST_DATABASE][collection], "cache-warmer", ttl=60.0, label=label)
            for label in ("first", "second")
        )
        seen: asyncio.Queue[Leadership | None] = asyncio.Queue()

        async def observe() -> None:
            async with contextlib.aclosing(observer.changes()) as changes:
                async for leadership in changes:
                    seen.put_nowait(leadership)

        observing = asyncio.create_task(observe())
        async with asyncio.timeout(10):
            assert await seen.get() is None, "nobody leads yet"
        first_term = await first.campaign(timeout=5)
        async with asyncio.timeout(10):
            change = await seen.get()
        assert change is not None and change.term == first_term and change.holder["label"] == "first"
        following = asyncio.create_task(second.campaign(timeout=20))
        # Its place stored (after a fixed 0.5 s, it could still be on its way on a loaded machine:
        # the resignation would leave nobody leading, a change of its own).
        await candidates_waiting(first, 1)
        assert await first.resign()
        second_term = await following
        async with asyncio.timeout(10):
            change = await seen.get()
        assert change is not None and change.term == second_term and change.holder["label"] == "second"
        assert await second.resign()
        async with asyncio.timeout(10):
            assert await seen.get() is None, "the last resignation left nobody leading"
        assert seen.empty(), "a renewal or a queued place was reported as a change"
        assert not observer.leading, "observing did not campaign"
        observing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await observing
    finally:
        for client in clients:
            await close_client(client)


# The observer's first read must come before the dead term expires: a TTL of 2 s leaves that read
# and the campaign's reply 1.5 s or more (with 1 s, two requests of a loaded machine's server could
# take it all).
@pytest.mark.timing(margin=1.5)
async def test_observers_see_a_dead_leaders_term_expire(mongolock_collection: Any) -> None:
    observer = AsyncMongoElection(mongolock_collection, "expiring", ttl=30.0)
    dying = AsyncMongoElection(mongolock_collection, "expiring", ttl=2.0)
    term = await dying.campaign()
    dying._forget_lease()  # the leader's process dies: no renewal, no release, no write at all
    changes = observer.changes()
    try:
        change = await anext(changes)
        assert change is not None and change.term == term
        async with asyncio.timeout(10):
            assert await anext(changes) is None, "the expiry, which wrote nothing, was seen"
    finally:
        await changes.aclose()


@pytest.mark.safety
async def test_a_leader_cut_off_from_mongodb_stops_before_the_next_one_starts(
    mongolock_driver: str, fault_server: FaultServer
) -> None:
    # Every command of the leader's client fails with a closed connection (a fail point scoped to
    # its appName), while the candidate's client is untouched: a network cut of the leader alone.
    # The leader's work ends where its handle stops saying it leads (its cancellation, or its
    # lease's local deadline if the cancellation comes later, as after a pause of this process).
    leader_client = fault_server.client(mongolock_driver, serverMonitoringMode="poll", heartbeatFrequencyMS=500)
    candidate_client = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-candidate")
    locks = fault_server.collection
    try:
        leader = AsyncMongoElection(leader_client[TEST_DATABASE][locks], "cut", ttl=3.0, heartbeat=0.5)
        candidate = AsyncMongoElection(candidate_client[TEST_DATABASE][locks], "cut", ttl=3.0)
        led: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
        stopped: list[float] = []

        async def work(term: int) -> None:
            belief = Belief(leader)
            belief.holds()
            led.put_nowait((term, time.monotonic()))
            try:
                await asyncio.sleep(60)
            finally:
                belief.leaves()
                stopped.append(belief.section[1] if belief.section else -math.inf)  # -inf: it never led

        leading = asyncio.create_task(leader.lead(work))
        old_term, _ = await led.get()
        following = asyncio.create_task(candidate.campaign(timeout=30))
        await candidates_waiting(candidate, 1)
        commands = ["update", "findAndModify", "aggregate", "find", "getMore", "ping"]
        await set_fail_point(
            candidate_client[TEST_DATABASE][locks],
            "alwaysOn",
            failCommands=commands,
            closeConnection=True,
            appName=fault_server.app_name,
        )
        new_term = await following
        took_over_at = time.monotonic()
        assert not believes(leader), "two leaders at once: the cut-off one still says it leads"
        async with asyncio.timeout(10):  # its deadline has passed: its work is cancelled at once
            while not stopped:  # noqa: ASYNC110 - polls what the work's end recorded
                await asyncio.sleep(0.01)
        assert stopped[0] <= took_over_at, "two leaders worked at once"
        assert new_term > old_term
        await set_fail_point(candidate_client[TEST_DATABASE][locks], "off")
        leading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leading
        await release_as_promised(candidate)  # a resignation
    finally:
        await close_client(leader_client)
        await close_client(candidate_client)


async def test_a_leader_hands_leadership_to_a_named_candidate(mongolock_driver: str, mongolock_uri: str) -> None:
    collection = f"election_{uuid.uuid4().hex[:8]}"
    clients = [make_client(mongolock_driver, mongolock_uri) for _ in range(3)]
    try:
        leader, older, named = (
            AsyncMongoElection(client[TEST_DATABASE][collection], "handed", ttl=60.0, label=label)
            for client, label in zip(clients, ("leader", "older", "named"), strict=True)
        )
        term = await leader.campaign(timeout=5)
        waiting_older = asyncio.create_task(older.campaign(timeout=30))
        await candidates_waiting(leader, 1)  # the older candidate's place is stored first
        waiting_named = asyncio.create_task(named.campaign(timeout=30))
        await candidates_waiting(leader, 2)
        with pytest.raises(LookupError, match="no candidate labelled 'nobody'"):
            await leader.resign(to="nobody")
        assert leader.leading, "a hand-over to nobody left the leader leading"
        assert await leader.resign(to="named")
        named_term = await waiting_named
        assert named_term > term and named.leading
        assert not waiting_older.done(), "the candidate in turn was passed over for the named one"
        assert await named.resign()  # then the next in turn
        assert await waiting_older > named_term
        assert await older.resign()
    finally:
        for client in clients:
            await close_client(client)


@pytest.mark.parametrize(("to", "error"), [(7, TypeError), ("", ValueError)])
async def test_a_hand_over_to_a_bad_name_is_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter, to: Any, error: type[Exception]
) -> None:
    election = AsyncMongoElection(counted_collection, "job")
    with pytest.raises(error, match="to must be"):
        await election.resign(to=to)
    assert command_counter.names == []
