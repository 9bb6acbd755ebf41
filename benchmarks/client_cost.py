"""The library's own client-side cost: CPU, wall time and memory in the client process.

1. Uncontended acquire + release against a raw replay of the very two commands it sends (recorded
   by command monitoring as plain documents, then sent with ``database.command`` through the same
   client, each cycle with an owner token of its own, as the library's cycles have), and against
   the same two requests sent as ``find_one_and_update`` through the driver's collection helpers
   (what a program without the library would call), interleaved cycle by cycle: client CPU
   (``time.process_time``) and wall time per cycle, and their ratios.
2. Where the extra goes: Python calls and event-loop iterations per cycle, library against
   replay, a cProfile of the library's own modules (``--profile N`` cycles), and client CPU per
   cycle adding one layer of the library at a time (needs the library's internals: skipped for a
   version without them).
3. Client CPU per acquisition with 64 tasks of one process waiting on one lock, against the
   uncontended figure of part 1 (waiting tasks should cost nothing while they wait).
4. Memory: per lease held with the heartbeat, at ``--leases`` leases (tracemalloc); and the memory
   blocks left allocated after each tenth of ``--cycles`` acquire/release cycles on distinct names,
   which must not grow.

    python benchmarks/client_cost.py [--uri URI] [--parts 1,2,3,4] [--rounds 300] [--leases 10000] [--cycles 100000]

Run it with ``PYTHONPATH=<another checkout>`` to measure another version of the library. Without
``--uri`` it starts an embedded server per part. It prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import platform
import pstats
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import bson
import pymongo
from _common import environment, mongodb  # benchmarks/ is on sys.path when this runs as a script
from bson import SON
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, ReturnDocument, monitoring
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock

# Fields the driver adds to every command it sends; a replay through database.command adds its own.
DRIVER_FIELDS = {"lsid", "$clusterTime", "txnNumber", "$db", "$readPreference"}


class Recorder(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []
        self.on = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            command = ((key, _plain(value)) for key, value in event.command.items() if key not in DRIVER_FIELDS)
            self.commands.append(SON(command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _plain(value: Any) -> Any:
    """``value`` with every document the library encoded once (its pipelines' fixed stages:
    ``RawBSONDocument``) decoded: what a program would send, whose driver encodes every request."""
    if isinstance(value, RawBSONDocument):
        return bson.decode(value.raw)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


class Replays:
    """The recorded cycle's commands, each cycle with an owner token of its own, made before any
    clock starts. Sent again with the recorded token, the replay did less than the library: an
    acquire of a token released already takes nothing (the token is done with), and its release
    finds that earlier release; the server answered in 3.2 ms where the library's cycle took 5.6
    (2026-12-05), and the client's CPU per cycle was 0.03x to 0.06x of the ratio lower for it."""

    def __init__(self, commands: list[SON[str, Any]], cycles: int) -> None:
        recorded = commands[0]["update"][0]["$set"]["_request"]["$literal"]["me"]  # the acquire's token
        self._cycles = [
            [_with_owner(command, recorded, owner) for command in commands]
            for owner in (uuid.uuid4().hex for _ in range(cycles))
        ]
        self._next = 0

    def next(self) -> list[SON[str, Any]]:
        cycle = self._cycles[self._next]
        self._next += 1
        return cycle


def _with_owner(value: Any, recorded: str, owner: str) -> Any:
    """``value`` (a command, or a part of one) with ``owner`` wherever it holds ``recorded``."""
    if isinstance(value, str):
        return owner if value == recorded else value
    if isinstance(value, dict):  # SON too
        return type(value)((key, _with_owner(item, recorded, owner)) for key, item in value.items())
    if isinstance(value, list):
        return [_with_owner(item, recorded, owner) for item in value]
    return value


async def uncontended(uri: str, rounds: int, profile: int) -> float:
    """Part 1 (and 2): returns the library's client CPU per cycle, in seconds."""
    recorder = Recorder()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[recorder])
    try:
        database = client["bench"]
        collection = database[f"cost_{uuid.uuid4().hex[:6]}"]
        lock = AsyncMongoLock(collection, "cycle", ttl=30.0)

        async def library() -> None:
            async with lock:
                pass

        await library()  # the version check and the first connection
        recorder.on = True
        await library()
        recorder.on = False
        commands = [SON(command) for command in recorder.commands]
        for command in commands:  # the replay takes a lock of its own name
            command["query"] = SON((("_id", "replayed"), *((k, v) for k, v in command["query"].items() if k != "_id")))
        # The warm-ups below, part 1's cycles (the replay and the helpers), part 2's profile, and its
        # layers (the replay and the replay in tasks) each take a cycle's commands.
        replays = Replays(commands, cycles=2 + 2 * rounds + profile + 2 * rounds)
        helper_collections = [  # one per recorded command, made before any clock starts
            database.get_collection(command["findAndModify"], write_concern=WriteConcern(**command["writeConcern"]))
            for command in commands
        ]

        async def replay() -> None:
            for command in replays.next():
                await database.command(command)

        async def helpers() -> None:
            for helper_collection, command in zip(helper_collections, replays.next(), strict=True):
                await helper_collection.find_one_and_update(
                    command["query"],
                    command["update"],
                    projection=command["fields"],
                    upsert=command["upsert"],
                    return_document=ReturnDocument.AFTER if command["new"] else ReturnDocument.BEFORE,
                )

        await replay()
        await helpers()
        cpu: dict[str, list[float]] = {"library": [], "replay": [], "helpers": []}
        wall: dict[str, list[float]] = {"library": [], "replay": [], "helpers": []}
        for _ in range(rounds):
            for name, action in (("library", library), ("replay", replay), ("helpers", helpers)):
                started_cpu, started = time.process_time(), time.perf_counter()
                await action()
                wall[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - started_cpu)
        # CPU per cycle is a few hundred microseconds against a clock tick of about a millisecond
        # on some kernels: the mean over all cycles is exact, a median of ticks is not.
        names = ("library", "replay", "helpers")
        cpu_library, cpu_replay, cpu_helpers = (statistics.fmean(cpu[name]) for name in names)
        wall_library, wall_replay, wall_helpers = (statistics.median(wall[name]) for name in names)
        print(
            f"uncontended acquire+release ({len(commands)} commands: {', '.join(next(iter(c)) for c in commands)}), "
            f"{rounds} cycles interleaved:\n"
            f"  client CPU per cycle  library {cpu_library * 1000:6.3f} ms | replay {cpu_replay * 1000:6.3f} ms | "
            f"helpers {cpu_helpers * 1000:6.3f} ms | library/replay {cpu_library / cpu_replay:4.2f}x | "
            f"library/helpers {cpu_library / cpu_helpers:4.2f}x (means)\n"
            f"  wall time per cycle   library {wall_library * 1000:6.3f} ms | replay {wall_replay * 1000:6.3f} ms | "
            f"helpers {wall_helpers * 1000:6.3f} ms | library/replay {wall_library / wall_replay:4.2f}x | "
            f"library/helpers {wall_library / wall_helpers:4.2f}x (medians)"
        )
        if profile:
            await explain(library, replay, profile)
            await layers(database, collection, replays, replay, library, rounds)
        return cpu_library
    finally:
        await client.close()


async def explain(library: Callable[[], Awaitable[None]], replay: Callable[[], Awaitable[None]], cycles: int) -> None:
    """Part 2: where the library's extra CPU goes. Python function calls and event-loop iterations
    per cycle, library against replay; then a cProfile of the library's own modules."""
    loop = asyncio.get_running_loop()
    iterations = [0]
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counted() -> None:
        iterations[0] += 1
        run_once()

    for name, action in (("library", library), ("replay", replay)):
        profiler = cProfile.Profile()
        loop._run_once = counted  # type: ignore[attr-defined]
        iterations[0] = 0
        profiler.enable()
        for _ in range(cycles):
            await action()
        profiler.disable()
        loop._run_once = run_once  # type: ignore[attr-defined]
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        calls = sum(row[1] for row in stats.values())
        print(
            f"  {name:7}  {calls / cycles:6.0f} Python calls and {iterations[0] / cycles:4.1f} event-loop iterations "
            "per cycle"
        )
        if name == "library":
            ours = sorted(((row[2], key) for key, row in stats.items() if "mongolock_async" in key[0]), reverse=True)
    total = sum(own for own, _ in ours)
    print(f"  own time in mongolock_async modules (cProfile inflates it): {total / cycles * 1e6:.0f} us per cycle")
    for own, (filename, line, function) in ours[:12]:
        print(f"    {own / cycles * 1e6:6.1f} us  {Path(filename).name}:{line} {function}")


async def layers(
    database: Any,
    collection: Any,
    replays: Replays,
    replay: Callable[[], Awaitable[None]],
    library: Callable[[], Awaitable[None]],
    rounds: int,
) -> None:
    """Part 2, continued: client CPU per cycle adding one layer of the library at a time, interleaved."""
    try:
        from mongolock_async._util.shield import run_shielded
        from mongolock_async.store import store_for
    except ImportError:
        print("  (layers: this version of the library has no run_shielded or store_for)")
        return

    store = store_for(collection, WriteConcern(w="majority"))
    holder = {"host": platform.node(), "pid": 0, "label": None}

    async def shielded() -> None:
        for command in replays.next():
            await run_shielded(database.command(command), bound=30.0)

    async def store_methods() -> None:
        owner = uuid.uuid4().hex
        await store.try_acquire("store", owner, 30_000, holder, enqueue=True)
        await store.release("store", owner)

    async def sent() -> None:
        owner = uuid.uuid4().hex
        await store.try_acquire("sent", owner, 30_000, holder, enqueue=True, bound=30.0)
        await store.release("sent", owner, bound=30.0)

    async def sent_under_deadline() -> None:
        # What a driver deadline on every request would cost (the library gives one only where a
        # cut can be lost: store/sending.py); the request runs in its caller's context.
        owner = uuid.uuid4().hex
        with pymongo.timeout(30.0):
            await store.try_acquire("deadline", owner, 30_000, holder, enqueue=True, bound=30.0)
            await store.release("deadline", owner, bound=30.0)

    steps = {
        "replay (database.command)": replay,
        "+ each request shielded, and its cut": shielded,
        "store methods (pipeline values, reply parsing)": store_methods,
        "store methods with their bound": sent,
        "the same, under the driver's deadline": sent_under_deadline,
        "library (async with)": library,
    }
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, action in steps.items():
            started = time.process_time()
            await action()
            cpu[name].append(time.process_time() - started)
    base = statistics.fmean(cpu["replay (database.command)"])
    print("  client CPU per cycle, one layer at a time (means, interleaved):")
    for name, spent in cpu.items():
        print(f"    {name:48} {statistics.fmean(spent) * 1e6:5.0f} us  {statistics.fmean(spent) / base:4.2f}x")


async def contended(uri: str, tasks: int, seconds: float, uncontended_cpu: float | None) -> None:
    """Part 3: one process, ``tasks`` tasks taking one lock in turn with empty bodies."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        collection = client["bench"][f"hot_{uuid.uuid4().hex[:6]}"]
        warm = AsyncMongoLock(collection, "warm", ttl=30.0)  # the version check, a connection
        assert await warm.acquire() and await warm.release()
        acquisitions = 0
        stop = False

        async def worker() -> None:
            nonlocal acquisitions
            lock = AsyncMongoLock(collection, "hot", ttl=30.0)
            while not stop:
                async with lock:
                    acquisitions += 1

        runners = [asyncio.create_task(worker()) for _ in range(tasks)]
        await asyncio.sleep(1.0)  # everyone queued
        counted, started_cpu, started = acquisitions, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        spent_cpu, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
        done = acquisitions - counted
        stop = True
        await asyncio.gather(*runners)
        per = spent_cpu / max(1, done)
        ratio = f" | against uncontended {per / uncontended_cpu:4.2f}x" if uncontended_cpu else ""
        print(
            f"{tasks} tasks, one process, one lock: {done} acquisitions in {elapsed:.1f} s "
            f"({done / elapsed:.0f}/s) | client CPU per acquisition {per * 1000:6.3f} ms{ratio}"
        )
    finally:
        await client.close()


async def leases_memory(uri: str, leases: int) -> None:
    """Part 4a: memory per lease held with the heartbeat (100 collections, so each stays small)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, maxPoolSize=50)
    try:
        collections = [client["bench"][f"leases_{n}_{uuid.uuid4().hex[:4]}"] for n in range(100)]
        warm = AsyncMongoLock(collections[0], "warm", ttl=3600.0)  # the version check, a connection
        assert await warm.acquire() and await warm.release()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        held: list[AsyncMongoLock] = []
        for start in range(0, leases, 25):
            batch = [
                AsyncMongoLock(collections[n % 100], f"lease-{n}", ttl=3600.0, heartbeat=600.0)
                for n in range(start, min(leases, start + 25))
            ]
            assert all(await asyncio.gather(*(lock.acquire(blocking=False) for lock in batch)))
            held.extend(batch)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        top = after.compare_to(before, "lineno")[:6]
        print(f"{leases} leases held with the heartbeat: {grown / leases:7.0f} bytes per lease (tracemalloc)")
        for stat in top:
            print(f"    {stat.size_diff / leases:6.0f} B/lease  {stat.traceback.format()[-1].strip()}")
        for start in range(0, len(held), 25):
            await asyncio.gather(*(lock.release() for lock in held[start : start + 25]))
    finally:
        await client.close()


async def cycles_memory(uri: str, cycles: int) -> None:
    """Part 4b: acquire/release on distinct names; allocated memory blocks after each tenth.

    ``sys.getallocatedblocks`` after a full collection, not tracemalloc: tracing every allocation
    slows a cycle some tenfold, and 100,000 cycles would take most of an hour.
    """
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        marks: list[int] = []
        step = max(1, cycles // 10)
        collection = None
        started = time.perf_counter()
        for n in range(cycles):
            if n % 1000 == 0:  # a fresh collection now and then, so each stays small on the server
                if collection is not None:
                    await collection.drop()
                collection = client["bench"][f"cycles_{n}_{uuid.uuid4().hex[:4]}"]
            assert collection is not None
            async with AsyncMongoLock(collection, f"name-{n}", ttl=30.0):
                pass
            if (n + 1) % step == 0:
                gc.collect()
                marks.append(sys.getallocatedblocks())
        elapsed = time.perf_counter() - started
        shown = " ".join(f"{mark / 1000:.1f}" for mark in marks)
        print(
            f"{cycles} acquire/release cycles on distinct names ({elapsed:.0f} s): allocated blocks (thousands) "
            f"after each tenth: {shown} | last - second: {marks[-1] - marks[1]:+d} blocks"
        )
        if collection is not None:
            await collection.drop()
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri")
    parser.add_argument("--parts", default="1,2,3,4")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--profile", type=int, default=300, help="cycles profiled in part 2")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=100_000)
    arguments = parser.parse_args()
    parts = {int(part) for part in arguments.parts.split(",")}
    print(environment(arguments.uri))
    cpu = None
    if parts & {1, 2}:
        with mongodb(arguments.uri) as uri:
            cpu = asyncio.run(uncontended(uri, arguments.rounds, arguments.profile if 2 in parts else 0))
    if 3 in parts:
        with mongodb(arguments.uri) as uri:
            asyncio.run(contended(uri, arguments.tasks, arguments.seconds, cpu))
    if 4 in parts:
        with mongodb(arguments.uri) as uri:
            asyncio.run(leases_memory(uri, arguments.leases))
        with mongodb(arguments.uri) as uri:
            asyncio.run(cycles_memory(uri, arguments.cycles))
    sys.stdout.flush()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
