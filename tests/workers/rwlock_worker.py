"""One OS process of the read-write lock test: READERS and WRITERS tasks take one read-write lock
until a deadline.

Each task records (mode, enter, exit, fencing token, when it asked) of every section, with
CLOCK_MONOTONIC (shared by the machine's processes), as its handle says it held (``belief.Belief``:
only while its lease is live), and prints them as JSON lines. ``broken`` swaps in a read-write lock
that reads the state, then writes it, in two round trips: the classic race, so the test can show
its detector works.

    python tests/workers/rwlock_worker.py URI DATABASE COLLECTION {real|broken} READERS WRITERS SECONDS START_AT
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

from mongolock_async import AsyncMongoRWLock

NAME = "contended"


class CheckThenSetRWLock:
    """A deliberately broken read-write lock: reads who holds it, then adds itself, not atomically."""

    def __init__(self, collection: Any, mode: str) -> None:
        self.collection = collection
        self.mode = mode
        self.token = secrets.token_hex(8)

    fencing_token = 0
    deadline: float | None = None  # it believes it holds from its entry to its exit

    async def __aenter__(self) -> None:
        while True:
            doc = await self.collection.find_one({"_id": NAME}) or {}
            writer, readers = doc.get("writer"), doc.get("readers", [])
            if writer is None and (self.mode == "read" or not readers):
                if self.mode == "read":
                    await self.collection.update_one({"_id": NAME}, {"$push": {"readers": self.token}}, upsert=True)
                else:
                    await self.collection.update_one({"_id": NAME}, {"$set": {"writer": self.token}}, upsert=True)
                self.deadline = math.inf
                return
            await asyncio.sleep(random.uniform(0, 0.002))

    async def __aexit__(self, *exc_info: object) -> None:
        self.deadline = None
        if self.mode == "read":
            await self.collection.update_one({"_id": NAME}, {"$pull": {"readers": self.token}})
        else:
            await self.collection.update_one({"_id": NAME}, {"$set": {"writer": None}})


ENOUGH = 10  # per process: the test judges 40 from 4 processes


async def contend(collection: Any, kind: str, mode: str, stop_at: float, sections: list[Any]) -> None:
    rw = AsyncMongoRWLock(collection, NAME, ttl=10.0, retry_base=0.005, retry_cap=0.05)
    while keep_going(stop_at, sections, ENOUGH):
        handle: Any = CheckThenSetRWLock(collection, mode) if kind == "broken" else getattr(rw, mode)()
        asked = time.monotonic()
        # Longer than a write to the one document, so readers overlap.
        if (section := await hold_for_a_moment(handle, 0.02, 0.05)) is not None:
            sections.append((mode, *section, asked))
        if mode == "write":
            await asyncio.sleep(random.uniform(0.02, 0.05))  # writers come and go


async def main(
    uri: str, database: str, name: str, kind: str, readers: int, writers: int, seconds: float, start: float
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database][name]
    await client.admin.command("ping")
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    sections: list[Any] = []
    stop_at = time.monotonic() + seconds
    modes = ["read"] * readers + ["write"] * writers
    await asyncio.gather(*(contend(collection, kind, mode, stop_at, sections) for mode in modes))
    await client.close()
    for section in sections:
        print(json.dumps(section))


if __name__ == "__main__":
    uri, database, name, kind, readers, writers, seconds, start = sys.argv[1:9]
    asyncio.run(main(uri, database, name, kind, int(readers), int(writers), float(seconds), float(start)))
