"""The heartbeat at scale, measured side by side on one server.

1. Renewal time per lease at 100, 1,000, 5,000 and 10,000 leases: the keeper's way (chunks of
   RENEWAL_CHUNK leases, one request each, earliest deadline first) against one raw ``update_many``
   whose filter lists every name and owner (``$in``), over the same documents.
2. Chunk sizes from 25 to 1,000 at 1,000 leases, and the keeper's own chunk size at 5,000: time per
   lease of a renewal on its own, and the latency of a release of an unrelated lock in the same
   collection during a renewal, against its idle latency.
3. 10,000 leases held with the heartbeat on, for three renewal intervals: how many are lost, and
   how long the keeper's renewal requests took.

    python benchmarks/renewal.py [--uri URI] [--part {per-lease,chunks,keeper}]...

Without ``--uri``/``MONGODB_URI`` every measurement gets a fresh embedded server (it slows down as
writes accumulate). Prints the environment first; part 1 also writes its figures to
benchmarks/charts/renewal.json, which benchmarks/plots.py draws.

The embedded server answers ``findAndModify`` (every acquire and release) by scanning the whole
collection, even for an ``_id`` equality: sent one at a time, about 0.08 s per request at 5,000
documents here, where MongoDB uses the ``_id`` index. Part 2's release probe sends one at a time,
so its sweep runs at 1,000 leases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import environment, mongodb  # benchmarks/ is the script's directory
from pymongo import monitoring
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock
from mongolock_async._runtime import keeper
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


PARTS = ("per-lease", "chunks", "keeper")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--part", action="append", choices=PARTS, help="run only this part (repeatable)")
    parser.add_argument("--keeper-leases", type=int, default=10_000, help="leases held in part 3")
    arguments = parser.parse_args()
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


if __name__ == "__main__":
    main()
