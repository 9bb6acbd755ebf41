"""One OS process of the semaphore test: TASKS tasks contend for one semaphore until a deadline.

Each task records (enter, exit, fencing token, when it asked) of every section it held a permit in, with
CLOCK_MONOTONIC (shared by the machine's processes), as its handle says it held (``belief.Belief``:
only while its permit's lease is live), and prints them as JSON lines. ``broken`` swaps in a
semaphore that counts the holders, then adds itself, in two round trips: the classic race, so the
test can show its detector works.

    python tests/workers/semaphore_worker.py URI DATABASE COLLECTION {real|fair|broken} LIMIT TASKS SECONDS START_AT
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import sys
import time
from typing import Any

from belief import hold_for_a_moment  # tests/workers/, this script's directory
from contention import keep_going
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoSemaphore

NAME = "contended"


class CountThenAddSemaphore:
    """A deliberately broken semaphore: reads the count, then adds itself, not atomically."""

    def __init__(self, collection: Any, limit: int) -> None:
        self.collection = collection
        self.limit = limit
        self.token = secrets.token_hex(8)

    fencing_token = 0
    deadline: float | None = None  # it believes it holds from its entry to its exit

    async def __aenter__(self) -> None:
        while True:
            doc = await self.collection.find_one({"_id": NAME}) or {}
            if len(doc.get("members", [])) < self.limit:
                await self.collection.update_one({"_id": NAME}, {"$push": {"members": self.token}}, upsert=True)
                self.deadline = math.inf
                return
            await asyncio.sleep(random.uniform(0, 0.002))

    async def __aexit__(self, *exc_info: object) -> None:
        self.deadline = None
        await self.collection.update_one({"_id": NAME}, {"$pull": {"members": self.token}})


ENOUGH = 10  # per process: the test judges 40 from 4 processes


async def contend(collection: Any, kind: str, limit: int, stop_at: float, sections: list[Any]) -> None:
    while keep_going(stop_at, sections, ENOUGH):
        if kind == "broken":
            semaphore: Any = CountThenAddSemaphore(collection, limit)
        else:
            semaphore = AsyncMongoSemaphore(
                collection, NAME, limit, ttl=10.0, fair=kind == "fair", retry_base=0.005, retry_cap=0.05
            )
        asked = time.monotonic()
        # Longer than a write to the one document, so permits overlap.
        if (section := await hold_for_a_moment(semaphore, 0.02, 0.05)) is not None:
            sections.append((*section, asked))


async def main(
    uri: str, database: str, name: str, kind: str, limit: int, tasks: int, seconds: float, start: float
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database][name]
    await client.admin.command("ping")
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    sections: list[Any] = []
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(contend(collection, kind, limit, stop_at, sections) for _ in range(tasks)))
    await client.close()
    for section in sections:
        print(json.dumps(section))


if __name__ == "__main__":
    uri, database, name, kind, limit, tasks, seconds, start = sys.argv[1:9]
    asyncio.run(main(uri, database, name, kind, int(limit), int(tasks), float(seconds), float(start)))
