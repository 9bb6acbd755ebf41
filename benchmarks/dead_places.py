"""Waiting behind the place of a killed process, reported as times and request counts.

A waiting process that is killed (SIGKILL) cannot withdraw its place in a lock's queue; the place
counts until it expires (its TTL after its last refresh). Three measurements, each over several
rounds on fresh names:

1. A fair lock: the holder's lease (TTL 1.5 s) expires unreleased while a killed process's place
   (TTL 4 s) is first in the queue. A live waiter of this process may take the lock only once that
   place expires: how long after the kill it does, and how many acquire requests (findAndModify)
   it sent meanwhile, per second of waiting.
2. An election: the leader (TTL 2 s) and the first candidate (TTL 4 s) are killed together; how
   long until the live candidate (TTL 15 s) leads. The place expires within 4 s of the kill.
3. A lock released while a killed waiter's place (TTL 2 s) is first: the release hands the lease to
   it; how long until another handle takes the lock (the bound is that place's TTL).

    python benchmarks/dead_places.py [--uri URI] [--rounds 3]

Without ``--uri``/``MONGODB_URI`` it starts an embedded server. It prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _common import environment, mongodb, start_worker  # benchmarks/ is on sys.path when this runs as a script
from hot_lock_worker import Requests
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection, AsyncMongoLock

HOLDER_TTL, DEAD_TTL = 1.5, 4.0


async def wait_in_queue(kind: str, name: str, ttl: float) -> None:
    """A worker: queue for ``name`` and wait until killed (printing ``acquired`` if it gets it)."""
    uri = sys.stdin.readline().strip()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client["bench"]["dead_places"]
    lock: AsyncMongoLock
    if kind == "election":
        lock = AsyncMongoElection(collection, name, ttl=ttl)
        await lock.campaign()
    else:
        lock = AsyncMongoLock(collection, name, ttl=ttl, fair=kind == "fair-lock")
        assert await lock.acquire()
    print("acquired", flush=True)
    await asyncio.Event().wait()  # holding the lock (with ``lock`` referenced) until killed


async def queued(collection: Any, name: str, pid: int) -> None:
    """Return once process ``pid`` has a place in ``name``'s queue."""
    while True:
        doc = await collection.find_one({"_id": name}) or {}
        if any((place.get("holder") or {}).get("pid") == pid for place in doc.get("queue") or []):
            return
        await asyncio.sleep(0.02)


def queue_in(uri: str, kind: str, name: str, ttl: float) -> Any:
    return start_worker(Path(__file__).resolve(), ["--worker", kind, name, str(ttl)], uri)


def kill(*workers: Any) -> float:
    for worker in workers:
        worker.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    for worker in workers:
        worker.wait()
    return killed_at


async def fair_lock_behind_a_dead_place(uri: str, rounds: int) -> None:
    requests = Requests()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[requests])
    collection = client["bench"]["dead_places"]
    waits, rates = [], []
    for _ in range(rounds):
        name = f"fair-{uuid.uuid4().hex[:8]}"
        holder = AsyncMongoLock(collection, name, ttl=HOLDER_TTL, fair=True)
        assert await holder.acquire()
        dead = queue_in(uri, "fair-lock", name, DEAD_TTL)
        await queued(collection, name, dead.pid)
        killed_at = kill(dead)
        requests.reset()
        live = AsyncMongoLock(collection, name, ttl=30.0, fair=True)
        assert await live.acquire(timeout=60)
        waited = time.monotonic() - killed_at
        waits.append(waited)
        rates.append(requests.sent.get("findAndModify", 0) / waited)
        await live.release()
    print(
        f"fair lock, holder TTL {HOLDER_TTL:g} s expired, killed waiter's place (TTL {DEAD_TTL:g} s) first: "
        f"the live waiter took it {', '.join(f'{w:.2f}' for w in waits)} s after the kill, sending "
        f"{', '.join(f'{r:.1f}' for r in rates)} acquire requests per second meanwhile",
        flush=True,
    )
    await client.close()


async def election_behind_a_dead_candidate(uri: str, rounds: int) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client["bench"]["dead_places"]
    gaps = []
    for _ in range(rounds):
        name = f"election-{uuid.uuid4().hex[:8]}"
        leader = queue_in(uri, "election", name, 2.0)
        assert leader.stdout is not None
        await asyncio.to_thread(leader.stdout.readline)  # it leads
        first = queue_in(uri, "election", name, DEAD_TTL)
        await queued(collection, name, first.pid)
        live = AsyncMongoElection(collection, name)
        campaign = asyncio.create_task(live.campaign())
        await queued(collection, name, os.getpid())
        killed_at = kill(leader, first)
        await campaign
        gaps.append(time.monotonic() - killed_at)
        await live.resign()
    print(
        f"election, leader (TTL 2 s) and first candidate (TTL {DEAD_TTL:g} s) killed together: the live candidate "
        f"(TTL 15 s) leads {', '.join(f'{g:.2f}' for g in gaps)} s after the kill (median "
        f"{statistics.median(gaps):.2f} s)",
        flush=True,
    )
    await client.close()


async def lock_handed_to_a_dead_place(uri: str, rounds: int) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client["bench"]["dead_places"]
    gaps = []
    for _ in range(rounds):
        name = f"handed-{uuid.uuid4().hex[:8]}"
        holder = AsyncMongoLock(collection, name, ttl=30.0)
        assert await holder.acquire()
        dead = queue_in(uri, "lock", name, 2.0)
        await queued(collection, name, dead.pid)
        kill(dead)
        await holder.release()
        released_at = time.monotonic()
        fresh = AsyncMongoLock(collection, name, ttl=30.0)
        assert await fresh.acquire(timeout=60)
        gaps.append(time.monotonic() - released_at)
        await fresh.release()
    print(
        "lock released to a killed waiter's place (TTL 2 s): another handle took it "
        f"{', '.join(f'{g:.2f}' for g in gaps)} s after the release (bound: that place's TTL)",
        flush=True,
    )
    await client.close()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        kind, name, ttl = sys.argv[2:5]
        asyncio.run(wait_in_queue(kind, name, float(ttl)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement")
    arguments = parser.parse_args()
    print(environment(arguments.uri), flush=True)
    with mongodb(arguments.uri) as uri:
        asyncio.run(fair_lock_behind_a_dead_place(uri, arguments.rounds))
        asyncio.run(election_behind_a_dead_candidate(uri, arguments.rounds))
        asyncio.run(lock_handed_to_a_dead_place(uri, arguments.rounds))


if __name__ == "__main__":
    main()
