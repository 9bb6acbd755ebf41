"""Counterexamples the model checker found in the lease protocol (model/lease.pml; docs/model.md),
each replayed against the library on a real wire server, the fault at the step the trace put it.

A withdrawal that lands before the document exists
--------------------------------------------------
``python3 model/check.py --only ctl-leave-no-upsert --trail`` (and, before the model learnt issue
36's store, the real model's "held" configuration) prints this trace:

1. a waiter's first attempt on a name that has no document yet is held at the server;
2. its timeout passes: it gives up, and its process withdraws its place's token. No document holds
   it yet, so a withdrawal that only updates writes nothing;
3. the next waiter of that process, in a queue of its own (a new token), creates the document and
   takes the lock;
4. the held attempt lands: the token was never recorded as withdrawn, so it queues its place;
5. the holder releases, handing the lock to that place: a lease nobody holds, for a whole TTL,
   while the lock looks held (P3, the orphan promise: docs/model.md).

The check is a user's: once the holder has released, another process takes the lock at once.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from mongolock_async.testing.clients import TEST_DATABASE, close_client
from tests.conftest import FaultServer, set_fail_point
from tests.giving_up_worker import acquire, handle

TTL = 1.5
HELD_FOR = 1.0
"""How long the fail point holds the first attempt of each name: it lands about this long after the start."""
GIVE_UP_AFTER = 0.3
RELEASE_AFTER_LANDING = [0.1, 0.3]
"""When the second waiter releases, after the held attempt landed (the trace's step 5 follows 4)."""


@pytest.mark.xfail(
    strict=True,
    reason="issue 36's store makes a withdrawal create the document it withdraws from (LockStore.leave "
    "upserts): remove this mark when it is merged, the test then passes",
)
@pytest.mark.parametrize("kind", ["lock", "fair-lock"])
async def test_a_withdrawal_before_the_document_exists_still_makes_the_late_attempt_inert(
    driver: str, fault_server: FaultServer, kind: str
) -> None:
    waiters, others = fault_server.client(driver), fault_server.client(driver, app_name=f"{fault_server.app_name}-2")
    try:
        collection = waiters[TEST_DATABASE][fault_server.collection]
        elsewhere = others[TEST_DATABASE][fault_server.collection]
        await collection.find_one({})  # connected, and the server's version checked, before the clock starts
        names = [f"replay-{n}" for n in range(len(RELEASE_AFTER_LANDING))]
        # Step 1: each name's first attempt (its first findAndModify) is held at the server.
        await set_fail_point(
            collection, {"times": len(names)}, failCommands=["findAndModify"], blockConnection=True,
            blockTimeMS=int(HELD_FOR * 1000),
        )  # fmt: skip
        started = time.monotonic()
        firsts = [asyncio.ensure_future(acquire(handle(collection, kind, name, TTL), GIVE_UP_AFTER)) for name in names]
        # Step 2: each gives up (its only attempt is held) and withdraws its token.
        assert not any(await asyncio.gather(*firsts)), "a first waiter got the lock: its attempt was not held"
        runs = [
            _next_waiter(collection, kind, name, started + HELD_FOR + after)
            for name, after in zip(names, RELEASE_AFTER_LANDING, strict=True)
        ]
        await asyncio.gather(*runs)
        refused = {}
        for name in names:
            fresh = handle(elsewhere, kind, name, TTL)
            if await fresh.acquire(blocking=False):
                await fresh.release()
            else:
                refused[name] = await elsewhere.find_one({"_id": name}, {"owner": 1, "queue": 1, "withdrawn": 1})
        assert not refused, f"held by nobody after the last release: {refused}"
    finally:
        await set_fail_point(collection, "off")
        await close_client(waiters)
        await close_client(others)


async def _next_waiter(collection: object, kind: str, name: str, release_at: float) -> None:
    """Steps 3 to 5: the next waiter of the same process (a queue of its own, a new token) takes the
    lock and holds it until after the held attempt landed, then releases it."""
    lock = handle(collection, kind, name, TTL)
    assert await lock.acquire(timeout=5)
    await asyncio.sleep(max(0.0, release_at - time.monotonic()))
    assert await lock.release()
