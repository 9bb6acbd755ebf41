"""An asyncio worker: tasks (in as many processes as you like) take items from a queue collection;
each item is processed under a lock of its own, kept alive by the heartbeat however long it takes.

    mongolock server                                    # in another terminal (or set MONGODB_URI)
    python -m mongolock_async.examples.worker
    mongolock list                                      # its locks, "item:0" to "item:19", in mongolock.locks
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection

from mongolock_async import LockManager
from mongolock_async.examples import lock_collection, mongodb_uri

Queue = AsyncCollection[dict[str, Any]]


async def process(item: dict[str, Any]) -> None:
    await asyncio.sleep(random.uniform(0.01, 0.05))  # the work


async def work(locks: LockManager, queue: Queue, worker: str) -> int:
    done = 0
    async for item in queue.find({"done": False}):
        lock = locks(f"item:{item['_id']}", label=worker)
        if not await lock.acquire():  # blocking=False below: skip what someone else is on
            continue
        try:
            current = await queue.find_one({"_id": item["_id"]})
            if current is None or current["done"]:
                continue  # finished by another worker while this one read the queue
            await process(item)
            await queue.update_one(
                {"_id": item["_id"]}, {"$set": {"done": True, "by": worker, "fence": lock.fencing_token}}
            )
            done += 1
        finally:
            await lock.release()
    return done


async def main() -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri())
    database = client[os.environ.get("WORKER_DATABASE", "worker_example")]
    queue = database["queue"]
    if await queue.count_documents({}) == 0:
        await queue.insert_many([{"_id": n, "done": False} for n in range(20)])
    locks = LockManager(lock_collection(client), ttl=30, heartbeat=True, blocking=False)
    counts = await asyncio.gather(*(work(locks, queue, f"worker-{os.getpid()}-{n}") for n in range(4)))
    print(f"processed {sum(counts)} items; {await queue.count_documents({'done': False})} left")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
