"""Many names: what an acquisition costs when tasks take names drawn from a pool, side by side with
the raw requests, and what the change streams cost as more processes keep one open.

    .venv/bin/python benchmarks/many_names.py [--uri URI] [--pools 10 1000 100000] [--seconds 20] [--warmup 30]
                                              [--streams 1 2 4 8 16] [--sweep-pool 1000] [--sweep-seconds 20]

1. For each pool size K, on a fresh server and collection, PROCESSES x TASKS tasks (4 x 64) take
   names drawn uniformly from K names, in four phases of SECONDS each (after WARMUP seconds):
   the library (``async with lock:``, empty body), the raw ``findAndModify`` pair sent by the same
   processes at the same concurrency (both requests sent whatever the first one found, never
   waiting: the rate at which the server answers two requests per acquisition), raw, and the
   library again (ABBA: the collection grows during the run, which slows every request on the
   embedded server, and the order spreads that evenly). Printed: acquisitions per second and the
   ratio library/raw pairs, requests per acquisition (command monitoring in every worker, summed; the
   change stream's ``getMore``s and ``aggregate``s counted apart), change-stream events delivered
   to each process per acquisition (and of them, those that named no lock the process waited for),
   the server's CPU per acquisition, and the collection's size at the end. Names are created on
   first use, so the collection holds only the names used so far.
2. The streams sweep: on a fresh server per point, 1, 2, 4, 8 and 16 more processes each keep a
   change stream open (one task waits for a name held for the whole run), while the same 4 x 64
   tasks take names from SWEEP_POOL names with the library. Printed: the server's CPU per
   acquisition, and the events delivered per acquisition to each listening process.

The server's work is its process's CPU time (user + system, ``/proc/PID/stat``), read at the start
and end of each measured window: it counts everything the server does for the requests and the
streams (matching events, sending batches, answering getMores), where counting commands would miss
the work of matching events that no one is sent. Only with the embedded server (with ``--uri`` it
is not printed). The embedded server's ``findAndModify`` scans the collection (see
``collection_size.py``), so its absolute figures fall as the collection grows; the ratios are
measured side by side. The figures go to benchmarks/charts/many_names.json (plots.py draws them);
a run without one part (``--streams`` or ``--pools`` given nothing) keeps that part's last figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import cpu_seconds, environment, start_worker  # benchmarks/ is on sys.path when this runs as a script
from many_names_worker import DATABASE, PARKED
from pymongo import AsyncMongoClient

from mongolock_async.store import PlaceRequest
from mongolock_async.store.mutex import acquire_pipeline
from mongolock_async.testing import EmbeddedMongo

WORKER = Path(__file__).resolve().with_name("many_names_worker.py")
CHARTS = Path(__file__).resolve().with_name("charts")
PROCESSES, TASKS = 4, 64
GAP = 0.5
"""Seconds from every worker's end of one phase to the next one's start."""
WARMUP = 30.0
"""Seconds of each phase not counted (``--warmup``): every phase starts with no request in flight,
and on the embedded server 256 requests in flight wait several seconds each."""
STREAM_COMMANDS = ("getMore", "aggregate", "killCursors")


def run_phases(
    uri: str,
    pid: int | None,
    collection: str,
    pool: int,
    kinds: Sequence[str],
    seconds: float,
    listeners: int = 0,
    warmup: float = WARMUP,
) -> tuple[list[list[Counter[str]]], list[list[Counter[str]]], list[float | None]]:
    """Run one phase per kind in PROCESSES workers (and ``listeners`` listening processes), each
    phase starting once every worker finished the last: each worker's and each listener's counts
    per phase, and the server's CPU seconds in each phase's measured window (None without a
    server process)."""
    with tempfile.TemporaryDirectory(prefix="many-names-") as directory:
        barrier = Path(directory)
        arguments = [collection, str(pool), str(TASKS), ",".join(kinds), directory]
        workers = [start_worker(WORKER, ["work", *arguments], uri) for _ in range(PROCESSES)]
        listening = [start_worker(WORKER, ["listen", *arguments], uri) for _ in range(listeners)]
        cpu: list[float | None] = []
        for process in [*workers, *listening]:  # each one started and connected
            _wait_for(barrier / f"ready-{process.pid}", process, "start")
        start = time.monotonic() + 0.5
        for index in range(len(kinds)):
            measure_from, stop = start + warmup, start + warmup + seconds
            _publish(barrier / f"phase-{index}", [start, measure_from, stop])
            time.sleep(max(0.0, measure_from - time.monotonic()))
            before = cpu_seconds(pid) if pid else None
            time.sleep(max(0.0, stop - time.monotonic()))
            cpu.append(None if before is None else cpu_seconds(pid) - before)
            for worker in workers:
                _wait_for(barrier / f"done-{index}-{worker.pid}", worker, f"phase {index}")
            start = time.monotonic() + GAP
        _publish(barrier / "stop-listening", [])
        return _results(workers), _results(listening), cpu


def _wait_for(path: Path, process: subprocess.Popen[str], stage: str) -> None:
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"a many-names worker ended in {stage} (exit {process.returncode})")
        time.sleep(0.01)


def _publish(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` whole: the workers poll for it."""
    path.with_suffix(".new").write_text(json.dumps(value))
    path.with_suffix(".new").rename(path)


def _results(processes: Sequence[Any]) -> list[list[Counter[str]]]:
    results = []
    for process in processes:
        out = process.stdout.read()
        if process.wait(timeout=300) != 0:
            raise RuntimeError(f"a many-names worker failed (exit {process.returncode})")
        results.append([Counter({k: v for k, v in phase.items() if k != "kind"}) for phase in json.loads(out)])
    return results


def summed(results: list[list[Counter[str]]], index: int) -> Counter[str]:
    total: Counter[str] = Counter()
    for result in results:
        total.update(result[index])
    return total


def requests(counts: Counter[str], stream: bool) -> int:
    return sum(n for key, n in counts.items() if key.startswith("sent:") and (key[5:] in STREAM_COMMANDS) == stream)


async def collection_size(uri: str, collection: str) -> int:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        return await client[DATABASE][collection].count_documents({})
    finally:
        await client.close()


def pool_curve(given_uri: str | None, pool: int, seconds: float, warmup: float) -> dict[str, Any]:
    kinds = ("library", "raw", "raw", "library")
    with server(given_uri) as (uri, pid):
        collection = f"names_{uuid.uuid4().hex[:8]}"
        workers, _, cpu = run_phases(uri, pid, collection, pool, kinds, seconds, warmup=warmup)
        size = asyncio.run(collection_size(uri, collection))
    figures: dict[str, Any] = {"pool": pool, "collection_size": size}
    for kind in ("library", "raw"):
        indexes = [i for i, phase_kind in enumerate(kinds) if phase_kind == kind]
        total = sum((summed(workers, i) for i in indexes), Counter())
        acquisitions = max(1, total["acquisitions"])
        spent = [cpu[i] for i in indexes]
        figures[kind] = {
            "acquisitions_per_second": round(total["acquisitions"] / (seconds * len(indexes)), 1),
            "per_phase": [round(summed(workers, i)["acquisitions"] / seconds, 1) for i in indexes],
            "requests_per_acquisition": round(requests(total, stream=False) / acquisitions, 3),
            "stream_requests_per_acquisition": round(requests(total, stream=True) / acquisitions, 3),
            "events_per_process_per_acquisition": round(total["events"] / PROCESSES / acquisitions, 3),
            "events_naming_no_waited_lock_per_process_per_acquisition": round(
                total["dispatched_to_nobody"] / PROCESSES / acquisitions, 3
            ),
            "pairs_per_second": round(total["pairs"] / (seconds * len(indexes)), 1),
            "found_held_per_acquisition": round(total["found_held"] / acquisitions, 3),
            "errors": {key[6:]: n for key, n in sorted(total.items()) if key.startswith("error:")},
            "commands_per_acquisition": {
                key[5:]: round(n / acquisitions, 3) for key, n in sorted(total.items()) if key.startswith("sent:")
            },
            "server_cpu_ms_per_acquisition": None
            if None in spent
            else round(sum(s or 0.0 for s in spent) * 1000 / acquisitions, 3),
            "server_cpu_ms_per_pair": None
            if None in spent or not total["pairs"]
            else round(sum(s or 0.0 for s in spent) * 1000 / total["pairs"], 3),
        }
    # Against the pairs the raw tasks sent, whether their acquire took the name or not: the rate at
    # which the server answers two requests per acquisition at this concurrency.
    figures["library_over_raw"] = round(
        figures["library"]["acquisitions_per_second"] / max(0.1, figures["raw"]["pairs_per_second"]), 3
    )
    return figures


def streams_point(given_uri: str | None, listeners: int, pool: int, seconds: float, warmup: float) -> dict[str, Any]:
    with server(given_uri) as (uri, pid):
        collection = f"names_{uuid.uuid4().hex[:8]}"
        asyncio.run(park(uri, collection))
        workers, listening, cpu = run_phases(uri, pid, collection, pool, ("library",), seconds, listeners, warmup)
    total = summed(workers, 0)
    heard = summed(listening, 0)
    acquisitions = max(1, total["acquisitions"])
    return {
        "listening_processes": listeners,
        "acquisitions_per_second": round(total["acquisitions"] / seconds, 1),
        "server_cpu_ms_per_acquisition": None if cpu[0] is None else round(cpu[0] * 1000 / acquisitions, 3),
        "events_per_listener_per_acquisition": round(heard["events"] / listeners / acquisitions, 3),
        "events_per_worker_per_acquisition": round(total["events"] / PROCESSES / acquisitions, 3),
        "requests_per_acquisition": round(requests(total, stream=False) / acquisitions, 3),
    }


async def park(uri: str, collection: str) -> None:
    """Hold the name the listeners wait for, for longer than the run: the raw acquire request (a
    handle would warn, when it is collected, that it still held the lock)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        holder = {"host": "many-names", "pid": os.getpid(), "label": None}
        await client[DATABASE][collection].find_one_and_update(
            {"_id": PARKED},
            acquire_pipeline(PlaceRequest(secrets.token_hex(24), 3_600_000, holder), enqueue=False, fair=False),
            upsert=True,
        )
    finally:
        await client.close()


class server:
    """The given server, or a fresh embedded one: its URI and (embedded) process id."""

    def __init__(self, uri: str | None) -> None:
        self._uri = uri
        self._embedded: EmbeddedMongo | None = None

    def __enter__(self) -> tuple[str, int | None]:
        if self._uri:
            return self._uri, None
        self._embedded = EmbeddedMongo()
        self._embedded.start()
        return self._embedded.uri, self._embedded.pid

    def __exit__(self, *exc_info: object) -> None:
        if self._embedded is not None:
            self._embedded.close()


def pool_row(figures: dict[str, Any]) -> str:
    lib, raw = figures["library"], figures["raw"]
    cpu = lib["server_cpu_ms_per_acquisition"], raw["server_cpu_ms_per_pair"]
    return (
        f"K={figures['pool']:>6} | acq/s library {lib['acquisitions_per_second']:6.1f} "
        f"(phases {lib['per_phase']}) raw pairs {raw['pairs_per_second']:6.1f} (of which acquired "
        f"{raw['acquisitions_per_second']:.1f}; phases {raw['per_phase']}) library/raw pairs "
        f"{figures['library_over_raw']:4.2f}x | requests/acq library {lib['requests_per_acquisition']:.3f} "
        f"(+{lib['stream_requests_per_acquisition']:.3f} stream) | stream events per process per acq "
        f"{lib['events_per_process_per_acquisition']:.3f} (naming no waited lock "
        f"{lib['events_naming_no_waited_lock_per_process_per_acquisition']:.3f}) | server CPU ms: library "
        f"{cpu[0]} per acquisition, raw {cpu[1]} per pair | collection at the end {figures['collection_size']} docs\n"
        f"         library's commands per acquisition {lib['commands_per_acquisition']}; errors {lib['errors']}"
    )


def streams_row(point: dict[str, Any]) -> str:
    return (
        f"{point['listening_processes']:>2} listening processes | {point['acquisitions_per_second']:6.1f} acq/s | "
        f"server CPU {point['server_cpu_ms_per_acquisition']} ms/acq | events per listener per acq "
        f"{point['events_per_listener_per_acquisition']:.3f} | per worker "
        f"{point['events_per_worker_per_acquisition']:.3f} | requests/acq {point['requests_per_acquisition']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--pools", type=int, nargs="*", default=[10, 1000, 100_000])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of each phase")
    parser.add_argument("--warmup", type=float, default=WARMUP, help="seconds of each phase not counted")
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--sweep-pool", type=int, default=1000)
    parser.add_argument("--sweep-seconds", type=float, default=20.0)
    arguments = parser.parse_args()
    where = environment(arguments.uri, f"{PROCESSES} processes x {TASKS} tasks")
    print(where, flush=True)
    print(f"\n== many names: library and raw pair, phases library/raw/raw/library of {arguments.seconds:g} s ==")
    pools = []
    for pool in arguments.pools:
        pools.append(pool_curve(arguments.uri, pool, arguments.seconds, arguments.warmup))
        print(pool_row(pools[-1]), flush=True)
    print(f"\n== processes with an open change stream; {PROCESSES} x {TASKS} tasks, {arguments.sweep_pool} names ==")
    sweep = []
    for listeners in arguments.streams:
        point = streams_point(arguments.uri, listeners, arguments.sweep_pool, arguments.sweep_seconds, arguments.warmup)
        sweep.append(point)
        print(streams_row(sweep[-1]), flush=True)
    cpu = [p["server_cpu_ms_per_acquisition"] for p in sweep if p["server_cpu_ms_per_acquisition"] is not None]
    if len(cpu) > 1:
        print(f"server CPU per acquisition, most / fewest listening processes: {cpu[-1] / cpu[0]:4.2f}x "
              f"(median {statistics.median(cpu):.2f} ms)")  # fmt: skip
    CHARTS.mkdir(exist_ok=True)
    path = CHARTS / "many_names.json"
    # A part not run (no --pools, or no --streams) keeps the figures of the last run that had it.
    figures = json.loads(path.read_text()) if path.exists() else {}
    run = {"environment": where, "seconds": arguments.seconds, "warmup": arguments.warmup}
    if pools:
        figures.update(run, pools=pools)
    if sweep:
        figures.update(streams=sweep, streams_run=run)
    path.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"(these figures are in {CHARTS / 'many_names.json'}: benchmarks/plots.py draws them)")


if __name__ == "__main__":
    main()
