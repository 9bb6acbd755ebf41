"""The heartbeat at scale, measured side by side on one server.

1. Renewal time per lease at 100, 1,000, 5,000 and 10,000 leases: the keeper's way (chunks of
   RENEWAL_CHUNK leases, one request each, earliest deadline first) against one raw ``update_many``
   whose filter lists every name and owner (``$in``), over the same documents.
2. Chunk sizes from 25 to 1,000 at 1,000 leases, and the keeper's own chunk size at 5,000: time per
   lease of a renewal on its own, and the latency of a release of an unrelated lock in the same
   collection during a renewal, against its idle latency.
3. 10,000 leases held with the heartbeat on, for three renewal intervals: how many are lost, and
   how long the keeper's renewal requests took.
4. The client's side of the heartbeat at 100, 1,000 and 10,000 leases held by one process (each
   count in a fresh process, on a fresh server): over ``--intervals`` renewal intervals, the renewal
   requests and statements per lease per interval (command monitoring), the client CPU per lease
   per interval (``time.process_time`` over the window, less the same process's idle rate), the
   client memory per lease held (tracemalloc: handles, leases, the keeper's bookkeeping and timers,
   measured once every lease was renewed), and how late each renewal was sent after the keeper
   had it due, how much of its local deadline was left when it was confirmed, and what was lost;
   also the client CPU per acquisition while they were taken (with tracemalloc on, so only the
   ratio between lease counts means something).
   ``--baseline DIR`` runs another checkout of the library the same way, count by count, side by side.

    python benchmarks/renewal.py [--uri URI] [--part {per-lease,chunks,keeper,client}]...
                                 [--baseline DIR] [--leases N]...

Without ``--uri``/``MONGODB_URI`` every measurement gets a fresh embedded server (it slows down as
writes accumulate). Prints the environment first; part 1 writes its figures to
benchmarks/charts/renewal.json and part 4 to benchmarks/charts/renewal_client.json, which
benchmarks/plots.py draws.

The embedded server answers ``findAndModify`` (every acquire and release) by scanning the whole
collection, even for an ``_id`` equality: sent one at a time, about 0.08 s per request at 5,000
documents here, where MongoDB uses the ``_id`` index. Part 2's release probe sends one at a time,
so its sweep runs at 1,000 leases.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import environment, mongodb  # benchmarks/ is the script's directory
from pymongo import monitoring
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock
from mongolock_async._runtime import keeper
from mongolock_async._util.process import die_with_parent
from mongolock_async.store import LockStore, Renewal
from mongolock_async.testing.clients import close_client, make_client

SERVER_NOW = {"$toDate": {"$toLong": "$$NOW"}}
CHARTS = Path(__file__).resolve().with_name("charts")


async def held_leases(collection: Any, count: int) -> list[Renewal]:
    """``count`` lease documents with a TTL of an hour, as the library writes them (a shorter TTL
    could run out between two renewals of the slower measurements, and the leases be lost)."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    leases = [Renewal(f"lease-{i}", secrets.token_hex(24), 3_600_000) for i in range(count)]
    for start in range(0, count, 1000):
        await collection.insert_many(
            [{"_id": name, "owner": owner, "expiresAt": expires, "fence": 1, "ttlMs": ttl}
             for name, owner, ttl, _ in leases[start : start + 1000]]
        )  # fmt: skip
    return leases


async def renew_in_chunks(store: LockStore, leases: list[Renewal], chunk: int) -> set[tuple[str, str]]:
    renewed: set[tuple[str, str]] = set()
    for start in range(0, len(leases), chunk):
        renewed |= await store.renew(leases[start : start + chunk])
    return renewed


async def renew_with_update_many(collection: Any, leases: list[Renewal]) -> int:
    """The previous way: one write whose filter lists every name and every owner."""
    result = await collection.update_many(
        {
            "_id": {"$in": [lease.name for lease in leases]},
            "owner": {"$in": [lease.owner for lease in leases]},
            "$expr": {"$gt": ["$expiresAt", SERVER_NOW]},
        },
        [{"$set": {"expiresAt": {"$dateAdd": {"startDate": SERVER_NOW, "unit": "millisecond", "amount": 3_600_000}},
                   "renewedAt": SERVER_NOW}}],
    )  # fmt: skip
    return int(result.matched_count)


async def per_lease(uri: str, count: int) -> tuple[float, float]:
    client = make_client("pymongo", uri)
    try:
        collection = client["bench"][f"renew_{uuid.uuid4().hex[:6]}"]
        leases = await held_leases(collection, count)
        store = LockStore(collection, WriteConcern(w="majority"))
        started = time.perf_counter()
        assert len(await renew_in_chunks(store, leases, keeper.RENEWAL_CHUNK)) == count
        chunked = (time.perf_counter() - started) / count
        started = time.perf_counter()
        assert await renew_with_update_many(collection, leases) == count
        one_write = (time.perf_counter() - started) / count
        return chunked, one_write
    finally:
        await close_client(client)


async def release_latencies(collection: Any, rounds: int) -> list[float]:
    """Seconds each release of an unrelated lock took, acquired and released ``rounds`` times."""
    lock = AsyncMongoLock(collection, "unrelated", ttl=30.0)
    samples = []
    for _ in range(rounds):
        assert await lock.acquire()
        started = time.perf_counter()
        assert await lock.release()
        samples.append(time.perf_counter() - started)
    return samples


async def chunk_size(uri: str, count: int, chunk: int) -> tuple[float, float, list[float]]:
    """Seconds per lease of a renewal on its own; the median release latency of an unrelated lock
    in the same collection, idle (before and after); its latencies during a second renewal."""
    client = make_client("pymongo", uri)
    try:
        collection = client["bench"][f"chunk_{uuid.uuid4().hex[:6]}"]
        leases = await held_leases(collection, count)
        store = LockStore(collection, WriteConcern(w="majority"))
        idle = await release_latencies(collection, 15)
        started = time.perf_counter()
        assert len(await renew_in_chunks(store, leases, chunk)) == count
        alone = (time.perf_counter() - started) / count
        renewal = asyncio.create_task(renew_in_chunks(store, leases, chunk))
        during = []
        while not renewal.done():
            during += await release_latencies(collection, 1)
        assert len(await renewal) == count
        idle += await release_latencies(collection, 15)
        return alone, statistics.median(idle), during
    finally:
        await close_client(client)


class RenewalRequests(monitoring.CommandListener):
    """How long each renewal request (an ``update`` command) took, and how many leases it carried."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.seconds: list[float] = []
        self.leases = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "update":
            self.sizes[event.request_id] = len(event.command.get("updates", ()))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "update":
            self.leases += self.sizes.pop(event.request_id, 0)
            self.seconds.append(event.duration_micros / 1e6)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.sizes.pop(event.request_id, None)


AT_ONCE = 25
"""Acquires or releases sent at once in part 3: fewer than the pool's 50 connections. Queued for a
connection behind slow requests (each scans the collection here), the heartbeat's renewals would
wait too: a run with 200 at once lost 9,200 leases while releasing them."""


async def keep_many(uri: str, count: int, interval: float, ttl: float) -> None:
    """Hold ``count`` leases with the heartbeat for three intervals; print what was lost and the
    renewal requests' durations."""
    requests = RenewalRequests()
    client = make_client("pymongo", uri, maxPoolSize=50, event_listeners=[requests])
    collection = client["bench"][f"keep_{uuid.uuid4().hex[:6]}"]
    locks = [AsyncMongoLock(collection, f"lease-{i}", ttl=ttl, heartbeat=interval) for i in range(count)]
    try:
        started = time.monotonic()
        for start in range(0, count, AT_ONCE):
            assert all(await asyncio.gather(*(lock.acquire() for lock in locks[start : start + AT_ONCE])))
        print(f"acquired {count} in {time.monotonic() - started:.0f} s", flush=True)
        requests.seconds.clear()
        requests.leases = 0
        await asyncio.sleep(3 * interval)
        lost = sum(lock.lost.is_set() for lock in locks)
        now = datetime.now(UTC)  # the embedded server runs on this machine's clock
        live_filter = {"owner": {"$ne": None}, "expiresAt": {"$gt": now}}
        live = {doc["_id"]: doc["fence"] async for doc in collection.find(live_filter)}
        held = sum(live.get(lock.name) == lock.fencing_token for lock in locks)
        seconds = requests.seconds
        print(
            f"after 3 intervals: lost {lost} of {count}; held on the server {held}; {len(seconds)} renewal "
            f"requests carrying {requests.leases} lease renewals, each took p50 "
            f"{statistics.median(seconds) * 1000:.0f} ms, max {max(seconds) * 1000:.0f} ms",
            flush=True,
        )
    finally:
        failed = 0
        for start in range(0, count, AT_ONCE):
            results = await asyncio.gather(*(lock.release() for lock in locks[start : start + AT_ONCE]),
                                           return_exceptions=True)  # fmt: skip
            failed += sum(isinstance(result, BaseException) for result in results)
        print(f"released; {failed} releases failed", flush=True)
        await close_client(client)


class Schedule:
    """Wraps a keeper's ``_renew``: for each lease it sends, how late the renewal was sent after the
    keeper had the lease due (negative: early, riding along with due leases), and, for each request,
    the time left of the earliest local deadline it covered once it was answered (negative: lost)."""

    def __init__(self, keeper: Any) -> None:
        self.keeper = keeper
        self.renew = keeper._renew
        self.renewed = 0
        self.recording = False
        """Whether to record lateness and headroom (off while memory is measured)."""
        self.lateness: list[float] = []
        self.headroom: list[float] = []
        keeper._renew = self._renew

    async def _renew(self, store: Any, leases: list[Any]) -> None:
        recording = self.recording  # as this request was sent: it may change while it is in flight
        if recording:
            sent_at = time.monotonic()
            due = self.keeper._leases
            self.lateness += [sent_at - due[lease] for lease in leases if lease in due]
            earliest = min(lease.deadline for lease in leases)
        await self.renew(store, leases)
        self.renewed += len(leases)
        if recording:
            self.headroom.append(earliest - time.monotonic())


class Commands(monitoring.CommandListener):
    """The commands a client sent, by name, and the statements of its ``update`` commands."""

    def __init__(self) -> None:
        self.names: Counter[str] = Counter()
        self.statements = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names[event.command_name] += 1
        if event.command_name == "update":
            self.statements += len(event.command.get("updates", ()))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

IDLE_SECONDS = 10.0
POOL = 50
"""The client's pool: opened in full before memory is counted (a connection costs kilobytes)."""
HELD: list[AsyncMongoLock] = []


async def hold_leases(uri: str, count: int, interval: float, ttl: float, intervals: int) -> dict[str, Any]:
    """Hold ``count`` heartbeat leases in this process and measure the client's side of keeping
    them (see the module's part 4); the figures as a dict. The leases stay held: the handles are
    kept alive (in ``HELD``) until the process exits."""
    commands = Commands()
    client = make_client("pymongo", uri, maxPoolSize=POOL, event_listeners=[commands])
    collection = client["bench"][f"hold_{uuid.uuid4().hex[:6]}"]
    keeper_ = keeper.keeper_for_running_loop()
    schedule = Schedule(keeper_)
    # Warm up: the pool opens all its connections and the library's caches fill, so that neither
    # is counted as memory per lease; then the process's CPU rate while it holds nothing.
    warm = [AsyncMongoLock(collection, f"warm-{i}", ttl=ttl, heartbeat=interval) for i in range(POOL)]
    assert all(await asyncio.gather(*(lock.acquire() for lock in warm)))
    assert all(await asyncio.gather(*(lock.release() for lock in warm)))
    await collection.delete_many({})
    del warm
    cpu_started, started = time.process_time(), time.monotonic()
    await asyncio.sleep(IDLE_SECONDS)
    idle_rate = (time.process_time() - cpu_started) / (time.monotonic() - started)
    gc.collect()
    tracemalloc.start()
    memory_before = tracemalloc.get_traced_memory()[0]
    started, cpu_started = time.monotonic(), time.process_time()
    locks = HELD[:] = [AsyncMongoLock(collection, f"lease-{i}", ttl=ttl, heartbeat=interval) for i in range(count)]
    for start in range(0, count, AT_ONCE):
        assert all(await asyncio.gather(*(lock.acquire() for lock in locks[start : start + AT_ONCE])))
    acquire_seconds, acquire_cpu = time.monotonic() - started, time.process_time() - cpu_started
    # Memory once every lease was renewed at least once: the keeper's state of a renewed lease,
    # and the timers renewals replace, are counted too.
    # (Or until those not renewed are lost, or two intervals passed: a server too slow to renew
    # them all in time shows in the lateness and the losses.)
    # (``lost_error``, not ``lost``: that event is made when first asked for, and would be counted.)
    give_up_at = time.monotonic() + 2 * interval
    while schedule.renewed + sum(lock.lost_error is not None for lock in locks) < count:
        if time.monotonic() > give_up_at:
            break
        await asyncio.sleep(0.5)
    gc.collect()
    memory = tracemalloc.get_traced_memory()[0] - memory_before
    tracemalloc.stop()
    lost_before = sum(lock.lost_error is not None for lock in locks)
    # The window: whole renewal intervals, tracemalloc off.
    commands.names.clear()
    commands.statements = 0
    schedule.recording = True
    window_started, cpu_started = time.monotonic(), time.process_time()
    await asyncio.sleep(intervals * interval)
    window = time.monotonic() - window_started
    cpu = time.process_time() - cpu_started - idle_rate * window
    lost = sum(lock.lost_error is not None for lock in locks)
    now = datetime.now(UTC)  # the embedded server runs on this machine's clock
    live_filter = {"owner": {"$ne": None}, "expiresAt": {"$gt": now}}
    live = {doc["_id"]: doc["fence"] async for doc in collection.find(live_filter)}
    held = sum(live.get(lock.name) == lock.fencing_token for lock in locks)
    lateness = sorted(schedule.lateness) or [0.0]
    per_interval = count * window / interval
    return {
        "leases": count,
        "interval_s": interval,
        "ttl_s": ttl,
        "window_s": round(window, 1),
        "acquire_s": round(acquire_seconds, 1),
        "acquire_cpu_us_per_lease": round(acquire_cpu / count * 1e6),
        "idle_cpu_ms_per_s": round(idle_rate * 1000, 3),
        "requests_per_lease_interval": round(commands.names["update"] / per_interval, 4),
        "statements_per_lease_interval": round(commands.statements / per_interval, 3),
        "other_commands": {name: number for name, number in commands.names.items() if name != "update"},
        "cpu_us_per_lease_interval": round(cpu / per_interval * 1e6, 1),
        "memory_bytes_per_lease": round(memory / count),
        "renewals": len(schedule.lateness),
        "late_p50_s": round(lateness[len(lateness) // 2], 3),
        "late_p99_s": round(lateness[int(len(lateness) * 0.99)], 3),
        "late_max_s": round(lateness[-1], 3),
        "late_over_1s": sum(late > 1.0 for late in lateness),
        "headroom_min_s": round(min(schedule.headroom, default=float("nan")), 2),
        "lost_before_window": lost_before,
        "lost": lost,
        "held_on_server": held,
    }


def client_run(count: int, interval: float, ttl: float, intervals: int) -> None:
    """A child process of part 4: the URI on stdin, the figures as JSON on stdout's last line, then
    the leases left to expire (see ``client_side``)."""
    uri = sys.stdin.readline().strip()

    async def measure_and_exit() -> None:
        figures = await hold_leases(uri, count, interval, ttl, intervals)
        print(json.dumps(figures), flush=True)
        os._exit(0)  # holding: no release of the handles at shutdown

    asyncio.run(measure_and_exit())


def client_side(
    uri: str, count: int, interval: float, ttl: float, intervals: int, library: str | None
) -> dict[str, Any]:
    """Part 4 for ``count`` leases in a fresh process (of ``library``, another checkout, if given).
    It leaves its leases to expire: releasing them takes as long as acquiring them on the embedded
    server, where each release scans the collection; give a fresh ``uri`` (or a server to throw away)."""
    worker_environment = dict(os.environ)
    if library is not None:
        worker_environment["PYTHONPATH"] = library
    worker = subprocess.Popen(
        [sys.executable, __file__, "--client-run", str(count), "--interval", str(interval), "--ttl", str(ttl),
         "--intervals", str(intervals)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=library or CHARTS.parent.parent,
        env=worker_environment, preexec_fn=die_with_parent,
    )  # fmt: skip
    out, _ = worker.communicate(uri + "\n", timeout=3600)
    if worker.returncode != 0:
        raise RuntimeError(f"the {count}-lease run failed (exit {worker.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def save_client_side(where: str, baseline: str | None, row: dict[str, Any]) -> None:
    """Add ``row`` to benchmarks/charts/renewal_client.json, in place of an earlier row of the same
    checkout and lease count. A run of some counts keeps the other counts' rows (each with the
    environment line of its own run); a run without ``--baseline`` drops the baseline's rows."""
    path = CHARTS / "renewal_client.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    checkouts = {"this", *(["baseline"] if baseline else [])}
    replaced = (row["library"], row["leases"])
    runs = [run for run in runs if run["library"] in checkouts and (run["library"], run["leases"]) != replaced]
    figures = {"environment": where, "baseline": baseline, "runs": sorted([*runs, row], key=lambda run: run["leases"])}
    CHARTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(figures, indent=1) + "\n")


def print_client_side(library: str, row: dict[str, Any]) -> None:
    print(
        f"{library:8} {row['leases']:6} leases: {row['requests_per_lease_interval']:.4f} requests and "
        f"{row['statements_per_lease_interval']:.2f} renewals/lease/interval | CPU "
        f"{row['cpu_us_per_lease_interval']:6.1f} us/lease/interval | memory {row['memory_bytes_per_lease']:5} B/lease "
        f"| sent after due: p50 {row['late_p50_s']:+.3f} s, p99 {row['late_p99_s']:+.3f} s, max "
        f"{row['late_max_s']:+.3f} s, {row['late_over_1s']} over 1 s of {row['renewals']} | least deadline left "
        f"{row['headroom_min_s']:.1f} s | lost {row['lost']}, held on the server {row['held_on_server']} | acquired in "
        f"{row['acquire_s']:.0f} s, CPU {row['acquire_cpu_us_per_lease']} us/lease (tracemalloc on)",
        flush=True,
    )  # fmt: skip

PARTS = ("per-lease", "chunks", "keeper", "client")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--part", action="append", choices=PARTS, help="run only this part (repeatable)")
    parser.add_argument("--keeper-leases", type=int, default=10_000, help="leases held in part 3")
    parser.add_argument("--leases", type=int, action="append", help="leases held in part 4 (repeatable; "
                        "default 100, 1,000 and 10,000)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=60.0, help="part 4's heartbeat interval, seconds")
    parser.add_argument("--ttl", type=float, default=180.0, help="part 4's TTL, seconds")
    parser.add_argument("--intervals", type=int, default=3, help="part 4's window, in heartbeat intervals")
    parser.add_argument("--baseline", help="another checkout of this library to run part 4 with, side by side")
    parser.add_argument("--client-run", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.client_run is not None:
        client_run(arguments.client_run, arguments.interval, arguments.ttl, arguments.intervals)
        return
    parts = arguments.part or PARTS
    where = environment(arguments.uri)
    print(where)
    if "per-lease" in parts:
        print(f"\n== renewal per lease: chunks of {keeper.RENEWAL_CHUNK} (the keeper) vs one update_many, $in lists ==")
        results = {}
        for count in (100, 1000, 5000, 10_000):
            with mongodb(arguments.uri) as uri:
                results[count] = asyncio.run(per_lease(uri, count))
            chunked, one_write = results[count]
            print(f"{count:6} leases: chunks {chunked * 1000:6.2f} ms/lease | update_many {one_write * 1000:6.2f} "
                  f"ms/lease | update_many/chunks {one_write / chunked:5.2f}x", flush=True)  # fmt: skip
        print(f"per-lease cost at 5,000 / at 100: chunks {results[5000][0] / results[100][0]:4.2f}x | "
              f"update_many {results[5000][1] / results[100][1]:4.2f}x")  # fmt: skip
        CHARTS.mkdir(exist_ok=True)
        rows = [
            {"leases": count, "chunks_ms": round(chunked * 1000, 3), "update_many_ms": round(one_write * 1000, 3)}
            for count, (chunked, one_write) in results.items()
        ]
        figures = {"environment": where, "chunk": keeper.RENEWAL_CHUNK, "per_lease": rows}
        (CHARTS / "renewal.json").write_text(json.dumps(figures, indent=1) + "\n")
    if "chunks" in parts:
        print("\n== chunk sizes: time per lease; release of an unrelated lock, idle vs during a renewal ==")
        for count, chunk in [*((1000, size) for size in (25, 50, 100, 200, 500, 1000)), (5000, keeper.RENEWAL_CHUNK)]:
            with mongodb(arguments.uri) as uri:
                seconds, idle, during = asyncio.run(chunk_size(uri, count, chunk))
            typical = statistics.median(during)
            print(f"{count:5} leases, chunk {chunk:5}: {seconds * 1000:5.2f} ms/lease | release idle "
                  f"{idle * 1000:5.1f} ms, during {typical * 1000:5.1f} ms ({typical / idle:4.2f}x), worst "
                  f"{max(during) * 1000:6.1f} ms of {len(during)}", flush=True)  # fmt: skip
    if "keeper" in parts:
        count, interval, ttl = arguments.keeper_leases, 60.0, 180.0
        print(f"\n== {count} leases held with the heartbeat (interval {interval:g} s, TTL {ttl:g} s), 3 intervals ==")
        with mongodb(arguments.uri) as uri:
            asyncio.run(keep_many(uri, count, interval, ttl))
    if "client" in parts:
        print(f"\n== the client's side of holding leases with the heartbeat (interval {arguments.interval:g} s, TTL "
              f"{arguments.ttl:g} s), per lease over {arguments.intervals} intervals ==")  # fmt: skip
        libraries = {"this": None, **({"baseline": arguments.baseline} if arguments.baseline else {})}
        runs = []
        for count in arguments.leases or (100, 1000, 10_000):
            for library, path in libraries.items():
                with mongodb(arguments.uri) as uri:
                    row = client_side(uri, count, arguments.interval, arguments.ttl, arguments.intervals, path)
                print_client_side(library, row)
                runs.append({"library": library, "environment": environment(arguments.uri), **row})
                save_client_side(where, arguments.baseline, runs[-1])
        for library in libraries:
            rows = sorted((row for row in runs if row["library"] == library), key=lambda row: row["leases"])
            if len(rows) > 1:
                first, last = rows[0], rows[-1]
                print(f"{library}: per lease at {last['leases']:,} / at {first['leases']:,}: requests "
                      f"{last['requests_per_lease_interval'] / first['requests_per_lease_interval']:.2f}x, CPU "
                      f"{last['cpu_us_per_lease_interval'] / first['cpu_us_per_lease_interval']:.2f}x, memory "
                      f"{last['memory_bytes_per_lease'] / first['memory_bytes_per_lease']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
