"""How the idle-cleanup index keeps a lock collection from growing with every name ever used.

    .venv/bin/python benchmarks/idle_cleanup.py [--sizes 20000 100000] [--give-up 900]

For each size, a fresh embedded server gets the index (``ensure_idle_cleanup_index``, an hour,
its least), then that many lock documents of released names idle for two hours (shaped as the
library writes them, seeded with ``insert_many``: one per order, tenant or file a user locked
once), beside 100 names idle for half an hour and 100 held. Then the collection's size is read
every 5 s, from the seeding's start until only those 200 are left: every idle name gone, none of
the others. Last, a name that was purged is taken again, with a fencing token above the one its
document had. A seeding longer than a minute is swept as it goes: the size printed after it is
what was left then. The sizes over time, beside the names written so far, go to
benchmarks/charts/idle_cleanup.json (plots.py draws them, one panel per size).

The embedded server's TTL monitor runs every 60 s, as MongoDB's does (``ttlMonitorSleepSecs``),
but it is a Python test double: how long its sweep takes says nothing of MongoDB's speed. On
MongoDB a pass is made of sub-passes, each deleting up to ``ttlIndexDeleteTargetDocs`` per TTL
index, and a new sub-pass starts at once while expired documents are left
(src/mongo/db/ttl/README.md in mongodb/mongo): a backlog is cleared in one pass, not one batch a
minute. Not measured on MongoDB here (no mongod on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import environment  # benchmarks/ is on sys.path when this runs as a script
from plots import CHARTS
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, ensure_idle_cleanup_index
from mongolock_async.testing import EmbeddedMongo

KEPT = 100
"""Names idle for less than the index's hour, and names held: none may go."""
_BATCH = 5000
_EVERY = 5.0
"""Seconds between two readings of the collection's size."""


def document(name: str, *, ended: datetime, owner: str | None, fence: int) -> dict[str, Any]:
    """A lock document as the library leaves it: released (``owner`` None) at ``ended``, or held until then."""
    return {
        "_id": name,
        "owner": owner,
        "expiresAt": ended,
        "fence": fence,
        "ttlMs": 30_000,
        "holder": {"host": "worker-host", "pid": 4000, "label": None},
        "acquiredAt": ended - timedelta(seconds=30),
        "renewedAt": ended - timedelta(seconds=30),
        **({"releasedAt": ended} if owner is None else {}),
        "queue": [],
    }


async def seed(collection: Any, idle: int, written: list[int]) -> None:
    """Write ``idle`` released names and the ``KEPT`` others, counting them in ``written[0]``."""
    now = datetime.now(UTC)
    two_hours_ago, half_an_hour_ago = now - timedelta(hours=2), now - timedelta(minutes=30)
    batch: list[dict[str, Any]] = []
    for index in range(idle):
        batch.append(document(f"order:{index:07d}", ended=two_hours_ago, owner=None, fence=1_000_000 + index))
        if len(batch) == _BATCH:
            await collection.insert_many(batch)
            written[0] += len(batch)
            batch = []
    an_hour_on = now + timedelta(hours=1)
    batch += [document(f"recent:{index}", ended=half_an_hour_ago, owner=None, fence=1) for index in range(KEPT)]
    batch += [document(f"held:{index}", ended=an_hour_on, owner=f"owner-{index}", fence=1) for index in range(KEPT)]
    await collection.insert_many(batch)
    written[0] += len(batch)


async def measure(size: int, give_up: float) -> dict[str, Any]:
    """Seed ``size`` idle names and wait for them to go; the run's figures: the size read every
    ``_EVERY`` s from the seeding's start (``curve``)."""
    with EmbeddedMongo() as server:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
        try:
            collection = client["bench"]["locks"]
            await ensure_idle_cleanup_index(collection, 3600)
            started = time.monotonic()
            written = [0]
            curve: list[list[float]] = []  # [seconds since the seeding's start, names written, documents]

            async def reading() -> int:
                documents: int = await collection.count_documents({})
                curve.append([round(time.monotonic() - started, 1), written[0], documents])
                return documents

            async def sample() -> None:
                while True:
                    await reading()
                    await asyncio.sleep(_EVERY)

            sampler = asyncio.create_task(sample())
            try:
                await seed(collection, size, written)
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            seeded_in = time.monotonic() - started
            left = await reading()
            # The monitor sweeps while a long seeding goes on: the collection then holds fewer.
            print(f"{size:>9,} idle names: seeded in {seeded_in:6.1f} s, {left:,} documents then", flush=True)
            while left > 2 * KEPT:
                if time.monotonic() - started - seeded_in > give_up:
                    print(f"  gave up after {give_up:g} s: {left:,} documents left")
                    return {"seeded_in": round(seeded_in, 1), "gave_up_after": give_up, "curve": curve}
                await asyncio.sleep(_EVERY)
                left = await reading()
            swept_in = time.monotonic() - started - seeded_in
            recent = await collection.count_documents({"_id": {"$regex": "^recent:"}})
            held = await collection.count_documents({"_id": {"$regex": "^held:"}})
            peak = max(documents for _, _, documents in curve)
            print(f"  all idle names gone {swept_in:6.1f} s after the seeding; left: {recent} recent, {held} held")
            print(f"  most documents at one reading: {peak:,} (of {written[0]:,} written)")
            lock = AsyncMongoLock(collection, "order:0000000", ttl=10)
            assert await lock.acquire(blocking=False), "a purged name could not be taken again"
            token = lock.fencing_token
            await lock.release()
            print(f"  a purged name taken again: token {token} (its document had {1_000_000})")
            assert recent == KEPT and held == KEPT, "the index deleted a name that was not idle for its hour"
            assert token is not None and token > 1_000_000
            return {"seeded_in": round(seeded_in, 1), "swept_after": round(swept_in, 1), "curve": curve}
        finally:
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--give-up", type=float, default=900.0, help="seconds to wait for a sweep (default 900)")
    arguments = parser.parse_args()
    machine = environment(None)
    print(machine)
    path = CHARTS / "idle_cleanup.json"
    figures: dict[str, Any] = {"environment": machine, "runs": {}}
    for size in arguments.sizes:
        figures["runs"][str(size)] = asyncio.run(measure(size, arguments.give_up))
        path.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"(these figures are in {path}: benchmarks/plots.py draws them)")


if __name__ == "__main__":
    main()
