"""One OS process of the election tests.

``contend``: CANDIDATES candidates (tasks) lead in turn until SECONDS have passed: each runs
``election.lead(work)``, where ``work`` records (entered, left, term, pid) of its term on
CLOCK_MONOTONIC (shared by the machine's processes), as its candidate says it led
(``belief.Belief``: only while its leadership's lease is live), and resigns after a short while.
Prints one JSON line per term. ``broken`` does the same with an election that reads who leads,
then makes itself leader, in two round trips: the classic race, so the test can show its detector
fires.

``lead``: one candidate leads (TTL from SECONDS) and prints ``leading <term>``, then keeps leading
until it is killed or stopped; it prints ``lost <monotonic time>`` if it learns of a loss (and
campaigns again). With ``fenced`` it also hands each term to a task that writes to the document
"resource" every 50 ms with it as the fencing token, for as long as the process runs (a loss does
not stop it), printing ``wrote <monotonic time it was sent> {applied|refused} <term>`` after each
write.

    python tests/workers/election_worker.py URI DATABASE COLLECTION {contend|broken} CANDIDATES SECONDS START_AT
    python tests/workers/election_worker.py URI DATABASE COLLECTION lead - TTL {-|fenced}
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from belief import Belief  # tests/workers/, this script's directory
from contention import keep_going
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection
from mongolock_async.fencing import fenced_update_one

NAME = "leader"


class ReadThenSetElection:
    """A deliberately broken election: sees nobody leading, then writes itself in, not atomically."""

    deadline: float | None = None  # it believes it leads from its win to its resignation

    def __init__(self, collection: Any) -> None:
        self.collection = collection
        self.token = secrets.token_hex(8)

    async def lead(self, work: Callable[[int], Awaitable[object]]) -> None:
        while True:
            doc = await self.collection.find_one({"_id": NAME}) or {}
            if doc.get("leader") is None:
                term = doc.get("term", 0) + 1
                await self.collection.update_one(
                    {"_id": NAME}, {"$set": {"leader": self.token, "term": term}}, upsert=True
                )
                self.deadline = math.inf
                try:
                    await work(term)
                finally:
                    self.deadline = None
                    await self.collection.update_one({"_id": NAME, "leader": self.token}, {"$set": {"leader": None}})
                return
            await asyncio.sleep(random.uniform(0, 0.002))


ENOUGH = 8  # per process: the test judges 30 from 4 processes


async def contend(collection: Any, kind: str, stop_at: float, terms: list[Any]) -> None:
    while keep_going(stop_at, terms, ENOUGH):
        candidate: Any = (
            ReadThenSetElection(collection)
            if kind == "broken"
            else AsyncMongoElection(collection, NAME, ttl=10.0, retry_base=0.005, retry_cap=0.05)
        )

        async def work(term: int, candidate: Any = candidate) -> None:
            # A loss cancels it (``lead`` then campaigns again): what it believed up to the loss
            # is its term.
            belief = Belief(candidate)
            belief.holds()
            try:
                # Long enough for the other candidates to be waiting when this term ends.
                await asyncio.sleep(random.uniform(0.02, 0.05))
            finally:
                belief.leaves()
                if belief.section is not None:
                    terms.append((*belief.section, term, os.getpid()))

        await candidate.lead(work)


async def lead(collection: Any, ttl: float, fenced: bool) -> None:
    election = AsyncMongoElection(collection, NAME, ttl=ttl, label=f"leader {os.getpid()}")
    stopped = asyncio.Event()
    writers: set[asyncio.Task[None]] = set()

    async def write_forever(term: int) -> None:
        # Code the leader handed its term to, outside the leader-only work: a loss cannot cancel it.
        while True:
            await asyncio.sleep(0.05)
            # The time it was sent: a write in flight when the process is stopped is applied, or
            # not, before the process resumes and reads its reply.
            sent_at = time.monotonic()
            written = await fenced_update_one(
                collection.database["resource"], {"_id": "resource"}, {"$inc": {"writes": 1}}, token=term, upsert=True
            )
            print("wrote", sent_at, "applied" if written.applied else "refused", term, flush=True)

    async def work(term: int) -> None:
        print("leading", term, flush=True)
        if fenced:
            writers.add(asyncio.create_task(write_forever(term)))
        try:
            await stopped.wait()
        except asyncio.CancelledError:
            print("lost", time.monotonic(), flush=True)
            raise

    await election.lead(work)


async def main(uri: str, database: str, name: str, mode: str, candidates: str, seconds: str, start: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database][name]
    await client.admin.command("ping")
    if mode == "lead":
        await lead(collection, float(seconds), start == "fenced")
        return
    await asyncio.sleep(max(0.0, float(start) - time.monotonic()))
    terms: list[Any] = []
    stop_at = time.monotonic() + float(seconds)
    await asyncio.gather(*(contend(collection, mode, stop_at, terms) for _ in range(int(candidates))))
    await client.close()
    for term in terms:
        print(json.dumps(term))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
