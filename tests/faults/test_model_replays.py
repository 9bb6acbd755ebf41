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

A late acquire of a token whose lease was handed over and released
-----------------------------------------------------------------
The real model's "held" configuration, before it learnt issue 36's store:

1. a task holds the lock; the next task of its process waits, and its attempt is held at the
   server (past the acquire's timeout, which cuts it off);
2. the holder releases, naming that waiter's place as its successor: the lease is handed to it;
3. the waiter holds the lease and releases it (its token is released, in ``recentReleases``);
4. another process takes the lock and holds it while the held attempt lands: the attempt queues
   its token's place again;
5. that holder releases, handing the lock to the place: a lease nobody holds, for a TTL.

The check, for both: once the last holder has released, another process takes the lock at once;
and no release finds its lease gone before its local deadline. No pause can make a correct library
fail them (marked ``safety``); one that puts the second trace's step 2 past its waiter's timeout
leaves nothing to judge, and that trace runs again on a fresh name.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.fail_points import FaultServer
from tests.support.held_requests import held_by_nobody, hold_requests, two_processes
from tests.workers.belief import release_as_promised
from tests.workers.giving_up_worker import acquire, handle

pytestmark = pytest.mark.safety

TTL = 1.5
HELD_FOR = 1.0
"""How long the fail point holds the first attempt of each name: it lands about this long after the start."""
GIVE_UP_AFTER = 0.3
HOLD_FOR = 0.2
"""How long the first holder of the second trace holds before it releases to the held waiter."""
RELEASE_AFTER_LANDING = [0.1, 0.3]
"""When the second waiter releases, after the held attempt landed (the trace's step 5 follows 4)."""


@pytest.mark.parametrize("kind", ["lock", "fair-lock"])
async def test_a_withdrawal_before_the_document_exists_still_makes_the_late_attempt_inert(
    mongolock_driver: str, fault_server: FaultServer, kind: str
) -> None:
    async with two_processes(fault_server, mongolock_driver) as (collection, elsewhere):
        await collection.find_one({})  # connected, and the server's version checked, before the clock starts
        names = [f"replay-{n}" for n in range(len(RELEASE_AFTER_LANDING))]
        # Step 1: each name's first attempt (its first findAndModify) is held at the server.
        await hold_requests(collection, len(names), HELD_FOR)
        started = time.monotonic()
        firsts = [asyncio.ensure_future(acquire(handle(collection, kind, name, TTL), GIVE_UP_AFTER)) for name in names]
        # Step 2: each gives up (its only attempt is held) and withdraws its token.
        assert not any(await asyncio.gather(*firsts)), "a first waiter got the lock: its attempt was not held"
        runs = [
            _next_waiter(collection, kind, name, started + HELD_FOR + after)
            for name, after in zip(names, RELEASE_AFTER_LANDING, strict=True)
        ]
        await asyncio.gather(*runs)
        refused = await held_by_nobody(elsewhere, names, lambda name: handle(elsewhere, kind, name, TTL))
        assert not refused, f"held by nobody after the last release: {refused}"


async def _next_waiter(collection: object, kind: str, name: str, release_at: float) -> None:
    """Steps 3 to 5: the next waiter of the same process (a queue of its own, a new token) takes the
    lock and holds it until after the held attempt landed, then releases it."""
    lock = handle(collection, kind, name, TTL)
    assert await lock.acquire(timeout=30)  # a free lock, unless the server stalls
    await asyncio.sleep(max(0.0, release_at - time.monotonic()))
    await release_as_promised(lock)


@pytest.mark.parametrize("kind", ["lock", "fair-lock"])
async def test_a_late_acquire_of_a_token_handed_over_and_released_queues_nothing(
    mongolock_driver: str, fault_server: FaultServer, kind: str
) -> None:
    async with two_processes(fault_server, mongolock_driver) as (collection, elsewhere):
        for attempt in range(3):
            name = f"replay-handed-{attempt}"
            first = handle(collection, kind, name, TTL)
            assert await first.acquire(blocking=False)
            # Step 1: the next waiter's attempt is held at the server.
            await hold_requests(collection, 1, HELD_FOR)
            started = time.monotonic()
            second = handle(collection, kind, name, TTL)
            waiting = asyncio.ensure_future(second.acquire(timeout=GIVE_UP_AFTER + HOLD_FOR))
            await asyncio.sleep(HOLD_FOR)
            # Step 2: the release hands the lease to the waiter's place; step 3: it holds, then releases.
            await release_as_promised(first)
            if await waiting:
                break
            # A pause let the waiter's timeout pass first: no trace to replay. Its attempt lands, then again.
            await asyncio.sleep(max(0.0, started + HELD_FOR + 0.2 - time.monotonic()))
        else:
            pytest.fail("the waiter did not get the lease the release handed it, three times")
        await release_as_promised(second)
        # Step 4: another process holds the lock while the held attempt lands.
        holder = handle(elsewhere, kind, name, TTL)
        assert await holder.acquire(blocking=False)
        await asyncio.sleep(max(0.0, started + HELD_FOR + 0.2 - time.monotonic()))
        # Step 5.
        await release_as_promised(holder)
        refused = await held_by_nobody(elsewhere, [name], lambda name: handle(elsewhere, kind, name, TTL))
        assert not refused, f"held by nobody after the last release: {refused}"
