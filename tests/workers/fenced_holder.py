"""A holder process for the paused-holder fencing test: takes the lock ``resource``, prints
``held TOKEN``, waits for a line on stdin, then writes the resource document under the lock, and
prints the outcome as JSON: ``{"role", "token", "applied", "error"}``.

    python tests/workers/fenced_holder.py URI DATABASE COLLECTION {transaction|token} ROLE TTL

``transaction``: the write runs in a transaction tied to the lease by ``guard_transaction``.
``token``: a token-checked write with the token noted at acquisition, as code that was handed the
token earlier would hold it (it cannot know the lease ended).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, LockError
from mongolock_async.fencing import fenced_replace_one


async def main(uri: str, database: str, collection: str, mode: str, role: str, ttl: float) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    locks, resource = client[database][collection], client[database][collection + "_resource"]
    lock = AsyncMongoLock(locks, "resource", ttl=ttl)
    assert await lock.acquire(timeout=60.0)
    token = lock.fencing_token
    assert token is not None
    print("held", token, flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    outcome: dict[str, Any] = {"role": role, "token": token, "applied": False, "error": None}
    try:
        if mode == "transaction":
            async with client.start_session() as session, await session.start_transaction():
                await lock.guard_transaction(session)
                await resource.replace_one(
                    {"_id": "resource"}, {"writer": role, "fence": token}, upsert=True, session=session
                )
            outcome["applied"] = True
        else:
            result = await fenced_replace_one(resource, {"_id": "resource"}, {"writer": role}, token=token, upsert=True)
            outcome["applied"] = result.applied
    except LockError as error:
        outcome["error"] = type(error).__name__
    print(json.dumps(outcome), flush=True)
    await lock.release()
    await client.close()


if __name__ == "__main__":
    uri, database, collection, mode, role, ttl = sys.argv[1:7]
    asyncio.run(main(uri, database, collection, mode, role, float(ttl)))
