"""Jobs: at most one run at a time, once per period of the server's clock, at least some time
apart; runs recorded, lost runs retried, failures bounded. The concurrency claims are tested with
several OS processes (and a control that shows the detector counts what it should).

A run counts once the server recorded its end (the worker's ``run`` returned): a run whose lease
was lost, as after a pause past its TTL, left its period to be run again, so no pause can make a
correct job show two runs in a period."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import time
import warnings
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoJob,
    AsyncMongoLock,
    AsyncMongoSemaphore,
    LockDataError,
    LockHooks,
    LockLostError,
    LockManager,
)
from mongolock_async.examples.periodic_job import SCHEDULERS
from mongolock_async.jobs import DerivedJobNameWarning, Period, current_run, run_once
from mongolock_async.store import LockStore
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.commands import CommandCounter
from tests.support.libfaketime import preloaded
from tests.support.processes import WORKERS
from tests.support.run_settings import child_environment
from tests.support.server_clock import SteppedServerClock
from tests.workers.job_worker import EPOCH, start_ms

pytestmark = pytest.mark.one_driver  # above the requests: the drivers never differ here

WORKER = WORKERS / "job_worker.py"
Run = tuple[int, float, float, int]  # period (its start, ms since the epoch), start, end, pid


def run_job_workers(
    uri: str,
    collection: Any,
    commands: list[tuple[dict[str, str], list[str]]],
    skipped: list[tuple[int, str]] | None = None,
) -> list[Run]:
    """Run the job workers ``(variables, arguments)`` at once (``variables``: set in the worker's
    environment, libfaketime's say); every run they completed (and in ``skipped``, the calls that
    did not run)."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), uri, TEST_DATABASE, collection.name, *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_environment(**variables),
        )
        for variables, arguments in commands
    ]
    runs: list[Run] = []
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        for line in out.splitlines():
            record = json.loads(line)
            if "run" in record:
                runs.append(tuple(record["run"]))  # type: ignore[arg-type]
            elif skipped is not None:
                skipped.append(tuple(record["skipped"]))  # type: ignore[arg-type]
    return runs


def runs_per_period(runs: list[Run]) -> Counter[int]:
    return Counter(period for period, *_ in runs)


def one_run_per_called_period(runs: list[Run], skipped: list[tuple[int, str]]) -> dict[int, str]:
    """Each period's count of runs against its calls that did not run: a period with a call must
    have exactly one run, unless each of its calls found a run of an earlier period still going
    (``running``: a loaded machine can delay a run past its period). What is not so, by period."""
    counts = runs_per_period(runs)
    reasons: dict[int, set[str]] = {}
    for period, reason in skipped:
        reasons.setdefault(period, set()).add(reason)
    wrong = {period: f"{n} runs" for period, n in counts.items() if n > 1}
    for period, seen in reasons.items():
        if counts[period] == 0 and seen != {"running"}:
            wrong[period] = f"no run; calls skipped as {sorted(seen)}"
    return wrong


def test_the_detector_counts_runs_per_period() -> None:
    runs = [(7, 0.0, 0.1, 1), (7, 0.5, 0.6, 2), (8, 1.2, 1.3, 1)]
    assert runs_per_period(runs) == {7: 2, 8: 1}
    assert one_run_per_called_period(runs, [(8, "done")]) == {7: "2 runs"}
    assert one_run_per_called_period(runs[2:], [(9, "done")]) == {9: "no run; calls skipped as ['done']"}
    assert one_run_per_called_period(runs[2:], [(9, "running")]) == {}


@pytest.mark.safety
async def test_four_processes_run_a_periodic_job_once_per_period(mongolock_uri: str, pymongo_collection: Any) -> None:
    # 4 processes fire the same job (every 1 s) at jittered moments of each period for 22 s.
    lock_collection = pymongo_collection
    commands = [({}, ["fire", "periodic", "1", "22"]) for _ in range(4)]
    skipped: list[tuple[int, str]] = []
    runs = await asyncio.to_thread(run_job_workers, mongolock_uri, lock_collection, commands, skipped)
    assert not one_run_per_called_period(runs, skipped), one_run_per_called_period(runs, skipped)
    # Enough periods to judge, even if the server stopped for a few seconds (no call lands then).
    assert sum(1 for n in runs_per_period(runs).values() if n == 1) >= 12, runs_per_period(runs)
    assert {reason for _, reason in skipped} <= {"running", "done"}, skipped
    assert len({pid for *_, pid in runs}) > 1, "the runs were spread over the processes"


@pytest.mark.safety  # the detector's control
async def test_the_control_without_periods_runs_several_times_per_period(
    mongolock_uri: str, pymongo_collection: Any
) -> None:
    lock_collection = pymongo_collection
    # The same firing with a plain run_once (one run at a time, but nothing per period).
    commands = [({}, ["control", "control", "1", "6"]) for _ in range(4)]
    runs = await asyncio.to_thread(run_job_workers, mongolock_uri, lock_collection, commands)
    assert max(runs_per_period(runs).values()) > 1, "the detector would miss a second run in a period"


@pytest.mark.safety
async def test_client_clocks_that_disagree_do_not_matter(mongolock_uri: str, pymongo_collection: Any) -> None:
    # Three processes whose wall clocks read 40.3 s ahead, 35.6 s behind, and right.
    lock_collection = pymongo_collection
    commands = [
        (preloaded(FAKETIME="+40.3s"), ["fire", "skewed", "1", "12"]),
        (preloaded(FAKETIME="-35.6s"), ["fire", "skewed", "1", "12"]),
        ({}, ["fire", "skewed", "1", "12"]),
    ]
    skipped: list[tuple[int, str]] = []
    runs = await asyncio.to_thread(run_job_workers, mongolock_uri, lock_collection, commands, skipped)
    assert not one_run_per_called_period(runs, skipped), one_run_per_called_period(runs, skipped)
    # Of 12: enough to judge, even if the server stopped for a few seconds.
    assert len(runs_per_period(runs)) >= 6, f"only {len(runs_per_period(runs))} periods had a run"
    assert len({pid for *_, pid in runs}) > 1, "the skewed processes ran the job too"


@pytest.mark.environment  # libfaketime is what the environment provides (make test installs it)
@pytest.mark.timing(margin=1.0)  # read within 1 s of the child's print
def test_libfaketime_shifts_a_processs_wall_clock() -> None:
    # What the test above relies on: the worker's time.time() is off by the given amount.
    command = [sys.executable, "-c", "import time; print(time.time())"]
    environment = preloaded(FAKETIME="+40s")
    shifted = subprocess.run(command, capture_output=True, text=True, check=True, env=child_environment(**environment))
    assert 39 < float(shifted.stdout) - time.time() < 45


def period_midway(every: float) -> float:
    """An offset that puts now (by this machine's clock, the embedded server's too) in the middle
    of a period of ``every`` seconds."""
    return (time.time() - every / 2) % every


# The killed run's lease (TTL 1.5 s, renewed every 0.5 s) lasts a second or more after the kill: the
# first call and the read of the state must come within it.
@pytest.mark.timing(margin=0.8)
async def test_a_run_killed_mid_job_is_retried_in_the_same_period_after_its_ttl(
    mongolock_uri: str, pymongo_collection: Any
) -> None:
    lock_collection = pymongo_collection
    every, offset = 3600.0, period_midway(3600.0)
    locks = LockManager(lock_collection, ttl=10.0)
    arguments = [mongolock_uri, TEST_DATABASE, lock_collection.name, "hang", "hang", str(every), "0", str(offset)]
    process = subprocess.Popen(  # noqa: ASYNC220 - read in a thread
        [sys.executable, str(WORKER), *arguments], stdout=subprocess.PIPE, text=True, env=child_environment()
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)
        assert line.startswith("running"), line
        killed_period = int(line.split()[1])
    finally:
        process.kill()
        process.wait()
    killed_at = time.monotonic()
    attempts: list[tuple[int | None, int]] = []

    @locks.run_once("hang", every=every, offset=offset)
    async def job() -> str:
        run = current_run()
        attempts.append((start_ms(run.period), run.attempt))
        return "retried"

    assert await job() is None, "the killed run's lease was still live"
    state = await locks.job("hang")
    assert state is not None and state.held and state.running is not None
    while (result := await job()) is None:
        assert time.monotonic() - killed_at < 10, "not retried after the killed run's TTL (1.5 s)"
        await asyncio.sleep(0.1)
    assert result == "retried" and attempts == [(killed_period, 2)], attempts
    state = await locks.job("hang")
    assert state is not None and state.done and state.attempts == 2 and state.last is not None
    assert state.last.outcome == "succeeded" and state.last.attempt == 2


async def test_a_job_that_raises_is_retried_up_to_max_attempts_then_the_period_is_failed(
    mongolock_collection: Any
) -> None:
    job = AsyncMongoJob(mongolock_collection, "flaky", every=3600, offset=period_midway(3600.0), max_attempts=3)
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"attempt {current_run().attempt}: the upstream said no")

    for _ in range(3):
        with pytest.raises(ValueError, match="the upstream said no"):
            await job.run(flaky)
    skipped = await job.run(flaky)
    assert calls == 3 and not skipped.ran and skipped.skipped == "failed"
    assert "failed after 3 attempts: ValueError: attempt 3: the upstream said no" in str(skipped)
    state = await job.state()
    assert state is not None and state.exhausted and not state.done and state.attempts == 3
    assert state.last is not None and state.last.outcome == "failed" and state.last.error_type == "ValueError"
    assert state.last.error_message == "attempt 3: the upstream said no"


@pytest.mark.timing(margin=1.2)  # the run's start answered within its 1.5 s lease's deadline
async def test_a_run_that_loses_its_lease_says_so_in_its_record_and_log_and_is_retried(
    mongolock_collection: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = AsyncMongoJob(
        mongolock_collection, "overrun", every=3600, offset=period_midway(3600.0), ttl=1.5, heartbeat=False
    )

    async def too_long() -> None:
        await asyncio.sleep(5)

    with caplog.at_level(logging.WARNING, logger="mongolock_async"), pytest.raises(LockLostError):
        await job.run(too_long)
    said = [record.getMessage() for record in caplog.records if "run cancelled" in record.getMessage()]
    assert len(said) == 1 and "job 'overrun'" in said[0], caplog.text
    assert "ttl 1.5 s" in said[0] and "heartbeat off" in said[0], said
    state = await job.state()
    assert state is not None and state.last is not None and state.last.outcome == "lost"
    assert state.last.error_type == "LockLostError" and state.last.error_message is not None
    assert "ttl 1.5 s" in state.last.error_message and "heartbeat off" in state.last.error_message
    await asyncio.sleep(0.2)  # past the lease's expiry on the server too

    async def quick() -> int:
        return current_run().attempt

    result = await job.run(quick)
    assert result.ran and result.value == 2
    state = await job.state()
    assert state is not None and state.done and state.attempts == 2


@pytest.mark.timing(margin=1.1)  # renewed every 0.67 s, each lease ending 1.8 s after its send
async def test_a_jobs_runs_are_renewed_by_default_and_a_locks_lease_is_not(mongolock_collection: Any) -> None:
    # A 2 s TTL: its heartbeat (every ttl / 3) has over a second for each renewal's round trip,
    # which a loaded machine's embedded server can take (at 0.6 s, 1 run in 80 lost the lease
    # at a load of 9 to 14).
    job = AsyncMongoJob(mongolock_collection, "long", ttl=2.0)

    async def three_ttls() -> str:
        await asyncio.sleep(6.0)
        return "finished"

    result = await job.run(three_ttls)
    assert result.ran and result.value == "finished"
    state = await job.state()
    assert state is not None and state.last is not None and state.last.outcome == "succeeded"
    with pytest.raises(LockLostError, match="use heartbeat=True"):
        async with AsyncMongoLock(mongolock_collection, "long-lock", ttl=0.6):
            await asyncio.sleep(1.8)


# The gaps are judged on the server's record, which no pause shortens; 4 runs in 6 s leave about 2 s.
@pytest.mark.timing(margin=1.5)
async def test_min_interval_keeps_fixed_delay_runs_of_three_processes_apart(
    mongolock_uri: str, pymongo_collection: Any
) -> None:
    lock_collection = pymongo_collection
    commands = [({}, ["delay", "spaced", "1.0", "6"]) for _ in range(3)]
    runs = await asyncio.to_thread(run_job_workers, mongolock_uri, lock_collection, commands)
    runs.sort(key=lambda run: run[1])
    gaps = [later[1] - earlier[2] for earlier, later in itertools.pairwise(runs)]
    assert len(runs) >= 4, runs
    # The server counts from its own record of the end (a few ms after the body's); its clock
    # has millisecond steps.
    assert min(gaps) >= 1.0 - 0.002, gaps


async def test_the_control_without_min_interval_runs_closer(mongolock_uri: str, pymongo_collection: Any) -> None:
    lock_collection = pymongo_collection
    commands = [({}, ["delay", "unspaced", "0", "3"]) for _ in range(3)]
    runs = await asyncio.to_thread(run_job_workers, mongolock_uri, lock_collection, commands)
    runs.sort(key=lambda run: run[1])
    gaps = [later[1] - earlier[2] for earlier, later in itertools.pairwise(runs)]
    assert min(gaps) < 1.0, "the gap check would not catch runs closer than asked"


@pytest.mark.timing(margin=1.3)  # the second call within hold_at_least (1.5 s) of the first run
async def test_hold_at_least_keeps_the_lease_after_a_short_run(mongolock_collection: Any) -> None:
    job = AsyncMongoJob(mongolock_collection, "shedlock", hold_at_least=timedelta(seconds=1.5))

    async def quick() -> str:
        return "done"

    started = time.monotonic()
    assert (await job.run(quick)).ran
    skipped = await job.run(quick)
    assert not skipped.ran and skipped.skipped == "held"
    while not (result := await job.run(quick)).ran:  # noqa: ASYNC110 - asks the server each time
        await asyncio.sleep(0.1)
    assert time.monotonic() - started >= 1.4, "ran again before hold_at_least passed"
    assert result.value == "done"


@pytest.mark.timing(margin=2.5)  # the last two calls within one 3 s period
async def test_periods_are_the_servers_and_a_new_period_runs_again(mongolock_collection: Any) -> None:
    ran: list[Period] = []

    @run_once(mongolock_collection, "every-3-s", every=3)
    async def job() -> None:
        period = current_run().period
        assert period is not None
        ran.append(period)

    await job()
    first = ran[0]
    assert first.end - first.start == timedelta(seconds=3)
    assert (first.start - EPOCH) % timedelta(seconds=3) == timedelta(0), "periods start at multiples of every"
    state = await AsyncMongoJob(mongolock_collection, "every-3-s").state()
    assert state is not None and state.period is not None
    assert state.last is not None and state.last.period == first and state.last.outcome == "succeeded"
    # The state may be read a period later than the run (a run at a period's end, on a loaded
    # machine). Until just after the run's next period begins on the server's clock, then two
    # calls well inside it.
    await asyncio.sleep(max((first.end - state.server_time).total_seconds(), 0) + 0.05)
    await job()
    await job()
    assert ran == [first, Period(first.end, first.end + timedelta(seconds=3))]


async def test_a_period_stays_done_whatever_every_or_offset_the_next_call_has(mongolock_collection: Any) -> None:
    # Now lies midway through an hour-long period, a two-hour one and an hour shifted by 10 minutes
    # (each offset is chosen so): each contains the first run's start. With periods known by number,
    # every=3600, then 7200, then 3600 ran three times.
    hour, two_hours = period_midway(3600.0), period_midway(7200.0)
    schedules: list[dict[str, float]] = [
        {"every": 3600, "offset": hour},
        {"every": 7200, "offset": two_hours},  # longer
        {"every": 3600, "offset": hour},  # back
        {"every": 3600, "offset": (hour + 600) % 3600},  # shifted
        {"every": 1800, "offset": period_midway(1800.0)},  # shorter, also containing the run
    ]
    ran: list[Period | None] = []

    async def work() -> None:
        ran.append(current_run().period)

    results = [await AsyncMongoJob(mongolock_collection, "digest", **schedule).run(work) for schedule in schedules]
    assert [result.skipped for result in results] == [None, "done", "done", "done", "done"], results
    assert len(ran) == 1


async def test_two_versions_with_different_periods_under_one_name_never_run_a_period_twice(
    mongolock_collection: Any,
) -> None:
    hourly = AsyncMongoJob(mongolock_collection, "export", every=3600, offset=period_midway(3600.0))
    daily = AsyncMongoJob(mongolock_collection, "export", every=86_400, offset=period_midway(86_400.0))
    ran: list[str] = []

    async def work(version: str) -> None:
        ran.append(version)

    for _ in range(3):  # their replicas fire in turn
        await hourly.run(work, "hourly")
        await daily.run(work, "daily")
    assert ran == ["hourly"], "the hour's run is the day's too: the day is done"


async def test_a_schedule_change_does_not_give_a_failed_period_its_attempts_back(mongolock_collection: Any) -> None:
    calls = 0

    async def fail() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("upstream down")

    hourly = AsyncMongoJob(mongolock_collection, "sync", every=3600, offset=period_midway(3600.0), max_attempts=2)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await hourly.run(fail)
    shifted = (period_midway(3600.0) + 600) % 3600  # ten minutes later: the failed runs are in it still
    for schedule in ({"every": 7200, "offset": period_midway(7200.0)}, {"every": 3600, "offset": shifted}):
        result = await AsyncMongoJob(mongolock_collection, "sync", max_attempts=2, **schedule).run(fail)
        assert not result.ran and result.skipped == "failed", result
        assert "failed after 2 attempts: RuntimeError: upstream down" in str(result)
    assert calls == 2
    state = await hourly.state()
    assert state is not None and state.exhausted and state.attempts == 2 and not state.done


async def test_two_versions_with_different_max_attempts_keep_each_others_word(mongolock_collection: Any) -> None:
    # model/jobs.pml's finding-attempts-mixed: an hourly version with max_attempts 3 and a
    # once-a-second one with 1. The record kept only the tries of the last caller's max_attempts,
    # so the second's run left one try, and the hour, counting too few, got a 4th run.
    calls: list[str] = []

    async def fail(version: str) -> None:
        calls.append(version)
        raise RuntimeError("upstream down")

    async def call(job: AsyncMongoJob, version: str) -> str:
        try:
            result = await job.run(fail, version)
        except RuntimeError:
            return "failed run"
        return f"skipped {result.skipped}"

    hourly = AsyncMongoJob(mongolock_collection, "sync", every=3600, offset=period_midway(3600.0), max_attempts=3)
    every_second = AsyncMongoJob(mongolock_collection, "sync", every=1, max_attempts=1)
    outcomes = [await call(hourly, "hourly")]
    await asyncio.sleep(1.1)  # the second's period now starts after the hourly run: it has no try yet
    outcomes.append(await call(every_second, "second"))
    outcomes += [await call(hourly, "hourly") for _ in range(3)]
    assert outcomes == ["failed run"] * 3 + ["skipped failed"] * 2, outcomes
    assert calls == ["hourly", "second", "hourly"], "the hour's three attempts are used up"
    state = await hourly.state()
    assert state is not None and state.exhausted and state.attempts == 3


async def test_a_server_clock_stepped_back_leaves_a_periods_attempts_counted(tmp_path: Path) -> None:
    # model/jobs.pml's finding-attempts-step: a run fails at :30 of an hour; the clock steps back
    # into the hour before and a run fails there; back in the hour at :40 a run fails, its 2nd of
    # max_attempts 2. The record kept its tries in the requests' order and sliced off the :30 (the
    # earliest request, not the earliest start), so a call at :45 ran the hour a 3rd time.
    async with SteppedServerClock(tmp_path) as clock:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(clock.uri)
        try:
            job = AsyncMongoJob(client[TEST_DATABASE]["jobs"], "hourly", every=3600, max_attempts=2)
            calls = 0

            async def fail() -> None:
                nonlocal calls
                calls += 1
                raise RuntimeError("upstream down")

            hour = timedelta(hours=1)
            boundary = EPOCH + (datetime.now(UTC) - EPOCH) // hour * hour + 2 * hour
            outcomes = []
            for minutes in (30, -10, 40, 45):
                await clock.set(boundary + timedelta(minutes=minutes))
                try:
                    result = await job.run(fail)
                except RuntimeError:
                    outcomes.append("failed run")
                else:
                    outcomes.append(f"skipped {result.skipped}")
            assert outcomes == ["failed run", "failed run", "failed run", "skipped failed"], outcomes
            assert calls == 3
        finally:
            await client.close()


async def test_a_server_clock_stepped_back_across_a_boundary_runs_no_period_twice(tmp_path: Path) -> None:
    # A failover to a member whose clock is behind: the server's clock goes back across the hour
    # it has just entered. The hour it left is done (its run was before, and the next hour's run
    # came after it), and the next hour has had its run: neither runs again. With periods known by
    # number, both did: the earlier slot was not the last one done, and then the later one was not.
    async with SteppedServerClock(tmp_path) as clock:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(clock.uri)
        try:
            job = AsyncMongoJob(client[TEST_DATABASE]["jobs"], "hourly", every=3600)
            ran: list[datetime] = []

            async def work() -> None:
                period = current_run().period
                assert period is not None
                ran.append(period.start)

            hour = timedelta(hours=1)
            boundary = EPOCH + (datetime.now(UTC) - EPOCH) // hour * hour + 2 * hour
            outcomes = []
            for seconds in (-30, 30, -10, 20, 3630, 3640):
                await clock.set(boundary + timedelta(seconds=seconds))
                result = await job.run(work)
                outcomes.append("ran" if result.ran else result.skipped)
            assert outcomes == ["ran", "ran", "done", "done", "ran", "done"], outcomes
            assert ran == [boundary - hour, boundary, boundary + hour]
        finally:
            await client.close()


class Recorder(LockHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def job_ran(self, name: str, *, outcome: str, duration: float, period: Period | None, attempt: int) -> None:
        self.events.append(("ran", {"outcome": outcome, "period": period, "attempt": attempt}))

    def job_skipped(self, name: str, *, reason: str, period: Period | None) -> None:
        self.events.append(("skipped", {"reason": reason, "period": period}))


async def test_hooks_hear_of_runs_and_skips(mongolock_collection: Any) -> None:
    hooks = Recorder()
    job = AsyncMongoJob(mongolock_collection, "observed", every=3600, offset=period_midway(3600.0), hooks=hooks)
    started, done = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        await done.wait()

    # The second call comes while the first runs, however long its request takes (a run of 0.2 s,
    # as before, could end first on a loaded machine: then the call is skipped as done).
    running = asyncio.create_task(job.run(work))
    await started.wait()
    await job.run(work)
    done.set()
    await running
    await job.run(work)
    period = hooks.events[-1][1]["period"]
    assert isinstance(period, Period)
    assert sorted(kind for kind, _ in hooks.events) == ["ran", "skipped", "skipped"]
    assert {"reason": "running", "period": period} in [details for kind, details in hooks.events if kind == "skipped"]
    assert ("skipped", {"reason": "done", "period": period}) == hooks.events[-1]
    assert ("ran", {"outcome": "succeeded", "period": period, "attempt": 1}) in hooks.events


async def test_a_free_lock_document_of_the_name_becomes_the_jobs(mongolock_collection: Any) -> None:
    # A run_once of an earlier version kept its job in a lock's document.
    lock = AsyncMongoLock(mongolock_collection, "legacy")
    assert await lock.acquire()
    token = lock.fencing_token
    assert token is not None
    job = AsyncMongoJob(mongolock_collection, "legacy")

    async def work() -> str:
        return "ran"

    held = await job.run(work)
    assert not held.ran and held.skipped == "held", "a lock's holder holds it: the job waits for nothing"
    assert await lock.release()
    result = await job.run(work)
    assert result.ran
    doc = await mongolock_collection.find_one({"_id": "legacy"})
    assert doc["kind"] == "job" and doc["fence"] > token
    with pytest.raises(LockDataError, match="a job, not a lock"):
        await AsyncMongoLock(mongolock_collection, "legacy").acquire(blocking=False)


async def test_a_job_name_of_another_kind_or_a_corrupt_record_is_refused(mongolock_collection: Any) -> None:
    semaphore = AsyncMongoSemaphore(mongolock_collection, "a-semaphore", 2)
    assert await semaphore.acquire()

    async def work() -> None:
        pass

    with pytest.raises(LockDataError, match="a semaphore, not a job"):
        await AsyncMongoJob(mongolock_collection, "a-semaphore").run(work)
    await mongolock_collection.insert_one({"_id": "corrupt", "kind": "job", "job": {"tries": "three"}})
    with pytest.raises(LockDataError, match=r"job\.tries"):
        await AsyncMongoJob(mongolock_collection, "corrupt", every=60).run(work)
    assert (await mongolock_collection.find_one({"_id": "corrupt"}))["job"] == {"tries": "three"}, "left as it was"


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"every": 0.5}, ValueError, "at least 1 second"),
        ({"every": "daily"}, TypeError, "every"),
        ({"every": 60, "offset": -1}, ValueError, "offset"),
        ({"every": 60, "offset": 60}, ValueError, "offset"),
        ({"offset": 10}, ValueError, "give every"),
        ({"every": 60, "min_interval": 60}, ValueError, "min_interval"),
        ({"min_interval": 0}, ValueError, "min_interval"),
        ({"max_attempts": 2}, ValueError, "give every"),
        ({"every": 60, "max_attempts": 0}, ValueError, "max_attempts"),
        ({"every": 60, "max_attempts": True}, TypeError, "max_attempts"),
        ({"every": 60, "hold_at_least": 60}, ValueError, "hold_at_least"),
        ({"every": timedelta(days=400)}, ValueError, "every"),
        ({"ttl": 0}, ValueError, "ttl"),
        # Every duration a job stores is bounded, with an error naming it and the limit: 1e17 s
        # failed only in BSON's encoding, after the checks; 3e11 s was stored, and broke every
        # reader of the record (a date past the year 9999).
        ({"every": 1e17}, ValueError, r"every must be at most 366 days \(31622400 s\)"),
        ({"min_interval": 1e17}, ValueError, r"min_interval must be at most 366 days \(31622400 s\)"),
        ({"min_interval": 3e11}, ValueError, r"min_interval must be at most 366 days \(31622400 s\), got 3e\+11 s"),
        ({"min_interval": timedelta(days=367)}, ValueError, r"min_interval must be at most"),
        ({"hold_at_least": 1e17}, ValueError, r"hold_at_least must be at most 366 days \(31622400 s\)"),
        ({"hold_at_least": 3e11}, ValueError, r"hold_at_least must be at most"),
        ({"ttl": 1e17}, ValueError, r"ttl must be at most"),
        ({"every": 60, "offset": 1e17}, ValueError, "offset"),
    ],
)
async def test_bad_arguments_are_refused_before_any_io(
    counted_collection: Any,
    command_counter: CommandCounter,
    options: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        AsyncMongoJob(counted_collection, "job", **options)
    with pytest.raises(error, match=match):
        LockManager(counted_collection).run_once("job", **options)
    assert command_counter.names == []


def test_a_derived_job_name_warns_once_where_the_function_is_decorated(mongolock_collection: Any) -> None:
    async def nightly() -> None:
        pass

    locks = LockManager(mongolock_collection)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per place
        for _ in range(3):  # a decoration that runs again (in a lifespan, say) warns once
            run_once(mongolock_collection)(nightly)
        locks.run_once()(nightly)
        locks.run_once(wait=True)(nightly)
        run_once(mongolock_collection, "nightly")(nightly)  # named: nothing to say
        locks.run_once("nightly")(nightly)
    derived = [warning for warning in caught if issubclass(warning.category, DerivedJobNameWarning)]
    assert len(derived) == 3, [str(warning.message) for warning in caught]
    name = f"{__name__}.test_a_derived_job_name_warns_once_where_the_function_is_decorated.<locals>.nightly"
    assert all(f"the job name {name!r} is derived" in str(warning.message) for warning in derived)
    assert {warning.filename for warning in derived} == {__file__}, "it points at the decorating line"


async def test_a_skipped_call_logs_the_jobs_name(mongolock_collection: Any, caplog: pytest.LogCaptureFixture) -> None:
    @run_once(mongolock_collection, "digest-of-the-hour", every=3600, offset=period_midway(3600.0))
    async def digest() -> str:
        return "built"

    with caplog.at_level(logging.INFO, logger="mongolock_async"):
        assert await digest() == "built"
        assert await digest() is None
    lines = [record.getMessage() for record in caplog.records if record.levelno == logging.INFO]
    assert any(line.startswith("job 'digest-of-the-hour' skipped: done in the period from ") for line in lines), lines


async def test_run_once_with_wait_takes_no_job_options(mongolock_collection: Any) -> None:
    with pytest.raises(TypeError, match="every"):
        LockManager(mongolock_collection).run_once("job", wait=True, every=60)


async def test_the_command_line_shows_a_jobs_state(mongolock_uri: str, mongolock_collection: Any) -> None:
    # Midway through a period: what the run recorded is still this period's when the commands read it.
    job = AsyncMongoJob(
        mongolock_collection, "shown", every=timedelta(minutes=15), offset=period_midway(900.0), label="reporter"
    )

    async def fail() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        await job.run(fail)
    where = ["--uri", mongolock_uri, "--db", TEST_DATABASE, "--collection", mongolock_collection.name]

    def mongolock(*arguments: str) -> str:
        command = [sys.executable, "-m", "mongolock_async", *arguments, *where]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=child_environment(COLUMNS="120")
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    listing = await asyncio.to_thread(mongolock, "list")
    assert "shown" in listing and "due" in listing and "reporter" in listing, listing
    detail = await asyncio.to_thread(mongolock, "inspect", "shown")
    assert "every 15 min (offset " in detail and ", at most 3 attempts per period" in detail, detail
    assert "error     RuntimeError: disk full" in detail and "1 attempt so far" in detail, detail
    as_json = json.loads(await asyncio.to_thread(mongolock, "inspect", "shown", "--json"))
    assert as_json["kind"] == "job"
    assert as_json["job"]["last"]["error"] == {"type": "RuntimeError", "message": "disk full"}
    assert as_json["job"]["every_ms"] == 900_000 and as_json["job"]["attempts"] == 1


async def test_current_run_outside_a_job_says_so() -> None:
    with pytest.raises(LookupError, match="no job runs here"):
        current_run()


# Each replica calls every 0.25 s: a period without a digest takes a pause of most of its 1 s.
@pytest.mark.timing(margin=0.7)
@pytest.mark.parametrize("scheduler", ["loop", "apscheduler", "fastapi"])
async def test_the_periodic_example_builds_one_digest_per_period_on_three_replicas(
    mongolock_uri: str, pymongo_collection: Any, scheduler: str
) -> None:
    lock_collection = pymongo_collection
    database = f"jobs_{lock_collection.name}"
    where = {
        "MONGODB_URI": mongolock_uri,
        "JOBS_DATABASE": database,
        "MONGOLOCK_DB": TEST_DATABASE,
        "MONGOLOCK_COLLECTION": lock_collection.name,
    }
    command = [sys.executable, "-m", "mongolock_async.examples.periodic_job", "--scheduler", scheduler]

    def replicas() -> list[str]:
        arguments = [*command, "--every", "1", "--seconds", "6"]
        started = [
            subprocess.Popen(
                arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(**where)
            )
            for _ in range(3)
        ]
        outputs = []
        for process in started:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            outputs.append(out)
        return outputs

    outputs = await asyncio.to_thread(replicas)
    client = lock_collection.database.client
    try:
        digests = await client[database]["digests"].find().to_list(None)
    finally:
        await client.drop_database(database)
    counts = Counter(digest["period"] for digest in digests)
    first, last = min(counts), max(counts)
    periods = [first + n * timedelta(seconds=1) for n in range((last - first) // timedelta(seconds=1) + 1)]
    assert len(periods) >= 4 and all(counts[period] == 1 for period in periods), counts
    assert all("built the digests of" in out for out in outputs), outputs


@pytest.mark.timing(margin=1.2)  # the first run must start before the stop at 1.5 s
@pytest.mark.parametrize("scheduler", ["loop", "apscheduler", "fastapi"])
async def test_the_periodic_examples_schedulers_stop_between_runs_never_during_one(scheduler: str) -> None:
    # A run cut off on the way out leaves its period not done, and another replica builds that
    # period's digest again (seen once in a full test run, with the lifespan's cancel()).
    started, finished = asyncio.Event(), asyncio.Event()

    async def slow_run() -> None:
        started.set()
        await asyncio.sleep(3.0)
        finished.set()

    # It stops after 1.5 s, while the first run (from 0 s, or 0.25 s under APScheduler) goes on.
    await SCHEDULERS[scheduler](slow_run, 1.0, 1.5)
    assert started.is_set(), "no run started"
    assert finished.is_set(), "the run in progress was cut off on the way out"


@pytest.mark.timing(margin=2.2)  # the run's lease must be live when broken: renewed every 0.5 s, 2.7 s each
async def test_a_run_whose_lease_is_broken_by_force_is_cancelled_and_recorded_lost(mongolock_collection: Any) -> None:
    job = AsyncMongoJob(
        mongolock_collection, "broken", every=3600, offset=period_midway(3600.0), ttl=3.0, heartbeat=0.5
    )
    started = asyncio.Event()

    async def long_run() -> None:
        started.set()
        await asyncio.sleep(30)

    running = asyncio.create_task(job.run(long_run))
    await started.wait()
    operator = LockStore(mongolock_collection, WriteConcern(w="majority"))
    broken = await operator.force_release("broken")
    assert broken is not None and broken.owner is not None, "the run's lease was broken"
    with pytest.raises(LockLostError):
        await asyncio.wait_for(running, 10)  # the next renewal finds the lease gone
    state = await job.state()
    assert state is not None and not state.held and not state.done
    assert state.last is not None and state.last.outcome == "lost" and state.attempts == 1
