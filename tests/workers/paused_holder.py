"""A holder process for the paused-holder test: it takes a lock and runs a body that prints a line
per step, with the monotonic time (shared by all processes of a machine), until it is stopped.

    python tests/workers/paused_holder.py URI DATABASE COLLECTION NAME TTL HEARTBEAT

Prints ``deadline <t>`` once held, ``step <t> <deadline>`` after every step of the body (the time,
then the lease's local deadline as the handle says it at that moment: ``None`` if it says the lease
is not held), and at the end ``lost <t>`` (LockLostError) or ``finished <t>``. HEARTBEAT is an
interval in seconds, or 0 for none.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, LockLostError


async def main(uri: str, database: str, collection: str, name: str, ttl: float, heartbeat: float) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    lock = AsyncMongoLock(client[database][collection], name, ttl=ttl, heartbeat=heartbeat or False)
    try:
        async with lock:
            print("deadline", lock.deadline, flush=True)
            for _ in range(int(10 * ttl / 0.05)):
                await asyncio.sleep(0.05)
                now = time.monotonic()
                print("step", now, lock.deadline, flush=True)
        print("finished", time.monotonic(), flush=True)
    except LockLostError:
        print("lost", time.monotonic(), flush=True)
    finally:
        await client.close()


if __name__ == "__main__":
    uri, database, collection, name, ttl, heartbeat = sys.argv[1:7]
    asyncio.run(main(uri, database, collection, name, float(ttl), float(heartbeat)))
