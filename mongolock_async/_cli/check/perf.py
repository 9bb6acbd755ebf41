"""``mongolock check --perf``: what a lock costs on this deployment, as ratios to the raw driver.

Each figure is measured side by side with the raw driver requests it should be compared with, on
the same client, as ``benchmarks/bench.py`` does: the library's cost is what it adds to them.
Everything runs on lock names under the check's scratch prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..._core.lock import AsyncMongoLock
from ..._runtime.keeper import RENEWAL_CHUNK
from ...errors import LockTimeoutError
from ...store import Renewal
from ...store.probe import DeploymentProbe
from .verdicts import (
    Check,
    judge_hand_off,
    judge_hot_lock,
    judge_renewal,
    judge_sustained_load,
    judge_uncontended,
    skipped,
)

HAND_OFF_BOUND = 10.0
"""Seconds a waiter on another connection is given to be woken by a release."""
_SEED_CONCURRENCY = 16
_SEED_TTL_MS = 3_600_000  # the seeded leases must outlive the measurement, whatever --ttl says


@dataclass(frozen=True, slots=True)
class PerfOptions:
    """How much ``--perf`` measures (the defaults finish in well under a minute on the embedded
    test server, which spends about 3 ms of CPU per written document)."""

    cycles: int = 100
    """Uncontended acquire + release cycles (and as many raw ones, interleaved)."""
    hand_offs: int = 30
    """Hand-offs across connections (and as many raw change events)."""
    seconds: float = 2.0
    """Length of each hot-lock window (after a warm-up of a quarter of it, at most 0.5 s)."""
    tasks: tuple[int, ...] = (1, 8, 64)
    """Waiting tasks of the hot-lock windows."""
    leases: int = 1000
    """Leases renewed in the heartbeat measurement."""
    load_seconds: float = 10.0
    """Length of the sustained load (``--perf-duration``): long enough for a p99 that is not the
    largest of a few samples."""
    load_tasks: int = 4
    """Tasks of the sustained load, each on a scratch name of its own."""


def holder_of_check() -> dict[str, Any]:
    """How the check's scratch leases name their holder to operators."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "label": "mongolock check"}


async def measure(
    probe: DeploymentProbe,
    other_client: Any,
    prefix: str,
    ttl: float,
    options: PerfOptions,
    step: Callable[[str], None],
    *,
    change_streams: bool = True,
) -> list[Check]:
    """Every ``--perf`` figure, each judged against its raw counterpart (the hand-off only where
    ``change_streams`` work)."""
    step(f"perf: uncontended acquire + release, {options.cycles} cycles")
    uncontended, raw_rate = await uncontended_cycles(probe, prefix, ttl, options.cycles)
    if change_streams:
        step(f"perf: {options.hand_offs} hand-offs across connections")
        raw_events = await raw_change_events(probe, other_client, prefix + "raw-event", options.hand_offs)
        hand_offs = await hand_off_latencies(probe, other_client, prefix + "hand-off", ttl, options.hand_offs)
        hand_off = judge_hand_off(hand_offs, raw_events)
    else:
        hand_off = skipped("perf", "hand-off", "no change streams here to compare with (waiters poll)")
    rates = {}
    for tasks in options.tasks:
        step(f"perf: hot lock, {tasks} tasks, {options.seconds:g} s")
        rates[tasks] = await hot_lock_rate(probe, f"{prefix}hot-{tasks}", ttl, tasks, options.seconds)
    step(f"perf: heartbeat renewal of {options.leases} leases")
    library, raw = await renewal_times(probe, prefix, options.leases, step)
    step(f"perf: sustained load, {options.load_tasks} tasks for {options.load_seconds:g} s")
    load, raw_load = await sustained_load(probe, prefix, ttl, options.load_seconds, options.load_tasks)
    return [
        uncontended,
        hand_off,
        judge_hot_lock(rates, raw_rate),
        judge_renewal(options.leases, library, raw, ttl),
        judge_sustained_load(load, raw_load, options.load_seconds, options.load_tasks, ttl),
    ]


async def sustained_load(
    probe: DeploymentProbe, prefix: str, ttl: float, seconds: float, tasks: int
) -> tuple[list[float], list[float]]:
    """Seconds per ``async with lock:`` (acquire + release) and per raw acquire + release, for
    ``seconds``, by ``tasks`` tasks at once, each taking turns between the two on scratch names of
    its own: a load held long enough that its p99 is a percentile, not the slowest of twenty."""
    holder = holder_of_check()
    ttl_ms = round(ttl * 1000)
    library: list[float] = []
    raw: list[float] = []
    ends_at = time.perf_counter() + seconds

    async def load(task: int) -> None:
        lock = AsyncMongoLock(probe.lock_collection, f"{prefix}load-{task}", ttl=ttl)
        while time.perf_counter() < ends_at:
            started = time.perf_counter()
            async with lock:
                pass
            library.append(time.perf_counter() - started)
            started = time.perf_counter()
            await probe.raw_acquire_release(f"{prefix}load-raw-{task}", holder, ttl_ms)
            raw.append(time.perf_counter() - started)

    await _together([load(task) for task in range(tasks)])
    return library, raw


async def _together(work: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` as tasks at once until all are done; the first failure cancels the others
    (a lost server: they would each ride out their own server selection timeout) and is raised
    once they have ended, as ``hot_lock_rate``'s tasks end."""
    tasks = [asyncio.create_task(each) for each in work]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        _raise_if_failed(tasks)
    finally:
        running = await _cancelled(tasks)
    if running:
        raise _still_running(running, tasks)


async def uncontended_cycles(probe: DeploymentProbe, prefix: str, ttl: float, cycles: int) -> tuple[Check, float]:
    """``async with lock:`` against its two requests sent raw, and a ``ping``, interleaved cycle by
    cycle on one client (so one pooled connection serves them all); the check, and the raw
    requests' rate (cycles per second, from their total time: a throughput, as the hot lock's)."""
    lock = AsyncMongoLock(probe.lock_collection, prefix + "uncontended", ttl=ttl)
    holder = holder_of_check()
    ttl_ms = round(ttl * 1000)

    async def library() -> None:
        async with lock:
            pass

    async def raw() -> None:
        await probe.raw_acquire_release(prefix + "uncontended-raw", holder, ttl_ms)

    samples = await _interleaved({"library": library, "raw": raw, "ping": probe.ping}, cycles)
    raw_rate = len(samples["raw"]) / sum(samples["raw"])
    return judge_uncontended(samples["library"], samples["raw"], samples["ping"]), raw_rate


async def _interleaved(
    actions: dict[str, Callable[[], Awaitable[Any]]], rounds: int, *, warm_up: bool = True
) -> dict[str, list[float]]:
    """Seconds per call of each action, the actions taking turns so that noise hits all alike;
    with ``warm_up``, after one call each that is not counted."""
    for action in actions.values() if warm_up else ():
        await action()
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(rounds):
        for name, action in actions.items():
            started = time.perf_counter()
            await action()
            samples[name].append(time.perf_counter() - started)
    return samples


async def raw_change_events(probe: DeploymentProbe, other_client: Any, name: str, count: int) -> list[float]:
    """Seconds from sending a plain majority write to its change event arriving on another
    client's stream: the raw trip a hand-off rides on."""
    latencies = []
    async with probe.watching(name, other_client) as stream:
        for _ in range(count):
            started = time.perf_counter()
            await probe.raw_touch(name)
            await next_event(stream, HAND_OFF_BOUND)
            latencies.append(time.perf_counter() - started)
    return latencies


async def next_event(stream: Any, bound: float) -> Any:
    """The stream's next change event; TimeoutError after ``bound`` seconds without one."""
    async with asyncio.timeout(bound):
        while True:
            event = await stream.try_next()
            if event is not None:
                return event


async def hand_off_latencies(
    probe: DeploymentProbe, other_client: Any, name: str, ttl: float, count: int
) -> list[float]:
    """Seconds from a holder's release to the grant of a waiter on another client (its own
    connections, its own change stream), ``count`` times, the two taking turns, after one hand-off
    each way that is not counted (a client's first wait opens its change stream). TimeoutError if a
    waiter is not woken within ``HAND_OFF_BOUND``."""
    ends = [
        AsyncMongoLock(probe.lock_collection, name, ttl=ttl),
        AsyncMongoLock(other_client[probe.database.name][probe.collection.name], name, ttl=ttl),
    ]
    holder, waiter = ends
    await holder.acquire()
    latencies = []
    try:
        for _ in range(count + 2):
            waiting = asyncio.create_task(waiter.acquire(timeout=HAND_OFF_BOUND))
            try:
                await _until_queued(probe, name, waiting)
                started = time.perf_counter()
                await holder.release()
                if not await waiting:
                    raise TimeoutError(f"a waiter on another connection was not woken within {HAND_OFF_BOUND:g} s")
            except BaseException:
                waiting.cancel()
                with contextlib.suppress(BaseException):
                    await waiting
                raise
            latencies.append(time.perf_counter() - started)
            holder, waiter = waiter, holder
    finally:
        with contextlib.suppress(Exception):
            await holder.release()
    return latencies[2:]


async def _until_queued(probe: DeploymentProbe, name: str, waiting: asyncio.Task[bool]) -> None:
    """Until the waiter's place is stored with the lock (its attempt failed and queued it), so
    that the release hands the lease to it."""
    async with asyncio.timeout(HAND_OFF_BOUND):
        while not waiting.done():
            state = await probe.store.read(name)
            if state is not None and state.queue:
                return
            await asyncio.sleep(0.005)
    await waiting  # it ended before queueing: let its error (or result) show


async def hot_lock_rate(probe: DeploymentProbe, name: str, ttl: float, tasks: int, seconds: float) -> float:
    """Acquisitions per second of one name by ``tasks`` tasks of one client that take it in turn
    (empty critical sections), counted over ``seconds`` after a warm-up.

    When the window closes the tasks stop by themselves, each after its current turn (an acquire
    is bounded by ``HAND_OFF_BOUND``); those still running ``STOP_BOUND`` seconds later are
    cancelled, and one that outlives its cancellation by as long is reported (RuntimeError), not
    waited for. A lost server ends the window at once, with the driver's error: a task's first
    failure is raised, and whenever ``STALL_BOUND`` seconds pass without a turn taken a ``ping``
    asks whether the server is still there (a release retries until its lease expires, a TTL
    later: waiting for the tasks to say so is waiting that long). The others are cancelled then."""
    counting = stopping = False
    count = turns = 0

    async def take_turns(lock: AsyncMongoLock) -> None:
        nonlocal count, turns
        while not stopping:
            try:
                async with lock:
                    if counting:
                        count += 1
            except LockTimeoutError as error:
                if error.unreachable is not None:
                    raise  # not a long queue: MongoDB could not be reached
                continue  # a long queue under a slow server: take the next turn, or stop
            turns += 1

    workers = [
        asyncio.create_task(
            take_turns(AsyncMongoLock(probe.lock_collection, name, ttl=ttl, timeout=HAND_OFF_BOUND))
        )
        for _ in range(tasks)
    ]
    try:
        await _watched(probe, workers, min(0.5, seconds / 4), lambda: turns)
        counting = True
        started = time.perf_counter()
        await _watched(probe, workers, seconds, lambda: turns)
        counting = False
        elapsed = time.perf_counter() - started
        stopping = True
        await _watched(probe, workers, STOP_BOUND, lambda: turns)
    finally:
        stopping = True
        running = await _cancelled(workers)
    if running:
        raise _still_running(running, workers)
    return count / elapsed


STOP_BOUND = 2 * HAND_OFF_BOUND
"""Seconds the hot-lock tasks get to stop after their window, and again after a cancellation."""
STALL_BOUND = 1.0
"""Seconds without a hot-lock turn taken after which a ``ping`` asks whether the server is
still there (it is, however slow: one request; it is not: the driver's error, after the
client's server selection timeout; it does not answer: ``TimeoutError`` after ``STOP_BOUND``)."""


async def _watched(
    probe: DeploymentProbe, workers: list[asyncio.Task[None]], seconds: float, turns: Callable[[], int]
) -> None:
    """Wait ``seconds``, or until every worker has ended; raise a worker's failure as soon as
    there is one, and the driver's error if a ``ping`` sent after ``STALL_BOUND`` seconds without
    a turn taken finds the server unreachable."""
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + seconds
    taken = turns()
    while (left := ends_at - loop.time()) > 0:
        _, running = await asyncio.wait(workers, timeout=min(left, STALL_BOUND), return_when=asyncio.FIRST_EXCEPTION)
        _raise_if_failed(workers)
        if not running:
            return
        if turns() == taken and loop.time() < ends_at:
            await _ping(probe)
        taken = turns()


async def _ping(probe: DeploymentProbe) -> None:
    """A ``ping``, for at most ``STOP_BOUND`` seconds: a server that is there but stopped answering
    (paused, not gone) would hold it up for ever (the client has no socket timeout by default)."""
    try:
        async with asyncio.timeout(STOP_BOUND):
            await probe.ping()
    except TimeoutError as error:
        raise TimeoutError(f"MongoDB did not answer a ping within {STOP_BOUND:g} s, no lock taken meanwhile") from error


async def _cancelled(workers: list[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
    """Cancel the workers still running and wait up to ``STOP_BOUND`` for them to end (a request
    in flight finishes first, within its bound); those still running then. The failures are read:
    the first one is raised by the caller, the others tell the same story (a server gone); unread,
    asyncio would print each with its traceback when it is collected."""
    running = {worker for worker in workers if not worker.done()}
    for worker in running:
        worker.cancel()
    if running:
        _, running = await asyncio.wait(running, timeout=STOP_BOUND)
    for worker in workers:
        if worker.done() and not worker.cancelled():
            worker.exception()
    return running


def _still_running(running: set[asyncio.Task[None]], workers: list[asyncio.Task[None]]) -> RuntimeError:
    return RuntimeError(
        f"{len(running)} of {len(workers)} tasks were still running {STOP_BOUND:g} s after they were cancelled"
    )


def _raise_if_failed(workers: list[asyncio.Task[None]]) -> None:
    for worker in workers:
        if worker.done() and not worker.cancelled() and worker.exception() is not None:
            raise worker.exception()  # type: ignore[misc]


async def renewal_times(
    probe: DeploymentProbe, prefix: str, leases: int, step: Callable[[str], None]
) -> tuple[float, float]:
    """Seconds to renew ``leases`` leases once, with the heartbeat's own request (``LockStore.renew``,
    chunks of ``RENEWAL_CHUNK``, one after another as the keeper sends them) and with raw update
    batches of the same chunks; the better of two rounds each, taking turns. The leases are taken
    first with the library's acquire."""
    holder = holder_of_check()
    owned = [(f"{prefix}lease-{index}", secrets.token_hex(16)) for index in range(leases)]
    gate = asyncio.Semaphore(_SEED_CONCURRENCY)
    seeded = 0

    async def take(name: str, owner: str) -> None:
        nonlocal seeded
        async with gate:
            state = await probe.store.try_acquire(name, owner, _SEED_TTL_MS, holder)
        if state.owner != owner:
            raise RuntimeError(f"the scratch lease {name!r} was not taken")
        seeded += 1
        if seeded % 100 == 0:
            step(f"perf: heartbeat renewal, {seeded} of {leases} leases taken")

    await _together([take(name, owner) for name, owner in owned])
    chunks = [owned[start : start + RENEWAL_CHUNK] for start in range(0, leases, RENEWAL_CHUNK)]

    async def library() -> None:
        for chunk in chunks:
            await probe.store.renew([Renewal(name, owner, _SEED_TTL_MS) for name, owner in chunk])

    async def raw() -> None:
        for chunk in chunks:
            await probe.raw_renew([(name, owner, _SEED_TTL_MS) for name, owner in chunk])

    step(f"perf: heartbeat renewal of {leases} leases, library and raw in turn")
    samples = await _interleaved({"library": library, "raw": raw}, 2, warm_up=False)
    return min(samples["library"]), min(samples["raw"])

