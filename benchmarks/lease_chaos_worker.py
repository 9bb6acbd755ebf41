"""One OS process of the lease chaos: TASKS tasks contend for one lock name until a deadline, through
the fail points the chaos arms, and write down when each believed it held which lease.

    python benchmarks/lease_chaos_worker.py {real|control} DATABASE NAME TASKS SECONDS START_AT OUT < URI

The URI comes on stdin. Each task, in a loop: a blocking acquire with a timeout of 0.2 to 1 s (TTL
1.5 s, no heartbeat; half of them served in turn, ``fair``), a hold of up to 0.3 s, a release.
Each lease it held is written to OUT as a JSON line: fencing token (which names the lease: a claim
keeps it, every other acquisition raises it), and the times (CLOCK_MONOTONIC, shared by the
machine's processes) from which and until which the task believed it held it: from the acquire's
return to the release, or to the lease's local deadline if that came first. ``control`` is a
broken holder (see ``broken_hold``): it renews leases it no longer believes it holds, and puts a
released token back as the owner of a live lease, so that the chaos can show that its detectors
work. Prints its counts as JSON when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from mongolock_async import AsyncMongoLock, LockError

TTL = 1.5
ACQUIRE_TIMEOUTS = (0.2, 1.0)
"""Each acquire's timeout is drawn from this range: waiters give up at every moment of a request's flight."""
FAIR = 0.5
"""The share of acquires served in turn: a release then hands the lease to the oldest place first."""
LONGEST_HOLD = 0.3
APP_NAME = "lease-chaos"
"""The workers' clients' appName: the chaos's fail points are scoped to it."""


async def hold(lock: AsyncMongoLock, kind: str, side: Any, counts: Counter[str]) -> tuple[float, float]:
    """Hold the lease ``lock`` has just taken; the span in which its holder believed it held it."""
    start = time.monotonic()
    if kind == "control":
        counts[await broken_hold(lock, side)] += 1
        return start, start
    await asyncio.sleep(random.uniform(0, LONGEST_HOLD))
    deadline = lock.deadline
    end = time.monotonic() if deadline is None else min(time.monotonic(), deadline)
    with contextlib.suppress(LockError, PyMongoError):  # the lease was held all the same
        await lock.release()
    return start, end


async def broken_hold(lock: AsyncMongoLock, side: Any) -> str:
    """What the control's holder does with each lease, which it stops believing it holds at once:
    renews it every 0.5 s for 3 s (a renewal after its handle let go), releases it, then writes its
    owner token back as a live lease for a second (as a late request of a released token did).
    ``side`` is the lock collection through a client the fail points leave alone: the broken writes
    land whatever the faults, so that every control run shows them. The token is put back only if
    the document records it as released. Returns what became of the put-back, for the counts."""
    name = lock.name
    owner = (await side.find_one({"_id": name}, {"owner": 1}))["owner"]
    renew = [{"$set": {"expiresAt": {"$add": [{"$toDate": {"$toLong": "$$NOW"}}, TTL * 1000]}}}]
    for _ in range(6):
        await asyncio.sleep(0.5)
        await side.update_one({"_id": name, "owner": owner}, renew)
    with contextlib.suppress(LockError, PyMongoError):  # then nothing is put back
        await lock.release()
    back = [{"$set": {"owner": owner, "expiresAt": {"$add": [{"$toDate": {"$toLong": "$$NOW"}}, 1000]}}}]
    released = {"_id": name, "$or": [{"releasedOwner": owner}, {"recentReleases.o": owner}]}
    # Whoever holds it now: this holder is broken.
    put_back = (await side.update_one(released, back)).modified_count
    return "put back" if put_back else "not put back"


async def task(
    collection: Any, side: Any, kind: str, name: str, stop_at: float, leases: list[str], counts: Counter[str]
) -> None:
    while time.monotonic() < stop_at:
        lock = AsyncMongoLock(collection, name, ttl=TTL, fair=random.random() < FAIR)
        try:
            if not await lock.acquire(timeout=random.uniform(*ACQUIRE_TIMEOUTS)):
                counts["timed out"] += 1
                continue
            token = lock.fencing_token
            start, end = await hold(lock, kind, side, counts)
        except (LockError, PyMongoError) as error:
            counts[type(error).__name__] += 1
            await asyncio.sleep(0.01)
            continue
        counts["held"] += 1
        leases.append(json.dumps([token, start, end]))


async def run(
    kind: str, uri: str, database: str, name: str, tasks: int, seconds: float, start_at: float
) -> tuple[Counter[str], list[str]]:
    """The counts, and a JSON line per lease held."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, appName=APP_NAME)
    collection = client[database]["locks"]
    side_client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    await client.admin.command("ping")
    counts: Counter[str] = Counter()
    leases: list[str] = []
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    side = side_client[database]["locks"]
    stop_at = start_at + seconds
    await asyncio.gather(*(task(collection, side, kind, name, stop_at, leases, counts) for _ in range(tasks)))
    await client.close()
    await side_client.close()
    return counts, leases


if __name__ == "__main__":
    kind, database, name, tasks, seconds, start_at, out = sys.argv[1:8]
    uri = sys.stdin.readline().strip()
    counts, leases = asyncio.run(run(kind, uri, database, name, int(tasks), float(seconds), float(start_at)))
    Path(out).write_text("".join(line + "\n" for line in leases))
    print(json.dumps(counts))
