"""Side-by-side benchmarks, reported as ratios measured in one run on one machine.

1. Uncontended acquire + release: the library against a raw copy of the same two requests sent
   straight through the driver, interleaved; and connections created per acquisition.
2. A hot lock: 1 to 256 tasks over 1 and 4 processes take one lock in turn (2 ms bodies), with
   mongolock (default and ``fair=True``) and redis-py's asyncio Lock on a local Redis (its default
   0.1 s polling, and 5 ms polling): acquisitions/s, server round trips per acquisition, wait
   p50/p99, per-task min/max acquisitions, connections created.
3. Cross-process hand-off latency: two processes, one task each, alternating.
4. PyMongo's async client against Motor, uncontended.
5. The cycle's figures, each against its raw counterpart measured in the same run (and with
   ``--baseline``, the same for another checkout of the library): the raw acquire + release pair
   rate of one client; a hot lock of 64 tasks over 4 processes against it; the cross-process
   hand-off p50 against a ``findAndModify`` round trip as the driver timed it in those runs.
   ``--figures`` runs this part alone.

    python benchmarks/bench.py [--uri URI] [--redis-server PATH] [--seconds 5] [--cycles 300]
                               [--baseline DIR] [--figures]

Without ``--uri``/``MONGODB_URI`` it starts the embedded server; Redis is started (and stopped) on a
free port from ``redis-server``. It prints the environment first, and writes the hot-lock and
hand-off figures to benchmarks/charts/bench.json, which benchmarks/plots.py draws.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from _common import environment, mongodb  # benchmarks/ is on sys.path when this runs as a script
from hot_lock_worker import Requests
from pymongo import ReturnDocument

from mongolock_async import AsyncMongoLock
from mongolock_async._util.process import die_with_parent
from mongolock_async.testing.clients import close_client, make_client

WORKER = Path(__file__).resolve().with_name("hot_lock_worker.py")
CHARTS = Path(__file__).resolve().with_name("charts")
ROUND_TRIPS = ("findAndModify", "update", "find", "aggregate", "killCursors", "insert", "delete")
BACKENDS = ("mongolock", "mongolock-fair", "redis", "redis-fast")


async def medians(actions: dict[str, Callable[[], Awaitable[Any]]], rounds: int) -> dict[str, float]:
    """Median seconds per action, the actions interleaved round by round so that noise hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(rounds):
        for name, action in actions.items():
            started = time.perf_counter()
            await action()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def raw_cycle(collection: Any) -> Callable[[], Awaitable[None]]:
    """The same two requests ``async with lock:`` sends (a blocking acquire, which would queue a
    place if the lock were held; a release), built by the same code, sent directly."""
    # Imported here: other scripts import this module to run a baseline checkout of the library,
    # whose store may be laid out otherwise.
    from mongolock_async.store import PlaceRequest
    from mongolock_async.store.mutex import acquire_pipeline, release_pipeline

    holder = {"host": socket.gethostname(), "pid": os.getpid(), "label": None}

    async def raw() -> None:
        owner = secrets.token_hex(24)
        await collection.find_one_and_update(
            {"_id": "raw"},
            acquire_pipeline(PlaceRequest(owner, 30_000, holder), enqueue=True, fair=False),
            upsert=True,
            return_document=ReturnDocument.AFTER,
        )
        await collection.find_one_and_update(
            {"_id": "raw", "owner": owner},
            release_pipeline(owner, None, fair=False, successor_first=True),
            return_document=ReturnDocument.AFTER,
        )

    return raw


async def raw_pair_rate(uri: str, seconds: float) -> float:
    """Raw acquire + release pairs per second of one client sending them back to back."""
    client = make_client("pymongo", uri)
    try:
        raw = raw_cycle(client["bench"][f"raw_{uuid.uuid4().hex[:6]}"])
        await raw()
        pairs, stop_at = 0, time.monotonic() + seconds
        while time.monotonic() < stop_at:
            await raw()
            pairs += 1
        return pairs / seconds
    finally:
        await close_client(client)


async def uncontended_against_raw(uri: str, cycles: int) -> None:
    connections = Requests()
    client = make_client("pymongo", uri, event_listeners=[connections])
    try:
        collection = client["bench"][f"cycle_{uuid.uuid4().hex[:6]}"]
        lock = AsyncMongoLock(collection, "cycle", ttl=30.0)
        raw = raw_cycle(collection)

        async def library() -> None:
            async with lock:
                pass

        await library()
        await raw()
        connections.reset()
        result = await medians({"library": library, "raw": raw}, cycles)
        print(
            f"uncontended acquire+release: library {result['library'] * 1000:6.2f} ms | raw same two requests "
            f"{result['raw'] * 1000:6.2f} ms | library/raw {result['library'] / result['raw']:4.2f}x | "
            f"connections created after warm-up: {connections.connections_created} in {2 * cycles} cycles  "
            f"(medians of {cycles})"
        )
    finally:
        await close_client(client)


@dataclass
class Run:
    backend: str
    processes: int
    tasks: int
    seconds: float
    results: list[dict[str, Any]]
    redis_calls: int | None

    @property
    def acquisitions(self) -> int:
        return sum(sum(result["counts"]) for result in self.results)

    def round_trips(self) -> float:
        """Server round trips per acquisition (for mongolock, not counting empty getMores)."""
        acquisitions = max(1, self.acquisitions)
        if self.redis_calls is not None:
            return self.redis_calls / acquisitions
        sent = sum(result["sent"].get(name, 0) for result in self.results for name in ROUND_TRIPS)
        events = sum(result["events"] for result in self.results)
        return (sent + events) / acquisitions

    def figures(self) -> dict[str, Any]:
        waits = sorted(wait for result in self.results for wait in result["waits"])
        return {
            "backend": self.backend,
            "processes": self.processes,
            "tasks": self.tasks,
            "acquisitions_per_second": round(self.acquisitions / self.seconds, 1),
            "round_trips_per_acquisition": round(self.round_trips(), 2),
            "wait_p50_ms": round(_percentile(waits, 50) * 1000, 1),
            "wait_p99_ms": round(_percentile(waits, 99) * 1000, 1),
        }

    def row(self) -> str:
        counts = [count for result in self.results for count in result["counts"]]
        waits = sorted(wait for result in self.results for wait in result["waits"])
        acquisitions = max(1, self.acquisitions)
        trips = self.round_trips()
        if self.redis_calls is not None:
            extra, created = "", "-"
        else:
            empty = sum(result["empty_get_mores"] for result in self.results)
            extra = f" (+{empty / acquisitions:4.1f} empty)"
            created = str(sum(result["connections_created"] for result in self.results))
        return (
            f"{self.backend:15} {self.processes:>2} x {self.tasks // self.processes:<3} {self.tasks:>4} tasks | "
            f"{self.acquisitions / self.seconds:7.1f} acq/s | {trips:5.2f} round trips/acq{extra} | "
            f"wait p50 {_percentile(waits, 50) * 1000:7.1f} ms p99 {_percentile(waits, 99) * 1000:8.1f} ms | "
            f"per task min {min(counts):4} max {max(counts):4} | connections created {created}"
        )


def _percentile(values: list[float], percent: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * percent / 100))]


WARMUP = 1.0
"""Seconds of each hot-lock run not counted: each process opens its change stream and makes its
first attempts then, a fixed cost that a 5-second run would spread over too few acquisitions."""


def run_workers(
    backend: str,
    uri: str,
    processes: int,
    tasks: int,
    seconds: float,
    body_ms: float,
    library: str | None = None,
    at_measure_start: Callable[[], None] | None = None,
) -> list[Any]:
    """Run the workload in ``processes`` worker processes, counting ``seconds`` after a warm-up of
    :data:`WARMUP`, when ``at_measure_start`` is called; ``library`` is another checkout of this
    library to run instead of this one (a baseline)."""
    name = f"hot_{uuid.uuid4().hex[:8]}"
    worker_environment = dict(os.environ)
    if library is not None:
        worker_environment["PYTHONPATH"] = library
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), backend, uri, name, str(tasks // processes), str(WARMUP), str(seconds),
             str(start_at), str(body_ms)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=library or WORKER.parent.parent,
            env=worker_environment,
            preexec_fn=die_with_parent,
        )
        for _ in range(processes)
    ]  # fmt: skip
    if at_measure_start is not None:
        time.sleep(max(0.0, start_at + WARMUP - time.monotonic()))
        at_measure_start()
    results = []
    for worker in workers:
        out, _ = worker.communicate(timeout=WARMUP + seconds + 120)
        if worker.returncode != 0:
            raise RuntimeError(f"a {backend} worker failed (exit {worker.returncode})")
        results.append(json.loads(out))
    return results


def hot_lock(mongo_uri: str | None, redis: RedisServer, seconds: float) -> dict[tuple[str, int, int], Run]:
    runs = {}
    marks: list[int] = []  # Redis's command count when a run's measurement starts

    def mark_calls() -> None:
        marks.append(redis.calls())

    for processes in (1, 4):
        for tasks in (1, 4, 16, 64, 256):
            if tasks < processes:
                continue
            for backend in BACKENDS:
                redis_calls = None
                if backend.startswith("redis"):
                    results = run_workers(backend, redis.uri, processes, tasks, seconds, body_ms=2,
                                          at_measure_start=mark_calls)  # fmt: skip
                    redis_calls = redis.calls() - marks.pop()
                else:
                    with mongodb(mongo_uri) as uri:
                        results = run_workers(backend, uri, processes, tasks, seconds, body_ms=2)
                run = runs[backend, processes, tasks] = Run(backend, processes, tasks, seconds, results, redis_calls)
                print(run.row(), flush=True)
    return runs


def hand_off_latency(backend: str, uri: str, seconds: float, library: str | None = None) -> list[float]:
    """Seconds from one process leaving its critical section to the other entering its own."""
    return _hand_offs(run_workers(backend, uri, 2, 2, seconds, body_ms=20, library=library))


def _hand_offs(results: list[Any]) -> list[float]:
    sections = sorted(
        (entered, left, process) for process, result in enumerate(results) for entered, left in result["sections"]
    )
    return [later[0] - earlier[1] for earlier, later in itertools.pairwise(sections) if earlier[2] != later[2]]


def cycle_figures(mongo_uri: str | None, seconds: float, baseline: str | None) -> None:
    """Part 5: the hot lock at 64 tasks over 4 processes against the raw pair rate of one client, and
    the cross-process hand-off against a round trip, each run on a fresh server, this library and the
    baseline taking turns (two rounds each, so that a server's slowing does not favour either)."""
    libraries = {"mongolock": None, **({"baseline": baseline} if baseline else {})}
    rates: dict[str, list[float]] = {name: [] for name in ("raw", *libraries)}
    hand_offs: dict[str, list[float]] = {name: [] for name in libraries}
    round_trips: dict[str, list[float]] = {name: [] for name in libraries}
    for _ in range(2):
        with mongodb(mongo_uri) as uri:
            rates["raw"].append(asyncio.run(raw_pair_rate(uri, seconds)))
        for name, library in libraries.items():
            with mongodb(mongo_uri) as uri:
                results = run_workers("mongolock", uri, 4, 64, seconds, body_ms=2, library=library)
            rates[name].append(sum(sum(result["counts"]) for result in results) / seconds)
            with mongodb(mongo_uri) as uri:
                results = run_workers("mongolock", uri, 2, 2, seconds, body_ms=20, library=library)
            hand_offs[name] += _hand_offs(results)
            round_trips[name] += [trip for result in results for trip in result.get("find_and_modify_seconds", [])]
    raw = statistics.mean(rates["raw"])
    print(f"raw acquire + release pairs of one client: {raw:7.1f} /s (runs: {_listed(rates['raw'])})")
    for name in libraries:
        rate = statistics.mean(rates[name])
        print(f"{name:10} hot lock 4 x 16 (2 ms bodies): {rate:7.1f} acq/s (runs: {_listed(rates[name])}) | "
              f"against the raw pair rate {rate / raw:4.2f}x")  # fmt: skip
    for name in libraries:
        trip = statistics.median(round_trips[name]) * 1000
        samples = sorted(hand_offs[name])
        p50 = _percentile(samples, 50) * 1000
        print(f"{name:10} hand-off p50 {p50:6.1f} ms p99 {_percentile(samples, 99) * 1000:6.1f} ms "
              f"({len(samples)} hand-offs) | findAndModify round trip p50 {trip:5.1f} ms | "
              f"p50 - round trip {p50 - trip:5.1f} ms")  # fmt: skip


def _listed(values: list[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in values)


async def driver_cycle(uri: str, driver: str, cycles: int) -> float:
    client = make_client(driver, uri)
    try:
        lock = AsyncMongoLock(client["bench"][f"cycle_{uuid.uuid4().hex[:6]}"], "cycle", ttl=30.0)

        async def one() -> None:
            async with lock:
                pass

        await one()
        return (await medians({"cycle": one}, cycles))["cycle"]
    finally:
        await close_client(client)


class RedisServer:
    """A throwaway Redis server on a free port, for the peer benchmark."""

    def __init__(self, executable: str) -> None:
        self._executable = executable
        self._directory = Path(tempfile.mkdtemp(prefix="mongolock-bench-redis-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._process = subprocess.Popen(
            [executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self._directory)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.uri = f"redis://127.0.0.1:{self.port}/0"
        self.version = subprocess.run([executable, "--version"], capture_output=True, text=True).stdout.split()[2]
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def calls(self) -> int:
        """Commands the server has run (INFO commandstats), not counting INFO itself."""
        import redis

        with redis.Redis.from_url(self.uri) as client:
            stats = client.info("commandstats")
        return sum(entry["calls"] for command, entry in stats.items() if command != "cmdstat_info")

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)
        shutil.rmtree(self._directory, ignore_errors=True)


async def report_environment(uri: str, given_uri: str | None, redis: RedisServer) -> str:
    client = make_client("pymongo", uri)
    try:
        info = await client.admin.command("buildInfo")
    finally:
        await close_client(client)
    line = environment(
        given_uri,
        f"server reports {info.get('version')}",
        f"motor {version('motor')}",
        f"redis-py {version('redis')}",
        f"redis-server {redis.version}",
    )
    print(line)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each hot-lock run")
    parser.add_argument("--cycles", type=int, default=300, help="uncontended cycles per variant")
    parser.add_argument(
        "--baseline", help="another checkout of this library (e.g. the previous release) to measure side by side"
    )
    parser.add_argument("--figures", action="store_true", help="run part 5 (the cycle's figures) alone")
    arguments = parser.parse_args()
    redis = RedisServer(arguments.redis_server)
    try:
        with mongodb(arguments.uri) as uri:
            where = asyncio.run(report_environment(uri, arguments.uri, redis))
        if arguments.figures:
            print("\n== the cycle's figures ==")
            cycle_figures(arguments.uri, arguments.seconds, arguments.baseline)
            return
        print("\n== uncontended ==")
        with mongodb(arguments.uri) as uri:
            asyncio.run(uncontended_against_raw(uri, arguments.cycles))
        print("\n== hot lock: one name, 2 ms bodies; round trips counted by command monitoring / INFO ==")
        runs = hot_lock(arguments.uri, redis, arguments.seconds)
        print("\n== ratios ==")
        for processes in (1, 4):
            base, hot = runs["mongolock", processes, 4], runs["mongolock", processes, 64]
            print(f"mongolock {processes} process(es): acq/s at 64 tasks / at 4 tasks = "
                  f"{hot.acquisitions / max(1, base.acquisitions):4.2f}x")  # fmt: skip
            peer = runs["redis-fast", processes, 64]
            print(f"mongolock / redis-py (5 ms polling) acq/s at 64 tasks, {processes} process(es): "
                  f"{hot.acquisitions / max(1, peer.acquisitions):4.2f}x")  # fmt: skip
        print("\n== cross-process hand-off: 2 processes x 1 task, 20 ms bodies ==")
        latency = {}
        for backend in (*BACKENDS, *(["baseline"] if arguments.baseline else [])):
            if backend.startswith("redis"):
                latency[backend] = hand_off_latency(backend, redis.uri, arguments.seconds)
                continue
            with mongodb(arguments.uri) as uri:
                library = arguments.baseline if backend == "baseline" else None
                name = "mongolock" if backend == "baseline" else backend
                latency[backend] = hand_off_latency(name, uri, arguments.seconds, library)
        for backend, samples in latency.items():
            samples.sort()
            print(f"{backend:15} p50 {_percentile(samples, 50) * 1000:6.1f} ms | "
                  f"p99 {_percentile(samples, 99) * 1000:6.1f} ms | {len(samples)} hand-offs")  # fmt: skip
        for other in ("redis", "baseline"):
            if latency.get(other):
                ratio = statistics.median(latency[other]) / statistics.median(latency["mongolock"])
                print(f"{other} p50 / mongolock p50: {ratio:4.2f}x")
        CHARTS.mkdir(exist_ok=True)
        figures = {
            "environment": where,
            "seconds": arguments.seconds,
            "hot_lock": [run.figures() for run in runs.values()],
            "hand_off_ms": {name: [round(value * 1000, 2) for value in samples] for name, samples in latency.items()},
        }
        (CHARTS / "bench.json").write_text(json.dumps(figures, indent=1) + "\n")
        print(f"(these figures are in {CHARTS / 'bench.json'}: benchmarks/plots.py draws them)")
        print("\n== drivers, uncontended ==")
        with mongodb(arguments.uri) as uri:
            pymongo_cycle = asyncio.run(driver_cycle(uri, "pymongo", arguments.cycles))
            motor_cycle = asyncio.run(driver_cycle(uri, "motor", arguments.cycles))
        print(f"acquire+release: pymongo {pymongo_cycle * 1000:6.2f} ms | motor {motor_cycle * 1000:6.2f} ms | "
              f"motor/pymongo {motor_cycle / pymongo_cycle:5.2f}x  (medians of {arguments.cycles})")  # fmt: skip
        print("\n== the cycle's figures ==")
        cycle_figures(arguments.uri, arguments.seconds, arguments.baseline)
    finally:
        redis.close()


if __name__ == "__main__":
    main()
