"""The heartbeat at scale, measured side by side on one server.

1. Renewal time per lease at 100, 1,000, 5,000 and 10,000 leases: the keeper's way (chunks of
   RENEWAL_CHUNK leases, one request each, earliest deadline first) against one raw ``update_many``
   whose filter lists every name and owner (``$in``), over the same documents.
2. Chunk sizes from 25 to 1,000 at 5,000 leases: time per lease, and the latency of a release of an
   unrelated lock while the renewal runs, against its idle latency.
3. 10,000 leases held with the heartbeat on, for three renewal intervals: how many are lost.

    python benchmarks/renewal.py [--uri URI] [--skip-keeper]

Without ``--uri``/``MONGODB_URI`` every measurement gets a fresh embedded server (it slows down as
writes accumulate). Prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

from _common import mongodb  # benchmarks/ is the script's directory
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, keeper
from mongolock_async.store import LockStore
from mongolock_async.testing.clients import close_client, make_client

SERVER_NOW = {"$toDate": {"$toLong": "$$NOW"}}


async def held_leases(collection: Any, count: int) -> list[tuple[str, str, int]]:
    """``count`` lease documents, live for an hour, as the library writes them."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    leases = [(f"lease-{i}", secrets.token_hex(24), 60_000) for i in range(count)]
    for start in range(0, count, 1000):
        await collection.insert_many(
            [{"_id": name, "owner": owner, "expiresAt": expires, "fence": 1, "ttlMs": ttl}
             for name, owner, ttl in leases[start : start + 1000]]
        )  # fmt: skip
    return leases


async def renew_in_chunks(store: LockStore, leases: list[tuple[str, str, int]], chunk: int) -> set[str]:
    renewed: set[str] = set()
    for start in range(0, len(leases), chunk):
        renewed |= await store.renew(leases[start : start + chunk])
    return renewed


async def renew_with_update_many(collection: Any, leases: list[tuple[str, str, int]]) -> int:
    """The previous way: one write whose filter lists every name and every owner."""
    result = await collection.update_many(
        {
            "_id": {"$in": [name for name, _, _ in leases]},
            "owner": {"$in": [owner for _, owner, _ in leases]},
            "$expr": {"$gt": ["$expiresAt", SERVER_NOW]},
        },
        [{"$set": {"expiresAt": {"$dateAdd": {"startDate": SERVER_NOW, "unit": "millisecond", "amount": 60_000}},
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


async def release_latency(collection: Any, rounds: int = 20) -> float:
    lock = AsyncMongoLock(collection, "unrelated", ttl=30.0)
    samples = []
    for _ in range(rounds):
        assert await lock.acquire()
        started = time.perf_counter()
        assert await lock.release()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def chunk_size(uri: str, count: int, chunk: int) -> tuple[float, float, float]:
    """Seconds per lease, and the median release latency of an unrelated lock, idle and during."""
    client = make_client("pymongo", uri)
    try:
        collection = client["bench"][f"chunk_{uuid.uuid4().hex[:6]}"]
        leases = await held_leases(collection, count)
        store = LockStore(collection, WriteConcern(w="majority"))
        idle = await release_latency(collection)
        started = time.perf_counter()
        renewal = asyncio.create_task(renew_in_chunks(store, leases, chunk))
        during = []
        while not renewal.done():
            during.append(await release_latency(collection, rounds=1))
        renewed = await renewal
        assert len(renewed) == count
        elapsed = time.perf_counter() - started
        return elapsed / count, idle, statistics.median(during)
    finally:
        await close_client(client)


async def keep_many(uri: str, count: int, interval: float, ttl: float) -> tuple[int, int]:
    """Hold ``count`` leases with the heartbeat for three intervals; return (lost, still held)."""
    client = make_client("pymongo", uri, maxPoolSize=50)
    try:
        collection = client["bench"][f"keep_{uuid.uuid4().hex[:6]}"]
        locks = [AsyncMongoLock(collection, f"lease-{i}", ttl=ttl, heartbeat=interval) for i in range(count)]
        for start in range(0, count, 200):
            assert all(await asyncio.gather(*(lock.acquire() for lock in locks[start : start + 200])))
        await asyncio.sleep(3 * interval)
        lost = sum(lock.lost.is_set() for lock in locks)
        held = sum(await asyncio.gather(*(lock.owned() for lock in locks[::100]))) * 100
        for start in range(0, count, 200):
            await asyncio.gather(*(lock.release() for lock in locks[start : start + 200]))
        return lost, held
    finally:
        await close_client(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--skip-keeper", action="store_true", help="skip the 10,000-lease heartbeat run")
    arguments = parser.parse_args()
    print(
        f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC | python {platform.python_version()} | "
        f"{platform.platform()} | {os.cpu_count()} cores | mongolock-async {version('mongolock-async')} | "
        f"pymongo {version('pymongo')} | server "
        f"{'MongoDB' if arguments.uri else 'embedded SecantusDB ' + version('secantusdb')}"
    )
    print(f"\n== renewal per lease: chunks of {keeper.RENEWAL_CHUNK} (the keeper) vs one update_many with $in lists ==")
    results = {}
    for count in (100, 1000, 5000, 10_000):
        with mongodb(arguments.uri) as uri:
            results[count] = asyncio.run(per_lease(uri, count))
        chunked, one_write = results[count]
        print(f"{count:6} leases: chunks {chunked * 1000:6.2f} ms/lease | update_many {one_write * 1000:6.2f} "
              f"ms/lease | update_many/chunks {one_write / chunked:5.2f}x", flush=True)  # fmt: skip
    print(f"per-lease cost at 5,000 / at 100: chunks {results[5000][0] / results[100][0]:4.2f}x | "
          f"update_many {results[5000][1] / results[100][1]:4.2f}x")  # fmt: skip
    print("\n== chunk size at 5,000 leases: time per lease; release of an unrelated lock, idle vs during ==")
    for chunk in (25, 50, 100, 200, 500, 1000):
        with mongodb(arguments.uri) as uri:
            seconds, idle, during = asyncio.run(chunk_size(uri, 5000, chunk))
        print(f"chunk {chunk:5}: {seconds * 1000:6.2f} ms/lease | release idle {idle * 1000:6.1f} ms, during "
              f"{during * 1000:7.1f} ms ({during / idle:5.2f}x)", flush=True)  # fmt: skip
    if not arguments.skip_keeper:
        count, interval, ttl = 10_000, 60.0, 180.0
        print(f"\n== {count} leases held with the heartbeat (interval {interval:g} s, TTL {ttl:g} s), 3 intervals ==")
        with mongodb(arguments.uri) as uri:
            lost, held = asyncio.run(keep_many(uri, count, interval, ttl))
        print(f"lost {lost} of {count}; still held at the end (sampled 1 in 100): about {held}")


if __name__ == "__main__":
    main()
