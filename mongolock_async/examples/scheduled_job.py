"""A nightly job that every replica of a service starts on the same schedule: exactly one runs it,
the others skip at once. The heartbeat keeps the lock however long the job takes.

    mongolock server                                    # in another terminal (or set MONGODB_URI)
    python -m mongolock_async.examples.scheduled_job
    mongolock list                                      # its lock, "nightly-report", in mongolock.locks
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import LockManager
from mongolock_async.examples import lock_collection, mongodb_uri


async def main() -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri())
    database = client[os.environ.get("JOBS_DATABASE", "jobs")]
    locks = LockManager(lock_collection(client), ttl=30, heartbeat=True)

    @locks.run_once("nightly-report")
    async def nightly_report(replica: int) -> str:
        await asyncio.sleep(0.5)  # the job
        await database["reports"].insert_one({"by": replica})
        return f"replica {replica} ran the report"

    # Three replicas fire at the same moment; one runs the job, the others get None.
    results = await asyncio.gather(*(nightly_report(replica) for replica in range(3)))
    print([result or "skipped" for result in results])
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
