"""One OS process of the mutual-exclusion test: TASKS tasks contend for one lock until a deadline.

Each task records (enter, exit) of every critical section with CLOCK_MONOTONIC, which all processes
of one machine share, and the process prints them as JSON lines. ``broken`` swaps in a lock that
checks and then sets in two round trips, the classic race, so the test can show its detector works.

    python tests/mutex_worker.py URI DATABASE COLLECTION {real|broken} TASKS SECONDS START_AT
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock

LOCK_NAME = "contended"


class CheckThenSetLock:
    """A deliberately broken lock: reads, then writes, with nothing making the pair atomic."""

    def __init__(self, collection: Any, owner: str) -> None:
        self.collection = collection
        self.owner = owner

    async def __aenter__(self) -> None:
        while True:
            doc = await self.collection.find_one({"_id": LOCK_NAME})
            if doc is None or doc.get("owner") is None:
                await self.collection.update_one({"_id": LOCK_NAME}, {"$set": {"owner": self.owner}}, upsert=True)
                return
            await asyncio.sleep(random.uniform(0, 0.002))

    async def __aexit__(self, *exc_info: object) -> None:
        await self.collection.update_one({"_id": LOCK_NAME, "owner": self.owner}, {"$set": {"owner": None}})


async def contend(
    collection: Any, kind: str, task_id: str, stop_at: float, sections: list[tuple[float, float]]
) -> None:
    while time.monotonic() < stop_at:
        if kind == "real":
            lock: Any = AsyncMongoLock(collection, LOCK_NAME, ttl=10.0, retry_base=0.005, retry_cap=0.05)
        else:
            lock = CheckThenSetLock(collection, task_id)
        async with lock:
            entered = time.monotonic()
            await asyncio.sleep(random.uniform(0.0005, 0.003))
            sections.append((entered, time.monotonic()))


async def main(
    uri: str, database: str, collection_name: str, kind: str, tasks: int, seconds: float, start_at: float
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database][collection_name]
    await client.admin.command("ping")
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    sections: list[tuple[float, float]] = []
    stop_at = time.monotonic() + seconds
    await asyncio.gather(
        *(contend(collection, kind, f"{sys.argv[0]}-{index}", stop_at, sections) for index in range(tasks))
    )
    await client.close()
    for entered, left in sections:
        print(json.dumps([entered, left]))


if __name__ == "__main__":
    uri, database, collection_name, kind, tasks, seconds, start_at = sys.argv[1:8]
    asyncio.run(main(uri, database, collection_name, kind, int(tasks), float(seconds), float(start_at)))
