"""One OS process of the soak: TASKS tasks take random names of the lock until a deadline, through
server crashes, pauses and fail points, and write to a fenced resource inside each section.

    python benchmarks/soak_worker.py {real|broken} DATABASE NAMES RW_NAMES TASKS SECONDS START_AT OUT < URI

The URI comes on stdin. Tasks take the NAMES lock names (``name-N``; odd ones use ``fair=True``)
and the RW_NAMES read-write lock names (``rw-N``; one hold in four a write). One section in fifty is
long (up to 2 TTLs, with the heartbeat on); the rest hold for a few milliseconds. Every section is
written to OUT as a JSON line: name, enter, exit (CLOCK_MONOTONIC, shared by the machine's
processes), fencing token, whether the fenced write was refused (None for a read), whether the
lease was lost, how late the exit came after the lease's local deadline (seconds; negative when
before it), and the mode ("lock", "read" or "write"). ``broken`` swaps in a lock that checks and
then sets in two round trips (taken as a write on read-write names), so the soak can show its
detector works.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from mongolock_async import AsyncMongoLock, AsyncMongoRWLock, LockError, LockLostError

TTL = 3.0
LONG_SECTIONS = 0.02


class CheckThenSetLock:
    """A deliberately broken lock: reads, then writes, with nothing making the pair atomic."""

    def __init__(self, collection: Any, name: str) -> None:
        self.collection, self.name, self.owner = collection, name, secrets.token_hex(8)
        self.fencing_token = 0

    async def __aenter__(self) -> CheckThenSetLock:
        while True:
            doc = await self.collection.find_one({"_id": self.name})
            if doc is None or doc.get("owner") is None:
                self.fencing_token = int((doc or {}).get("fence", 0)) + 1
                await self.collection.update_one(
                    {"_id": self.name}, {"$set": {"owner": self.owner, "fence": self.fencing_token}}, upsert=True
                )
                return self
            await asyncio.sleep(random.uniform(0, 0.002))

    async def __aexit__(self, *exc_info: object) -> None:
        await self.collection.update_one({"_id": self.name, "owner": self.owner}, {"$set": {"owner": None}})


async def run(
    kind: str, uri: str, database: str, names: int, rw_names: int, tasks: int, seconds: float, start_at: float, out: str
) -> None:
    # Polled monitoring: the embedded server's streaming hello delays recovery after a
    # NotWritablePrimary-style error by about 10 s.
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, serverMonitoringMode="poll", heartbeatFrequencyMS=500, serverSelectionTimeoutMS=5000
    )
    locks, resource = client[database]["locks"], client[database]["resource"]
    counts = {"sections": 0, "lost": 0, "errors": 0, "refused": 0}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    stop_at = time.monotonic() + seconds

    with open(out, "w") as sink:  # noqa: ASYNC230 - a local file, written a line at a time

        async def task() -> None:
            while time.monotonic() < stop_at:
                index = random.randrange(names + rw_names)
                long = random.random() < LONG_SECTIONS
                heartbeat = 1.0 if long else False
                lock: Any
                if index < names:
                    name, mode = f"name-{index}", "lock"
                else:
                    name, mode = f"rw-{index - names}", "write" if random.random() < 0.25 else "read"
                if kind == "broken":
                    lock, mode = CheckThenSetLock(locks, name), "write" if mode == "read" else mode
                elif mode == "lock":
                    lock = AsyncMongoLock(locks, name, ttl=TTL, timeout=10.0, fair=index % 2 == 1, heartbeat=heartbeat)
                else:
                    handles = AsyncMongoRWLock(locks, name, ttl=TTL, timeout=10.0, heartbeat=heartbeat)
                    lock = handles.read() if mode == "read" else handles.write()
                entered = left = refused = None
                token, lost, late = 0, False, 0.0
                try:
                    async with lock:
                        entered = time.monotonic()
                        token = lock.fencing_token
                        try:
                            if mode != "read":
                                # The protected resource takes a write only with a token above its last.
                                result = await resource.update_one(
                                    {"_id": name, "fence": {"$lt": token}},
                                    {"$set": {"fence": token}, "$inc": {"writes": 1}},
                                )
                                refused = result.matched_count == 0
                            await asyncio.sleep(random.uniform(0.5, 2 * TTL) if long else random.uniform(0.001, 0.01))
                        finally:
                            left = time.monotonic()  # before the release, which hands the lease on
                            # The lease's local deadline, lost or not (a private field: this is a probe).
                            lease = getattr(lock, "_lease", None)
                            late = left - lease.deadline if lease is not None else 0.0
                except LockLostError:
                    counts["lost"] += 1
                    lost = True
                except (LockError, PyMongoError, TimeoutError):
                    counts["errors"] += 1
                    await asyncio.sleep(random.uniform(0.05, 0.5))
                if entered is not None and left is not None:
                    counts["sections"] += 1
                    counts["refused"] += bool(refused)
                    sink.write(json.dumps([name, entered, left, token, refused, lost, late, mode]) + "\n")

        await asyncio.gather(*(task() for _ in range(tasks)))
    await client.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    kind, database, names, rw_names, tasks, seconds, start_at, out = sys.argv[1:9]
    uri = sys.stdin.readline().strip()
    asyncio.run(run(kind, uri, database, int(names), int(rw_names), int(tasks), float(seconds), float(start_at), out))
