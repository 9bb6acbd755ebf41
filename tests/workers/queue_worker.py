"""A process that waits for a lock in fair mode until it is killed (for the dead-place test).

    python tests/workers/queue_worker.py URI DATABASE COLLECTION NAME TTL
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock


async def main(uri: str, database: str, collection: str, name: str, ttl: float) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    lock = AsyncMongoLock(client[database][collection], name, ttl=ttl, fair=True, retry_base=3600, retry_cap=3600)
    await lock.acquire()
    await asyncio.sleep(3600)


if __name__ == "__main__":
    uri, database, collection, name, ttl = sys.argv[1:6]
    asyncio.run(main(uri, database, collection, name, float(ttl)))
