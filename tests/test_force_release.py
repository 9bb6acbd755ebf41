"""``LockStore.force_release(name, holder=...)`` breaks exactly the holder asked for, or nothing.

The owner tokens of one process's waiting places all start with that process's prefix, so two
permits of one process share any short start of their tokens: a ``holder`` that more than one live
holder matches is refused, never taken as "all of them".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore
from mongolock_async.store import LockStore
from tests.conftest import CommandCounter


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


async def test_a_holder_that_names_two_permits_is_refused_and_breaks_nothing(lock_collection: Any) -> None:
    tokens = await two_permits_of_one_process(lock_collection)
    store = LockStore(lock_collection, WriteConcern(w="majority"))
    shared = tokens["export-a"][:12]  # what `inspect` used to show of each
    with pytest.raises(ValueError, match="matches 2 holders") as refused:
        await store.force_release("pool", holder=shared)
    assert tokens["export-a"] in str(refused.value) and tokens["export-b"] in str(refused.value)
    with pytest.raises(LookupError, match="no live holder") as unknown:
        await store.force_release("pool", holder="feedface")
    assert tokens["export-a"] in str(unknown.value) and tokens["export-b"] in str(unknown.value)
    assert await live_tokens(store, "pool") == tokens, "nothing was broken"


async def test_a_holder_breaks_exactly_that_permit(lock_collection: Any) -> None:
    tokens = await two_permits_of_one_process(lock_collection)
    store = LockStore(lock_collection, WriteConcern(w="majority"))
    broken = await store.force_release("pool", holder=tokens["export-a"])
    assert broken is not None and [owner for owner, _, _ in broken.permits] == [tokens["export-a"]]
    assert await live_tokens(store, "pool") == {"export-b": tokens["export-b"]}
    # A unique start of a token is enough.
    broken = await store.force_release("pool", holder=tokens["export-b"][:20])
    assert broken is not None and [owner for owner, _, _ in broken.permits] == [tokens["export-b"]]
    assert await live_tokens(store, "pool") == {}


async def test_a_holder_on_a_lock_must_be_its_owner(lock_collection: Any) -> None:
    lock = AsyncMongoLock(lock_collection, "job", ttl=120.0, label="worker")
    assert await lock.acquire(blocking=False)
    store = LockStore(lock_collection, WriteConcern(w="majority"))
    (report,) = await store.report(["job"])
    assert report.state is not None and report.state.owner is not None
    owner = report.state.owner
    with pytest.raises(LookupError, match="no live holder"):
        await store.force_release("job", holder="not-" + owner)
    assert (await store.report(["job"]))[0].remaining_ms is not None, "nothing was broken"
    broken = await store.force_release("job", holder=owner[:10])
    assert broken is not None and broken.owner == owner


@pytest.mark.parametrize(("holder", "error"), [("", ValueError), (b"abc", TypeError), (12, TypeError)])
async def test_a_bad_holder_is_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter, holder: Any, error: type[Exception]
) -> None:
    store = LockStore(counted_collection, WriteConcern(w="majority"))
    with pytest.raises(error, match="holder"):
        await store.force_release("pool", holder=holder)
    assert command_counter.names == []
