"""Semaphores and read-write locks, reported as ratios and counts measured in one run on one machine.

1. Uncontended acquire + release of a semaphore: the requests it sends (command monitoring: it must
   be exactly two), and its wall time against a raw copy of those two requests sent straight
   through the driver, interleaved.
2. A hot semaphore of 4 permits: 4 and 64 tasks over 4 processes (and 64 in one), 5 ms bodies:
   acquisitions/s, server round trips per acquisition (change-stream getMores that carried events
   counted apart), the most holders seen at once (sections on the machine's monotonic clock), and
   per-task min/max acquisitions (a starved task shows as a minimum of 0).
3. A read-heavy read-write lock: 60 readers and 4 writers over 4 processes (50 ms reads, 20 ms
   writes, each writer pausing 500 ms between writes): reads and writes done, readers at once
   (mean while read, and most), writers' waits (p50, p99) against the longest read section and
   the hand-off to a writer (the gap between a writer's entry and the last exit before it); and
   what a writer's wait is made of: the findAndModify round trips (as the driver timed them) and
   the embedded server's CPU time in the window (it serves requests on one core).
4. A release with 1,000 processes' places queued, against one with 10: a semaphore's release that
   hands its permit to the oldest place, and a read-write lock writer's release that hands the
   lock to every queued reader. The median time of the release request and, on the embedded
   server, its CPU time per release (wall time on a shared machine varies with its load), and the
   ratio of the two lengths: a release whose server work grew with the square of the queue would
   show a ratio near 10,000 (100 times the places, each handled 100 times as often), a linear one
   near 100 (less where a fixed cost per request dominates the short queue).

    python benchmarks/semaphore.py [--uri URI] [--seconds 5] [--cycles 300] [--repeats 15]
                                   [--only-queued | --only-read-heavy]

Without ``--uri``/``MONGODB_URI`` it starts an embedded server per part. It prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from _common import cpu_seconds, environment, mongodb  # benchmarks/ is on sys.path when this runs as a script
from bench import ROUND_TRIPS, _percentile, medians, run_workers
from hot_lock_worker import Requests
from pymongo import ReturnDocument

from mongolock_async import AsyncMongoSemaphore
from mongolock_async._util.process import die_with_parent
from mongolock_async.store import LockStore, Permits, PlaceRequest
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import close_client, make_client

LIMIT = 4
PERMITS = Permits("semaphore", LIMIT)


async def uncontended(uri: str, cycles: int) -> None:
    # Imported here: --only-read-heavy runs a baseline checkout, whose store may be laid out otherwise.
    from mongolock_async.store import permit_release
    from mongolock_async.store import permits as permit_queries

    requests = Requests()
    client = make_client("pymongo", uri, event_listeners=[requests])
    try:
        collection = client["bench"][f"semaphore_{uuid.uuid4().hex[:6]}"]
        semaphore = AsyncMongoSemaphore(collection, "cycle", LIMIT, ttl=30.0)
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "label": None}

        async def library() -> None:
            async with semaphore:
                pass

        async def raw() -> None:
            # The same two requests `async with semaphore:` sends, built by the same code, sent directly.
            owner = secrets.token_hex(24)
            place = PlaceRequest(owner, 30_000, holder)
            await collection.find_one_and_update(
                {"_id": "raw"},
                permit_queries.acquire_pipeline(place, PERMITS, enqueue=True, fair=False),
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
            await collection.find_one_and_update(
                {"_id": "raw", "holders.o": owner},
                permit_release.release_pipeline(owner, None, PERMITS, fair=False, successor_first=True),
                return_document=ReturnDocument.AFTER,
            )

        await library()
        await raw()
        requests.reset()
        await library()
        sent = dict(requests.sent)
        result = await medians({"library": library, "raw": raw}, cycles)
        print(f"uncontended acquire+release sends {sum(sent.values())} requests: {sent}")
        print(
            f"uncontended acquire+release: library {result['library'] * 1000:6.2f} ms | raw same two requests "
            f"{result['raw'] * 1000:6.2f} ms | library/raw {result['library'] / result['raw']:4.2f}x "
            f"(medians of {cycles}, interleaved)"
        )
    finally:
        await close_client(client)


def most_at_once(sections: list[tuple[float, float]]) -> int:
    events = sorted([(entered, 1) for entered, _ in sections] + [(left, -1) for _, left in sections])
    inside = most = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


def hot(uri: str | None, seconds: float) -> None:
    rates = {}
    for processes, tasks in ((4, 4), (4, 64), (1, 64)):
        with mongodb(uri) as server:
            results = run_workers(f"semaphore-{LIMIT}", server, processes, tasks, seconds, body_ms=5)
        counts = [count for result in results for count in result["counts"]]
        sections = [tuple(section) for result in results for section in result["sections"]]
        acquisitions = max(1, sum(counts))
        sent = sum(result["sent"].get(name, 0) for result in results for name in ROUND_TRIPS)
        events = sum(result["events"] for result in results)
        rates[processes, tasks] = acquisitions / seconds
        print(
            f"{processes} x {tasks // processes:<3} {tasks:>3} tasks | {acquisitions / seconds:7.1f} acq/s | "
            f"{sent / acquisitions:5.2f} round trips/acq (+{events / acquisitions:4.2f} change events) | "
            f"most holders at once {most_at_once(sections)} of {LIMIT} | per task min {min(counts)} max {max(counts)}",
            flush=True,
        )
    print(f"acq/s at 64 tasks / at 4 tasks, 4 processes: {rates[4, 64] / rates[4, 4]:4.2f}x")


RW_WORKER = Path(__file__).resolve().with_name("rwlock_worker.py")


def read_heavy(uri: str | None, seconds: float) -> None:
    processes, readers, writers, read_ms, write_ms, pause_ms, warmup = 4, 15, 1, 50, 20, 500, 1.0
    with contextlib.ExitStack() as stack:
        server, server_pid = (uri, None) if uri else _embedded(stack.enter_context(EmbeddedMongo()))
        start_at = time.monotonic() + 3.0
        workers = [
            subprocess.Popen(
                [sys.executable, str(RW_WORKER), server, "rw",
                 str(readers), str(writers), str(warmup), str(seconds), str(start_at),
                 str(read_ms), str(write_ms), str(pause_ms)],
                stdout=subprocess.PIPE, text=True, cwd=RW_WORKER.parent.parent, preexec_fn=die_with_parent,
            )
            for _ in range(processes)
        ]  # fmt: skip
        time.sleep(max(0.0, start_at + warmup - time.monotonic()))
        server_cpu = cpu_seconds(server_pid)
        time.sleep(seconds)
        server_cpu = cpu_seconds(server_pid) - server_cpu
        results = [json.loads(worker.communicate(timeout=warmup + seconds + 120)[0]) for worker in workers]
    sections = sorted((tuple(section) for result in results for section in result["sections"]), key=lambda s: s[2])
    reads = [(entered, left) for mode, _, entered, left in sections if mode == "read"]
    writes = [(asked, entered, left) for mode, asked, entered, left in sections if mode == "write"]
    events = sorted([(entered, 1) for entered, _ in reads] + [(left, -1) for _, left in reads])
    inside = most = 0
    weighted = reading = 0.0
    for (moment, step), (following, _) in zip(events, [*events[1:], events[-1]], strict=True):
        inside += step
        most = max(most, inside)
        if inside:
            weighted += inside * (following - moment)
            reading += following - moment
    waits = sorted(entered - asked for asked, entered, _ in writes)
    exits = sorted(left for *_, left in sections)
    gaps = sorted(
        entered - max((left for left in exits if left <= entered), default=entered) for _, entered, _ in writes
    )
    longest_read = max(left - entered for entered, left in reads)
    print(
        f"{processes} processes x ({readers} readers + {writers} writer) | {len(reads)} reads, {len(writes)} writes in "
        f"{seconds:g} s | readers at once: mean {weighted / max(reading, 1e-9):.1f} while read, most {most}"
    )
    print(
        f"writer wait p50 {statistics.median(waits) * 1000:.0f} ms p99 {_percentile(waits, 99) * 1000:.0f} ms | "
        f"longest read section {longest_read * 1000:.0f} ms | hand-off to a writer p50 "
        f"{statistics.median(gaps) * 1000:.1f} ms"
    )
    round_trips = sorted(rt for result in results for rt in result["find_and_modify_seconds"])
    busy = f"{server_cpu / seconds:.0%} of one core" if server_pid else "not measured (--uri)"
    print(
        f"what a writer waits on: {len(round_trips)} findAndModify, round trip p50 "
        f"{statistics.median(round_trips) * 1000:.0f} ms p99 {_percentile(round_trips, 99) * 1000:.0f} ms | "
        f"server CPU {busy}"
    )


QUEUES = (10, 1_000)


async def queued_release(uri: str, repeats: int, server_pid: int | None) -> None:
    """Part 4: the release request's time with ``QUEUES`` places queued (a median of ``repeats``,
    the document rewritten before each), and the server's CPU time per release if its pid is known."""
    from pymongo.write_concern import WriteConcern

    client = make_client("pymongo", uri)
    try:
        collection = client["bench"][f"queued_{uuid.uuid4().hex[:6]}"]
        store = LockStore(collection, WriteConcern(w="majority"))
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "label": "queued-release"}
        writer, reader = Permits("rwlock", 10_000, 10_000), Permits("rwlock", 10_000)
        cases = {
            "semaphore of 1, its permit to the oldest place": (Permits("semaphore", 1), Permits("semaphore", 1)),
            "read-write lock, the writer's to every reader": (writer, reader),
        }
        medians_ms: dict[tuple[str, int], float] = {}
        cpu_ms: dict[tuple[str, int], float] = {}
        for case, (held, waiting) in cases.items():
            for queued in QUEUES:
                name = f"{case[:9]}-{queued}"
                assert (await store.try_acquire(name, "holder", 60_000, holder, permits=held)).holds("holder")
                await store.try_acquire(name, "place-0", 60_000, holder, enqueue=True, permits=waiting)
                template = await collection.find_one({"_id": name})
                assert template is not None and len(template["queue"]) == 1, template
                place = template["queue"][0]
                # One place per process, as queued by N processes (a token each).
                template["queue"] = [{**place, "t": f"place-{n}-{secrets.token_hex(8)}"} for n in range(queued)]
                times, cpu = [], 0.0
                for _ in range(repeats):
                    await collection.replace_one({"_id": name}, template)
                    cpu_before, started = cpu_seconds(server_pid), time.perf_counter()
                    state = await store.release(name, "holder", permits=held)
                    times.append(time.perf_counter() - started)
                    cpu += cpu_seconds(server_pid) - cpu_before
                    assert state is not None and len(state.queue) == (queued - 1 if held.weight == 1 else 0)
                medians_ms[case, queued] = statistics.median(times) * 1000
                cpu_ms[case, queued] = cpu / repeats * 1000
            small, large = (medians_ms[case, queued] for queued in QUEUES)
            line = (
                f"{case}: {QUEUES[0]} queued {small:.1f} ms, {QUEUES[1]:,} queued {large:.1f} ms "
                f"(x{large / small:.0f} for x{QUEUES[1] // QUEUES[0]} the places)"
            )
            if server_pid is not None:
                small_cpu, large_cpu = (cpu_ms[case, queued] for queued in QUEUES)
                line += f"; server CPU {small_cpu:.1f} ms and {large_cpu:.1f} ms (x{large_cpu / small_cpu:.0f})"
            print(line)
        await collection.drop()
    finally:
        await close_client(client)


def _embedded(server: EmbeddedMongo) -> tuple[str, int | None]:
    return server.uri, server.pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each hot run")
    parser.add_argument("--cycles", type=int, default=300, help="uncontended cycles per variant")
    parser.add_argument("--repeats", type=int, default=15, help="releases timed per queue length")
    parser.add_argument("--only-queued", action="store_true", help="run part 4 alone")
    parser.add_argument("--only-read-heavy", action="store_true", help="run part 3 alone")
    arguments = parser.parse_args()
    if arguments.only_read_heavy:
        print(environment(arguments.uri))
        print("\n== read-heavy read-write lock ==")
        read_heavy(arguments.uri, arguments.seconds)
        return
    if arguments.only_queued:
        print(environment(arguments.uri))
        queued_part(arguments.uri, arguments.repeats)
        return
    print(environment(arguments.uri))
    print(f"\n== uncontended, a semaphore of {LIMIT} ==")
    with mongodb(arguments.uri) as uri:
        asyncio.run(uncontended(uri, arguments.cycles))
    print(f"\n== hot semaphore of {LIMIT} permits, 5 ms bodies ==")
    hot(arguments.uri, arguments.seconds)
    print("\n== read-heavy read-write lock ==")
    read_heavy(arguments.uri, arguments.seconds)
    queued_part(arguments.uri, arguments.repeats)


def queued_part(uri: str | None, repeats: int) -> None:
    print("\n== a release with places queued (median release request) ==")
    if uri:
        asyncio.run(queued_release(uri, repeats, None))
        return
    with EmbeddedMongo() as server:
        asyncio.run(queued_release(server.uri, repeats, server.pid))


if __name__ == "__main__":
    main()
