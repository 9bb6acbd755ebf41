"""One OS process of the mutual-exclusion test: TASKS tasks contend for one lock until a deadline.

Each task records (enter, exit, fencing token) of every critical section with CLOCK_MONOTONIC,
which all processes of one machine share, as its handle says it held (``belief.Belief``: only
while its lease is live), and the process prints them as JSON lines, then one last line with its
command counts. ``fair`` uses ``fair=True``; ``broken`` swaps in a lock that checks and then sets
in two round trips, the classic race, so the test can show its detector works.

    python tests/workers/mutex_worker.py URI DATABASE COLLECTION {real|fair|broken} TASKS SECONDS START_AT
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from typing import Any

from belief import hold_for_a_moment  # tests/workers/, this script's directory
from contention import keep_going
from pymongo import AsyncMongoClient, monitoring

from mongolock_async import AsyncMongoLock

LOCK_NAME = "contended"


class CheckThenSetLock:
    """A deliberately broken lock: reads, then writes, with nothing making the pair atomic."""

    def __init__(self, collection: Any, owner: str) -> None:
        self.collection = collection
        self.owner = owner

    fencing_token = 0
    deadline: float | None = None  # it believes it holds from its entry to its exit

    async def __aenter__(self) -> None:
        while True:
            doc = await self.collection.find_one({"_id": LOCK_NAME})
            if doc is None or doc.get("owner") is None:
                await self.collection.update_one({"_id": LOCK_NAME}, {"$set": {"owner": self.owner}}, upsert=True)
                self.deadline = math.inf
                return
            await asyncio.sleep(random.uniform(0, 0.002))

    async def __aexit__(self, *exc_info: object) -> None:
        self.deadline = None
        await self.collection.update_one({"_id": LOCK_NAME, "owner": self.owner}, {"$set": {"owner": None}})


class Commands(monitoring.CommandListener):
    """Counts the requests a process sends, and change-stream getMores that carried events."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.events_delivered = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent[event.command_name] = self.sent.get(event.command_name, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore" and event.reply.get("cursor", {}).get("nextBatch"):
            self.events_delivered += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


ENOUGH = 10  # per process: the test judges 40 from 4 processes


async def contend(
    collection: Any, kind: str, task_id: str, stop_at: float, sections: list[tuple[float, float, int | None]]
) -> None:
    while keep_going(stop_at, sections, ENOUGH):
        if kind == "broken":
            lock: Any = CheckThenSetLock(collection, task_id)
        else:
            lock = AsyncMongoLock(
                collection, LOCK_NAME, ttl=10.0, fair=kind == "fair", retry_base=0.005, retry_cap=0.05
            )
        if (section := await hold_for_a_moment(lock, 0.0005, 0.003)) is not None:
            sections.append(section)


async def main(
    uri: str, database: str, collection_name: str, kind: str, tasks: int, seconds: float, start_at: float
) -> None:
    commands = Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[commands])
    collection = client[database][collection_name]
    await client.admin.command("ping")
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    commands.sent.clear()
    sections: list[tuple[float, float, int | None]] = []
    stop_at = time.monotonic() + seconds
    await asyncio.gather(
        *(contend(collection, kind, f"{sys.argv[0]}-{index}", stop_at, sections) for index in range(tasks))
    )
    await client.close()
    for section in sections:
        print(json.dumps(section))
    print(json.dumps({"sent": commands.sent, "events_delivered": commands.events_delivered}))


if __name__ == "__main__":
    uri, database, collection_name, kind, tasks, seconds, start_at = sys.argv[1:8]
    asyncio.run(main(uri, database, collection_name, kind, int(tasks), float(seconds), float(start_at)))
