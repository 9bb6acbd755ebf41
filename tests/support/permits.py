"""Permits of a semaphore as a process still running elsewhere holds them, what the store reports
of them, and their expiry."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoSemaphore
from mongolock_async.store import LockStore


async def two_permits_of_one_process(collection: Any, name: str = "pool") -> dict[str, str]:
    """Semaphore ``name`` (limit 2) held by two handles of this process, "export-a" and "export-b",
    left held as by a process still running elsewhere; returns their owner tokens by label.

    Both permits are handed to waiting places (as under contention), whose tokens start with this
    process's prefix: the case where a short start of a token names both."""
    store = LockStore(collection, WriteConcern(w="majority"))
    blockers = [AsyncMongoSemaphore(collection, name, 2, ttl=120.0, label=f"blocker-{n}") for n in range(2)]
    for blocker in blockers:
        assert await blocker.acquire(blocking=False)
    handles = {
        label: AsyncMongoSemaphore(collection, name, 2, ttl=120.0, label=label) for label in ("export-a", "export-b")
    }
    waits = [asyncio.create_task(handle.acquire(timeout=60)) for handle in handles.values()]
    give_up_at = time.monotonic() + 30
    for done, blocker in enumerate(blockers, start=1):
        # The process keeps one place in the document's queue for its waiting tasks.
        while not await queue_of(store, name):
            assert time.monotonic() < give_up_at, "no place was queued"
            await asyncio.sleep(0.05)
        assert await blocker.release()  # hands its permit to that place
        while sum(wait.done() for wait in waits) < done:
            assert time.monotonic() < give_up_at, "the hand-off never arrived"
            await asyncio.sleep(0.05)
    assert await asyncio.gather(*waits) == [True, True]
    for handle in handles.values():
        handle._forget_lease()
    tokens = await live_tokens(store, name)
    assert sorted(tokens) == ["export-a", "export-b"], tokens
    first, second = tokens.values()
    assert first[:16] == second[:16], "the precondition: one process's tokens share their start"
    return tokens


async def queue_of(store: LockStore, name: str) -> list[Any]:
    reports = await store.report([name])
    state = reports[0].state if reports else None
    return list(state.queue) if state is not None else []


async def live_tokens(store: LockStore, name: str) -> dict[str, str]:
    """Label -> owner token of each live holder of ``name``."""
    (report,) = await store.report([name])
    return {permit.holder["label"]: permit.token for permit in report.live_permits}


async def expire_every_permit(collection: Any, name: str) -> None:
    """End every permit of ``name`` (a semaphore's, a read-write lock's or an election's) on the
    server now, as their TTLs running out would: a test whose lease must expire then neither waits
    for it nor depends on a pause's length."""
    past = datetime(2000, 1, 1)
    expired = await collection.update_one({"_id": name}, {"$set": {"holders.$[].exp": past, "expiresAt": past}})
    assert expired.modified_count == 1, f"{name!r} has no permits to expire"
