"""Side-by-side benchmarks, reported as ratios measured in one run on one server.

1. Renewing N leases: one batched ``update_many`` (what the heartbeat does) vs one ``update_one``
   per lease (what a per-lock heartbeat would do).
2. An uncontended acquire + release cycle: PyMongo's AsyncMongoClient vs Motor.
3. Hand-off to a waiter: woken by a release in the same process, by a change stream, or by backoff.

    python benchmarks/bench.py [--uri URI] [--leases 200] [--rounds 5] [--cycles 300]

Without ``--uri``/``MONGODB_URI`` it starts the embedded server. It prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock
from mongolock_async.store import LockStore
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import close_client, make_client


async def timed(action: Callable[[], Awaitable[Any]], rounds: int) -> float:
    """Median seconds of ``rounds`` runs of ``action``."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def renewal(collection: Any, leases: int, rounds: int) -> None:
    store = LockStore(collection, WriteConcern(w="majority"))
    pairs = [(f"lease-{i}", uuid.uuid4().hex) for i in range(leases)]
    for name, owner in pairs:
        await store.try_acquire(name, owner, 600_000, {})

    async def batched() -> None:
        assert await store.renew_all(pairs) == leases

    async def one_by_one() -> None:
        for name, owner in pairs:
            assert await store.extend(name, owner, 600_000)

    batch, single = await timed(batched, rounds), await timed(one_by_one, rounds)
    print(
        f"renew {leases} leases: update_many {batch * 1000:8.1f} ms (1 round trip) | "
        f"update_one each {single * 1000:8.1f} ms ({leases} round trips) | ratio {single / batch:5.2f}x"
    )


async def cycle(uri: str, driver: str, cycles: int) -> float:
    client = make_client(driver, uri)
    try:
        lock = AsyncMongoLock(client["bench"][f"cycle_{uuid.uuid4().hex[:6]}"], "cycle", ttl=30.0)

        async def one() -> None:
            assert await lock.acquire(blocking=False)
            assert await lock.release()

        await one()  # connect
        return await timed(one, cycles)
    finally:
        await close_client(client)


async def handoff(collection: Any, rounds: int, how: str) -> float:
    """Median seconds from the moment the lock becomes free to the waiter holding it.

    ``how``: "release" (a handle in this process releases: in-process wake-up), "foreign" (the owner
    is cleared directly, as another process's release looks: change stream), "expire" (the lease's
    expiry is moved to now, which no signal announces: backoff alone).
    """
    samples = []
    for index in range(rounds):
        name = f"handoff-{how}-{index}"
        holder = AsyncMongoLock(collection, name, ttl=30.0)
        waiter = AsyncMongoLock(collection, name, ttl=30.0, retry_base=0.05, retry_cap=1.0)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        await asyncio.sleep(0.3)
        freed = time.perf_counter()
        if how == "release":
            assert await holder.release()
        elif how == "foreign":
            await collection.update_one({"_id": name}, {"$set": {"owner": None}})
        else:
            await collection.update_one({"_id": name}, [{"$set": {"expiresAt": "$$NOW"}}])
        assert await waiting
        samples.append(time.perf_counter() - freed)
        await waiter.release()
    return statistics.median(samples)


async def main(uri: str, leases: int, rounds: int, cycles: int, *, embedded: bool) -> None:
    client = make_client("pymongo", uri)
    try:
        info = await client.admin.command("buildInfo")
        print(
            f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC | python {platform.python_version()} | "
            f"{platform.platform()} | {os.cpu_count()} cores"
        )
        server = f"embedded SecantusDB {version('secantusdb')}" if embedded else "MongoDB"
        print(
            f"pymongo {version('pymongo')} | motor {version('motor')} | anyio {version('anyio')} | "
            f"server {server}, reports version {info.get('version')}"
        )
        collection = client["bench"][f"locks_{uuid.uuid4().hex[:6]}"]
        await renewal(collection, leases, rounds)
        pymongo_cycle = await cycle(uri, "pymongo", cycles)
        motor_cycle = await cycle(uri, "motor", cycles)
        print(
            f"acquire+release: pymongo {pymongo_cycle * 1000:6.2f} ms | motor {motor_cycle * 1000:6.2f} ms | "
            f"motor/pymongo {motor_cycle / pymongo_cycle:5.2f}x  (medians of {cycles})"
        )
        released, foreign, expired = [
            await handoff(collection, rounds, how) for how in ("release", "foreign", "expire")
        ]
        print(
            f"hand-off to a waiter: same-process release {released * 1000:6.1f} ms | other-process release "
            f"(change stream) {foreign * 1000:6.1f} ms | expiry, backoff alone {expired * 1000:6.1f} ms | "
            f"backoff/stream {expired / foreign:4.1f}x  (medians of {rounds})"
        )
        await client.drop_database("bench")
    finally:
        await close_client(client)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--leases", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=300)
    arguments = parser.parse_args()
    if arguments.uri:
        asyncio.run(main(arguments.uri, arguments.leases, arguments.rounds, arguments.cycles, embedded=False))
    else:
        with EmbeddedMongo() as server:
            asyncio.run(main(server.uri, arguments.leases, arguments.rounds, arguments.cycles, embedded=True))
