"""One OS process of the giving-up tests: waiters that give up, then the process ends.

``wait_for``: for each NAME at once, a blocking acquire (an election's ``campaign``) of KIND inside
``asyncio.wait_for(..., SECONDS)``; the process then ends normally, without closing its client.
``cron``: for each NAME at once, a client opened with ``async with`` and ``acquire(timeout=SECONDS)``
in it (it returns False: the names are held); the client is closed as the block ends, and the
process ends. ``wait``: one blocking acquire of NAME with a TTL of SECONDS; prints ``acquired`` if it
gets the lock, then waits until it is killed. ``end-holding``: takes NAME (TTL SECONDS) and
returns from its main coroutine without releasing it; ``end-holding-closed`` closes its client first.

    python tests/workers/giving_up_worker.py URI DATABASE COLLECTION MODE KIND SECONDS NAME...

MODE: wait_for, cron, wait, end-holding, end-holding-closed. KIND: lock, fair-lock, semaphore,
rwlock, election. Prints ``done`` when it has given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection, AsyncMongoLock, AsyncMongoRWLock, AsyncMongoSemaphore


def handle(collection: Any, kind: str, name: str, ttl: float = 30.0) -> AsyncMongoLock:
    if kind == "lock":
        return AsyncMongoLock(collection, name, ttl=ttl)
    if kind == "fair-lock":
        return AsyncMongoLock(collection, name, ttl=ttl, fair=True)
    if kind == "semaphore":
        return AsyncMongoSemaphore(collection, name, 1, ttl=ttl)
    if kind == "rwlock":
        return AsyncMongoRWLock(collection, name, ttl=ttl).write()
    if kind == "rwlock-reader":
        return AsyncMongoRWLock(collection, name, ttl=ttl).read()
    if kind == "election":
        return AsyncMongoElection(collection, name, ttl=ttl)
    raise ValueError(kind)


async def acquire(lock: AsyncMongoLock, timeout: float | None = None) -> bool:
    """A blocking acquire (an election's campaign); False if it gave up at ``timeout`` (a
    ``LockTimeoutError`` too: a fresh client's first request may not be answered within a short one)."""
    try:
        if isinstance(lock, AsyncMongoElection):
            await lock.campaign(timeout=timeout)
            return True
        return await lock.acquire(timeout=timeout)
    except TimeoutError:
        return False


async def main(uri: str, database: str, collection_name: str, mode: str, kind: str, seconds: str, *names: str) -> None:
    if mode == "cron":

        async def cron_job(name: str) -> bool:
            async with AsyncMongoClient[dict[str, Any]](uri) as client:
                return await acquire(handle(client[database][collection_name], kind, name), timeout=float(seconds))

        results = await asyncio.gather(*(cron_job(name) for name in names))
        print("done", *results, flush=True)
        return
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database][collection_name]
    if mode in ("end-holding", "end-holding-closed"):
        lock = handle(collection, kind, names[0], ttl=float(seconds))
        assert await acquire(lock)
        print("acquired", flush=True)
        if mode == "end-holding-closed":
            await client.close()
        return  # holding the lock: the handle goes with this coroutine's frame
    if mode == "wait":
        lock = handle(collection, kind, names[0], ttl=float(seconds))
        if await acquire(lock):
            print("acquired", flush=True)
        await asyncio.Event().wait()
    assert mode == "wait_for", mode

    async def give_up(name: str) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(acquire(handle(collection, kind, name)), float(seconds))

    await client.admin.command("ping")  # connected: the acquires' flight is what the timeout cuts
    await asyncio.gather(*(give_up(name) for name in names))
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
