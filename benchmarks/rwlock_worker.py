"""One OS process of the read-write lock benchmark: READERS and WRITERS tasks take one read-write
lock until a deadline. Prints one JSON object: each section's (mode, asked, entered, left) on the
machine's shared monotonic clock, the requests the process sent and each findAndModify's round trip
(command monitoring).

    python benchmarks/rwlock_worker.py URI NAME READERS WRITERS WARMUP SECONDS START_AT READ_MS WRITE_MS PAUSE_MS

Each writer pauses PAUSE_MS between two writes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from hot_lock_worker import Requests  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoRWLock


async def run(
    uri: str, name: str, readers: int, writers: int, warmup: float, seconds: float, start_at: float, read: float,
    write: float, pause: float,
) -> None:  # fmt: skip
    requests = Requests()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[requests])
    rw = AsyncMongoRWLock(client["bench"][name], name, ttl=30.0)
    async with rw.read():  # the document exists and the pool has a connection before the clock starts
        pass
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    measure_from = start_at + warmup
    stop_at = measure_from + seconds
    asyncio.get_running_loop().call_later(measure_from - time.monotonic(), requests.reset)
    sections: list[tuple[str, float, float, float]] = []

    async def task(mode: str) -> None:
        while time.monotonic() < stop_at:
            asked = time.monotonic()
            async with rw.read() if mode == "read" else rw.write():
                entered = time.monotonic()
                await asyncio.sleep(read if mode == "read" else write)
                if asked >= measure_from:
                    sections.append((mode, asked, entered, time.monotonic()))
            if mode == "write":
                await asyncio.sleep(pause)  # a writer now and then, not back to back

    await asyncio.gather(*(task("read") for _ in range(readers)), *(task("write") for _ in range(writers)))
    await client.close()
    print(
        json.dumps({
            "sections": sections, "sent": dict(requests.sent), "events": requests.events,
            "find_and_modify_seconds": requests.find_and_modify_seconds,
        })
    )  # fmt: skip


if __name__ == "__main__":
    uri, name, readers, writers, warmup, seconds, start_at, read_ms, write_ms, pause_ms = sys.argv[1:11]
    asyncio.run(
        run(uri, name, int(readers), int(writers), float(warmup), float(seconds), float(start_at),
            float(read_ms) / 1000, float(write_ms) / 1000, float(pause_ms) / 1000)
    )  # fmt: skip
