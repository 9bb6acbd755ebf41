"""One OS process of the fenced-writes soak: TASKS tasks take the lock ``resource`` (TTL 1 s, no
heartbeat, ``acquire()``/``release()``: nothing cancels a late writer) and write two resource
documents a few times per section, until a deadline. The driver SIGSTOPs these processes at random.

    python benchmarks/fenced_soak_worker.py {guarded|control} DATABASE TASKS SECONDS START_AT < URI

``guarded``: every write is a transaction tied to the lease (``guard_transaction``) on document
``txn``, then a token-checked write (with the token noted at acquisition) on document ``token``.
``control``: the same writes with neither. Each write counts, on the server and in the same update,
whether it landed with a token below the highest one already applied: a stale write. Prints counts
as JSON at the end.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from mongolock_async import AsyncMongoLock, LockError
from mongolock_async.fencing import fenced_update_one

TTL = 1.0
WRITES_PER_SECTION = 3


def count_stale(token: int) -> list[dict[str, Any]]:
    """An update pipeline: one more write; one more stale write if ``token`` is below the highest
    token applied before; the highest token applied."""
    return [
        {
            "$set": {
                "writes": {"$add": [{"$ifNull": ["$writes", 0]}, 1]},
                "stale": {"$add": [{"$ifNull": ["$stale", 0]}, {"$cond": [{"$lt": [token, "$highest"]}, 1, 0]}]},
                "highest": {"$max": [{"$ifNull": ["$highest", 0]}, token]},
            }
        }
    ]


async def run(mode: str, uri: str, database: str, tasks: int, seconds: float, start_at: float) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, serverMonitoringMode="poll", heartbeatFrequencyMS=500, serverSelectionTimeoutMS=5000
    )
    locks, resource = client[database]["locks"], client[database]["resource"]
    counts = {"sections": 0, "writes": 0, "refused": 0, "lost": 0, "errors": 0}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    stop_at = time.monotonic() + seconds

    async def write(lock: AsyncMongoLock, token: int) -> None:
        if mode == "control":
            async with client.start_session() as session, await session.start_transaction():
                await resource.update_one({"_id": "txn"}, count_stale(token), session=session)
            await resource.update_one({"_id": "token"}, count_stale(token))
            counts["writes"] += 2
            return
        try:
            async with client.start_session() as session, await session.start_transaction():
                await lock.guard_transaction(session)
                await resource.update_one({"_id": "txn"}, count_stale(token), session=session)
            counts["writes"] += 1
        except LockError:
            counts["refused"] += 1
        result = await fenced_update_one(resource, {"_id": "token"}, count_stale(token), token=token)
        counts["writes" if result.applied else "refused"] += 1

    async def watch_for_stop() -> None:
        """End early when the driver asks (its control run has seen what it must)."""
        nonlocal stop_at
        while time.monotonic() < stop_at:
            await asyncio.sleep(0.5)
            try:
                if await client[database]["control"].find_one({"_id": "stop"}) is not None:
                    stop_at = time.monotonic()
            except PyMongoError:
                pass  # the server may be restarting

    async def task() -> None:
        while time.monotonic() < stop_at:
            lock = AsyncMongoLock(locks, "resource", ttl=TTL, timeout=10.0)
            try:
                if not await lock.acquire():
                    continue
                token = lock.fencing_token
                assert token is not None
                counts["sections"] += 1
                for _ in range(WRITES_PER_SECTION):
                    await asyncio.sleep(random.uniform(0.0, 0.1))
                    await write(lock, token)
                counts["lost"] += lock.lost.is_set()
                await lock.release()
            except (LockError, PyMongoError, TimeoutError):
                counts["errors"] += 1
                await asyncio.sleep(random.uniform(0.05, 0.3))

    await asyncio.gather(watch_for_stop(), *(task() for _ in range(tasks)))
    await client.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    mode, database, tasks, seconds, start_at = sys.argv[1:6]
    uri = sys.stdin.readline().strip()
    asyncio.run(run(mode, uri, database, int(tasks), float(seconds), float(start_at)))
