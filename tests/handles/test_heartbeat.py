"""Heartbeat: long jobs keep the lease; loss cancels the body and raises LockLostError, never silently."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from mongolock_async import AsyncMongoLock, LockLostError
from mongolock_async._runtime import keeper as keeper_module
from mongolock_async._runtime.keeper import keeper_for_running_loop
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.fail_points import FaultServer, set_fail_point


async def keeper_tasks() -> list[asyncio.Task[Any]]:
    """Keeper tasks still alive, after giving one that has nothing left to do time to end (it
    finishes a renewal in flight rather than cancelling it)."""
    for _ in range(50):
        alive = [task for task in asyncio.all_tasks() if task.get_name() == "mongolock-keeper" and not task.done()]
        if not alive or keeper_for_running_loop().has_work:
            return alive
        await asyncio.sleep(0.05)
    return alive


@pytest.mark.timing(margin=1.4)
async def test_heartbeat_keeps_a_job_of_five_ttls(mongolock_collection: Any) -> None:
    # 2.5 s: a renewal every 0.83 s, so only a request stalled for about 1.4 s loses the lease. With
    # 0.6 s, one stalled for 0.35 s did, in a fresh clone's .ci/run (the lease was lost, as promised);
    # 8 workers' embedded servers on 2 cores have taken more than half a second to answer one.
    ttl = 2.5
    lock = AsyncMongoLock(mongolock_collection, "long-job", ttl=ttl, heartbeat=True)
    # The contender's own TTL is long: a stall of a loaded machine between its acquire and its
    # release must not end its lease (what is tested is the holder's).
    contender = AsyncMongoLock(mongolock_collection, "long-job", ttl=30)
    refusals = 0
    async with lock:
        token = lock.fencing_token
        stop_at = time.monotonic() + 5 * ttl
        while time.monotonic() < stop_at:
            assert not await contender.acquire(blocking=False), "acquired while the heartbeat held it"
            refusals += 1
            await asyncio.sleep(0.05)
        assert await lock.owned()
        assert lock.fencing_token == token, "renewal keeps the same acquisition"
    assert refusals > 10
    assert await contender.acquire(blocking=False)
    assert await contender.release()
    assert await keeper_tasks() == []


# The block must be cancelled between its local deadline and the server's expiry: a safety margin
# of 0.5 s, which a loaded machine's event loop meets (with the default's 10 % of a 0.6 s TTL, 60 ms,
# one lagging worker missed it), and 1.5 s for the acquire and the read before the deadline. It
# still catches a block cancelled late (past the server's expiry, when another can take over) or
# not at all.
@pytest.mark.timing(margin=0.5)
async def test_without_heartbeat_the_block_is_cancelled_at_its_deadline(mongolock_collection: Any) -> None:
    ttl = 2.0
    lock = AsyncMongoLock(mongolock_collection, "long-job", ttl=ttl, safety_margin=0.5)
    reached_the_end = False
    with pytest.raises(LockLostError, match="heartbeat=True") as raised:
        async with lock:
            server_expiry = (await mongolock_collection.find_one({"_id": "long-job"}))["expiresAt"].replace(tzinfo=UTC)
            await asyncio.sleep(5 * ttl)
            reached_the_end = True
    raised_at = datetime.now(UTC)
    assert not reached_the_end, "the block ran on past its lease"
    assert raised.value.name == "long-job"
    assert raised_at < server_expiry, "the block was stopped only after someone else could take over"
    contender = AsyncMongoLock(mongolock_collection, "long-job", ttl=30)  # long: see above
    assert await contender.acquire(timeout=5)
    assert await contender.release()


@pytest.mark.timing(margin=0.5)  # cancelled within the safety margin (0.5 s) of the local deadline
async def test_paused_server_cancels_the_body_before_the_server_expiry(
    mongolock_driver: str, private_server: EmbeddedMongo
) -> None:
    """A server that stops answering (SIGSTOP) mid-block: the body is cancelled at the lease's
    local deadline, before the server's expiry. Private server: it SIGSTOPs the server, which would
    stop every other test using it (a fail point cannot stand in: it holds back chosen commands of
    one client, not every reply, the driver's monitoring included)."""
    # 5 s: the default safety margin (a tenth of the TTL) is then 0.5 s, the time the loop may take
    # to run the deadline's timer. With 2 s (a margin of 0.2 s), CI once cancelled the body 36 ms
    # after the server's expiry; a process beside 8 workers' run on 2 cores has woken 0.24 s late.
    ttl = 5.0
    holder_client = make_client(mongolock_driver, private_server.uri)
    contender_client = make_client(mongolock_driver, private_server.uri)
    try:
        collection = holder_client[TEST_DATABASE]["locks"]
        lock = AsyncMongoLock(collection, "partitioned", ttl=ttl, heartbeat=0.4)
        body_cancelled_at: datetime | None = None
        with pytest.raises(LockLostError) as raised:
            async with lock:
                await asyncio.sleep(0.5)  # a renewal or so succeeds first
                private_server.pause()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    body_cancelled_at = datetime.now(UTC)
                    raise
        raised_at = datetime.now(UTC)
        assert body_cancelled_at is not None, "the body was not cancelled"
        assert "local deadline" in raised.value.reason
        private_server.resume()
        contenders = contender_client[TEST_DATABASE]["locks"]
        old = await contenders.find_one({"_id": "partitioned"})
        server_expiry = old["expiresAt"].replace(tzinfo=UTC)
        assert body_cancelled_at < server_expiry and raised_at < server_expiry, (
            body_cancelled_at,
            raised_at,
            server_expiry,
        )
        contender = AsyncMongoLock(contenders, "partitioned", ttl=30)  # long: see above
        assert await contender.acquire(timeout=10)
        taken = await contenders.find_one({"_id": "partitioned"})
        assert taken["acquiredAt"].replace(tzinfo=UTC) >= server_expiry
        assert taken["fence"] > old["fence"]
        assert await contender.release()
        assert await keeper_tasks() == []
    finally:
        private_server.resume() if private_server.running else None
        await close_client(holder_client)
        await close_client(contender_client)


@pytest.mark.parametrize(
    "failure",
    [{"errorCode": 10107}, {"errorCode": 91}, {"closeConnection": True}],
    ids=["NotWritablePrimary", "ShutdownInProgress", "closeConnection"],
)
@pytest.mark.parametrize(
    ("outage", "lost"),
    [
        # The renewal after the short outage has 1.8 s (see below); the long one loses whatever happens.
        pytest.param(0.8, False, id="short", marks=pytest.mark.timing(margin=1.8)),
        pytest.param(4.5, True, id="long"),
    ],
)
async def test_renewal_failures_lose_the_lease_only_past_the_deadline(
    mongolock_driver: str, fault_server: FaultServer, failure: dict[str, Any], outage: float, lost: bool
) -> None:
    # The embedded server answers the driver's streaming "hello" only every 10 s after a
    # NotWritablePrimary-style error; polling monitoring lets the driver see it is back at once.
    client = fault_server.client(mongolock_driver, serverMonitoringMode="poll", heartbeatFrequencyMS=500)
    try:
        collection = client[TEST_DATABASE][fault_server.collection]
        # Local deadline: 3.6 s after the last renewal before the outage. The short outage, plus the
        # driver's up to 0.5 s to see the server again, leaves 2.3 s for a renewal on a new
        # connection (with authentication, in the access-control run) on a loaded machine; the long
        # one outlasts the deadline whenever the last renewal before it was sent.
        lock = AsyncMongoLock(collection, "flaky", ttl=4.0, heartbeat=0.5)
        assert await lock.acquire()
        await set_fail_point(collection, "alwaysOn", failCommands=["update"], **failure)
        await asyncio.sleep(outage)
        await set_fail_point(collection, "off")
        await asyncio.sleep(1.2)  # time for renewals to succeed again
        assert lock.lost.is_set() is lost
        assert (lock.lost_error is not None) is lost
        assert await lock.owned() is not lost
        if lost:
            assert "local deadline" in lock.lost_error.reason  # type: ignore[union-attr]
        await lock.release()
    finally:
        await close_client(client)


async def test_another_owner_is_detected_at_the_next_renewal(mongolock_collection: Any) -> None:
    # The body would end after 10 s, the local deadline is 29 s away: only a renewal can stop it.
    lock = AsyncMongoLock(mongolock_collection, "stolen", ttl=30.0, heartbeat=0.3)
    reached_the_end = False
    with pytest.raises(LockLostError, match="another owner") as raised:
        async with lock:
            await mongolock_collection.update_one({"_id": "stolen"}, {"$set": {"owner": "intruder"}})
            await asyncio.sleep(10)
            reached_the_end = True
    assert not reached_the_end, "the body ran to its end: the takeover was not detected"
    assert raised.value.lost_at <= datetime.now(UTC)
    doc = await mongolock_collection.find_one({"_id": "stolen"})
    assert doc["owner"] == "intruder", "the intruder's lease is left alone"


@pytest.mark.timing(margin=2.4)  # 3 s leases renewed every 0.3 s; lost within 5 s
async def test_on_lost_once_event_set_and_not_owned(mongolock_collection: Any) -> None:
    calls: list[AsyncMongoLock] = []
    async_calls: list[AsyncMongoLock] = []

    async def record_async(lock: AsyncMongoLock) -> None:
        async_calls.append(lock)

    lock = AsyncMongoLock(mongolock_collection, "watched", ttl=3.0, heartbeat=0.3, on_lost=calls.append)
    other = AsyncMongoLock(mongolock_collection, "other", ttl=3.0, heartbeat=0.3, on_lost=record_async)
    assert await lock.acquire() and await other.acquire()
    await mongolock_collection.update_many({}, {"$set": {"owner": "intruder"}})
    await asyncio.wait_for(lock.lost.wait(), 5)
    await asyncio.wait_for(other.lost.wait(), 5)
    await asyncio.sleep(1.0)  # more ticks: the callback must still have run only once
    assert calls == [lock]
    assert async_calls == [other]
    assert not await lock.owned()
    assert lock.fencing_token is None and lock.deadline is None
    assert isinstance(lock.lost_error, LockLostError)
    assert await lock.release() is False
    assert await other.release() is False
    assert await keeper_tasks() == []


@pytest.mark.timing(margin=2.4)  # the keeper ends within 2.5 s, after a renewal in flight
async def test_body_exceptions_and_outer_cancellation_pass_through(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "plain", ttl=3.0, heartbeat=True)
    with pytest.raises(KeyError, match="from the body"):
        async with lock:
            raise KeyError("from the body")
    assert not await lock.locked()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            async with lock:
                await asyncio.sleep(10)
    assert not await lock.locked()
    assert await keeper_tasks() == []


@pytest.mark.timing(margin=2.4)  # the keeper ends within 2.5 s, after a renewal in flight
async def test_cpu_bound_body_past_the_deadline_is_reported(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "busy", ttl=0.6, heartbeat=0.2)
    with pytest.raises(LockLostError, match="must yield"):
        async with lock:
            time.sleep(0.8)  # noqa: ASYNC251 - deliberately blocks: the heartbeat cannot run
    assert await keeper_tasks() == []


@pytest.mark.timing(margin=2.4)  # the keeper ends within 2.5 s, after a renewal in flight
async def test_many_leases_are_renewed_in_chunks_one_request_each(
    counted_collection: Any, command_counter: CommandCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of 10, not the 100 of a release: the same cutting and sending for a tenth of the
    # server's work (300 leases taken, renewed twice and released cost the embedded server 25 s of
    # CPU; benchmarks/renewal.py measures 100 to 10,000 leases).
    chunk = 10
    monkeypatch.setattr(keeper_module, "RENEWAL_CHUNK", chunk)
    leases, interval = 3 * chunk, 1.5
    tasks_before = len(asyncio.all_tasks())
    locks = [AsyncMongoLock(counted_collection, f"lease-{i}", ttl=30.0, heartbeat=interval) for i in range(leases)]
    # Taken and released one at a time: hundreds of requests at once queue on the embedded server for
    # seconds, and in the access-control job another worker's test shares that server (a 1.5 s lease
    # there was lost behind them, as promised, in a CI run).
    for lock in locks:
        assert await lock.acquire()
    assert len(await keeper_tasks()) == 1
    assert len(asyncio.all_tasks()) - tasks_before < 20, "tasks do not grow with the number of leases"
    command_counter.commands.clear()
    window_started = time.monotonic()

    def renewed_of() -> tuple[list[dict[str, Any]], Counter[str]]:
        renewals = [command for command in command_counter.commands if "update" in command]
        return renewals, Counter(statement["q"]["_id"] for renewal in renewals for statement in renewal["updates"])

    # Until every lease was renewed twice: how soon depends on the server's speed (a loaded
    # machine's 300 statements can take longer than a tick), what is sent per tick does not.
    while len(renewed := renewed_of()[1]) < leases or min(renewed.values()) < 2:
        assert time.monotonic() - window_started < 60, "some leases were not renewed twice in 60 s"
        await asyncio.sleep(0.1)
    window = time.monotonic() - window_started
    renewals, renewed = renewed_of()
    assert all(1 <= len(renewal["updates"]) <= chunk for renewal in renewals)
    statements = [statement for renewal in renewals for statement in renewal["updates"]]
    # One statement per lease, matching its own name and owner by equality.
    assert all(isinstance(statement["q"]["_id"], str) for statement in statements)
    assert all(isinstance(statement["q"]["owner"], str) for statement in statements)
    assert set(renewed) == {f"lease-{i}" for i in range(leases)}, "some leases were not renewed"
    # At most once per half interval (due leases take the nearly due along).
    most = window / (interval / 2) + 1
    assert max(renewed.values()) <= most, renewed.most_common(3)
    assert len(renewals) <= most * leases / chunk
    assert all(await asyncio.gather(*(lock.owned() for lock in locks[:: leases // 10])))
    for lock in locks:
        assert await lock.release()
    assert await keeper_tasks() == []


@pytest.mark.timing(margin=1.5)  # the 12 acquires within 2 s, to be renewed in one tick
async def test_the_earliest_deadlines_are_renewed_first(
    counted_collection: Any, command_counter: CommandCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper_module, "RENEWAL_CHUNK", 5)
    # Taken in order 0..11 with TTLs shrinking by a second each: the deadlines run the other way.
    # Renewed every 4 s, and those due within 2 s of the first ride along: all 12 in the first
    # tick, unless a loaded machine took over 2 s to acquire them (with a 1 s heartbeat, 0.5 s
    # was once too little).
    locks = [AsyncMongoLock(counted_collection, f"lease-{i}", ttl=30.0 - i, heartbeat=4.0) for i in range(12)]
    for lock in locks:
        assert await lock.acquire()
    command_counter.commands.clear()

    def renewals() -> list[dict[str, Any]]:
        return [command for command in command_counter.commands if "update" in command]

    async with asyncio.timeout(15):
        while len(renewals()) < 3:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.05)
    first_tick = renewals()[:3]
    assert [len(renewal["updates"]) for renewal in first_tick] == [5, 5, 2]
    order = [statement["q"]["_id"] for renewal in first_tick for statement in renewal["updates"]]
    assert order == [f"lease-{i}" for i in reversed(range(12))], order
    for lock in locks:
        assert await lock.release()


@pytest.mark.timing(margin=1.7)
async def test_extend_to_a_shorter_ttl_renews_at_the_shorter_interval(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "shrunk", ttl=30.0, heartbeat=True)  # renews every 10 s
    async with lock:
        # Now every second (each renewal has 1.7 s for its round trip), or the lease would be lost
        # after about 2.7 s.
        await lock.extend(ttl=3.0)
        await asyncio.sleep(6.0)
        assert not lock.lost.is_set(), lock.lost_error
        assert await lock.owned()


@pytest.mark.timing(margin=2.4)
async def test_nothing_is_renewed_once_nothing_is_held(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    # A 3 s TTL: a renewal may take over 2 s before "released" is lost before its release.
    released = AsyncMongoLock(counted_collection, "released", ttl=3.0, heartbeat=0.2)
    stolen = AsyncMongoLock(counted_collection, "stolen", ttl=3.0, heartbeat=0.2)
    assert await released.acquire() and await stolen.acquire()
    # Two renewals sent (within a fixed 0.5 s, the second had 0.1 s after the first's answer).
    async with asyncio.timeout(5):
        while command_counter.count("update") < 2:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.05)
    assert await released.release()
    await counted_collection.update_one({"_id": "stolen"}, {"$set": {"owner": "intruder"}})
    await asyncio.wait_for(stolen.lost.wait(), 5)
    command_counter.names.clear()
    await asyncio.sleep(0.8)  # four intervals
    assert command_counter.count("update", "find") == 0, command_counter.names
    assert await keeper_tasks() == []


@pytest.mark.timing(margin=2.2)  # the sooner lease renewed (every 0.5 s) before its deadline (2.7 s)
async def test_taking_more_leases_does_not_wake_the_keeper_for_each(
    mongolock_collection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every wake-up of the keeper looks at every lease it keeps (which are due, which have ended),
    # so a wake-up per new lease would make taking the n-th lease cost n: 10,000 leases, 50
    # million looks. A new lease due after the keeper's next wake-up changes nothing until then.
    waits = 0
    wait_for_event = keeper_module.wait_for_event

    async def counting_wait(event: asyncio.Event, timeout: float | None) -> None:
        nonlocal waits
        waits += 1
        await wait_for_event(event, timeout)

    monkeypatch.setattr(keeper_module, "wait_for_event", counting_wait)
    locks = [AsyncMongoLock(mongolock_collection, f"lease-{i}", ttl=180.0, heartbeat=60.0) for i in range(40)]
    for lock in locks:
        assert await lock.acquire()
    assert len(await keeper_tasks()) == 1
    # The first lease starts the keeper, which sleeps until that lease is due (60 s from then);
    # every later one is due later still.
    assert waits == 1, f"the keeper woke {waits - 1} times for 39 leases due after its wake-up"
    # One due earlier than that wakes it, to sleep until then instead.
    sooner = AsyncMongoLock(mongolock_collection, "sooner", ttl=3.0, heartbeat=0.5)
    assert await sooner.acquire()
    first_deadline = sooner.deadline
    assert first_deadline is not None
    async with asyncio.timeout(10):  # it is due in 0.5 s, its deadline passes in 2.7 s
        while (sooner.deadline or 0.0) <= first_deadline:  # noqa: ASYNC110 - waits for a renewal
            await asyncio.sleep(0.05)
    assert not sooner.lost.is_set()
    assert waits >= 2
    for lock in [*locks, sooner]:
        assert await lock.release()
    assert await keeper_tasks() == []
