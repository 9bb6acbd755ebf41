"""The lease chaos: tasks of several processes contend for one lock name (TTL 1.5 s, no heartbeat,
acquire timeouts of 0.2 to 1 s, half of the acquires served in turn) while a fail point, armed
every 150 ms, closes the connection of the next findAndModify or update or holds it for 250 ms.
Meanwhile the lock's document is read every 20 ms. Two things are checked:

- the promise: an outcome lost in transit may leave a lease that nobody believes it holds, until
  that lease expires, never longer. So no lease may stay live on the server, with no task believing
  it holds it, for more than a TTL (plus the reads' coarseness);
- what keeps it: no read may show a live lease owned by a token that its document records as done
  with (withdrawn by its waiters, or released). Such a lease is held by nobody: a late request of a
  token its process had moved on from took it, or a release handed it to a place nobody waits
  behind (tests/faults/test_late_requests.py and tests/handles/test_giving_up.py sweep those windows).

    python benchmarks/lease_chaos.py [--seconds 60 | --minutes M] [--processes 2] [--tasks 3]
                                     [--control-seconds 10] [--uri URI] [--database lease_chaos] [--json]

Runs on the server at ``--uri`` (default ``MONGODB_URI``), which must accept ``configureFailPoint``
(mongod started with ``--setParameter enableTestCommands=1``), in the database ``--database``
(dropped before each run and at the end); without one, on an embedded server with the test commands
that it starts. The fail points are scoped to the workers' appName (``lease-chaos``), but a server
has one ``failCommand`` fail point: nothing else may arm it meanwhile. A control run of a broken
holder (it renews leases it no longer believes it holds, and puts a released token back as a live
lease's owner) must trip both checks: the detectors work. Prints the environment and a summary
(with ``--json``, one JSON line last); exits 1 if a check failed or the control tripped neither.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import collect_counts, environment, start_worker  # benchmarks/ is the script's directory
from lease_chaos_worker import APP_NAME, TTL
from pymongo import AsyncMongoClient
from pymongo.read_concern import ReadConcern

from mongolock_async.store.expressions import SERVER_NOW
from mongolock_async.testing import EmbeddedMongo

WORKER = Path(__file__).resolve().with_name("lease_chaos_worker.py")
NAME = "contended"
FAULT_EVERY, HELD_MS, READ_EVERY = 0.15, 250, 0.02
SLACK = 0.5
"""How much longer than a TTL a lease nobody believes in may be seen live: the reads' interval, a
reply's way back, a worker's loop running late on a loaded machine, and the time its holder took to
learn of a hand-off and claim it (a claim cut off by its waiter's patience counts from its landing)."""


_NOT_ERRORS = ("held", "timed out", "put back", "not put back")


@dataclass(frozen=True)
class Span:
    """A stretch of reads that all saw a live lease that no task believed it held."""

    first: float
    last: float
    tokens: tuple[int, ...]
    """The fencing tokens of the leases seen (one, or for the name: several, one after another)."""

    @property
    def seconds(self) -> float:
        return self.last - self.first + READ_EVERY


async def inject_faults(uri: str, until: float) -> int:
    """Until ``until``: every 150 ms, a fail point for the next findAndModify or update of the
    workers, closing its connection or holding it 250 ms. Returns how many were armed."""
    armed = 0
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        while time.monotonic() < until:
            await asyncio.sleep(FAULT_EVERY)
            data: dict[str, Any] = {"appName": APP_NAME, "failCommands": ["findAndModify", "update"]}
            if random.random() < 0.5:
                data["closeConnection"] = True
            else:
                data.update(blockConnection=True, blockTimeMS=HELD_MS)
            await client.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": data})
            armed += 1
        await client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    finally:
        await client.close()
    return armed


# The lock's document as the reads need it: the live lease's token and owner (on the server's clock),
# and the owner tokens the document records as done with (withdrawn, or released).
_READ = [
    {"$match": {"_id": NAME}},
    {
        "$project": {
            "fence": 1,
            "owner": 1,
            "live": {"$and": [{"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", SERVER_NOW]}]},
            "done": {
                "$concatArrays": [
                    {"$ifNull": ["$withdrawn", []]},
                    {"$map": {"input": {"$ifNull": ["$recentReleases", []]}, "in": "$$this.o"}},
                    [{"$ifNull": ["$releasedOwner", None]}],
                ]
            },
        }
    },
]


@dataclass(frozen=True)
class Read:
    at: float
    """When the reply came (CLOCK_MONOTONIC)."""
    token: int | None
    """The fencing token of the live lease; None while the lock is free or its lease expired."""
    owner_done: bool
    """Whether the live lease's owner token is one the document records as withdrawn or released."""


async def read_the_lease(uri: str, database: str, stop: asyncio.Event) -> list[Read]:
    """The lock's document, read every 20 ms until ``stop`` is set."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[database]["locks"].with_options(read_concern=ReadConcern("majority"))
    reads: list[Read] = []
    try:
        while not stop.is_set():
            docs = await (await collection.aggregate(_READ)).to_list(None)
            live = bool(docs) and docs[0]["live"]
            owner_done = live and docs[0]["owner"] in docs[0]["done"]
            reads.append(Read(time.monotonic(), docs[0]["fence"] if live else None, owner_done))
            await asyncio.sleep(READ_EVERY)
    finally:
        await client.close()
    return reads


def unheld_spans(
    reads: Sequence[Read], beliefs: dict[int, list[tuple[float, float]]], *, per_lease: bool
) -> list[Span]:
    """The stretches of consecutive reads that saw a live lease that no task believed it held,
    longest first: of one lease each (``per_lease``), or of the name, whichever leases they saw. A
    read counts as believed if it came back while a holder of its lease believed, or within half
    ``SLACK`` of it (the server's write precedes the reply that starts the belief)."""
    spans: list[Span] = []
    current: list[tuple[float, int]] = []

    def close() -> None:
        if current:
            spans.append(Span(current[0][0], current[-1][0], tuple(dict.fromkeys(token for _, token in current))))
        current.clear()

    for read in reads:
        at, token = read.at, read.token
        if token is None or any(start - SLACK / 2 <= at <= end + SLACK / 2 for start, end in beliefs.get(token, ())):
            close()
            continue
        if per_lease and current and current[-1][1] != token:
            close()
        current.append((at, token))
    close()
    return sorted(spans, key=lambda span: span.seconds, reverse=True)


def described(spans: list[Span], start_at: float) -> list[dict[str, Any]]:
    """The five longest spans, for the report (``from``: seconds into the run)."""
    return [
        {"seconds": round(span.seconds, 3), "tokens": list(span.tokens), "from": round(span.first - start_at, 3)}
        for span in spans[:5]
    ]


async def chaos(uri: str, kind: str, arguments: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """One run: workers, fail points and reads for ``seconds``; what they saw."""
    await drop(uri, arguments.database)
    directory = Path(tempfile.mkdtemp(prefix="mongolock-chaos-"))
    outputs = [directory / f"leases-{i}.jsonl" for i in range(arguments.processes)]
    start_at = time.monotonic() + 2.0  # the workers' imports and connections first
    workers = [
        start_worker(WORKER, [kind, arguments.database, NAME, str(arguments.tasks), str(seconds), str(start_at),
                              str(out)], uri)
        for out in outputs
    ]  # fmt: skip
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    stop_reading = asyncio.Event()
    reading = asyncio.create_task(read_the_lease(uri, arguments.database, stop_reading))
    armed = await inject_faults(uri, start_at + seconds)
    counts = await asyncio.to_thread(collect_counts, workers)  # a task's last hold may outlast the faults
    # Read on for a TTL past the workers' end, until the last lease left behind has expired.
    await asyncio.sleep(TTL + SLACK)
    stop_reading.set()
    reads = await reading
    beliefs: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for out in outputs:
        for line in out.read_text().splitlines():
            token, start, end = json.loads(line)
            beliefs[token].append((start, end))
    shutil.rmtree(directory)
    leases, name = unheld_spans(reads, beliefs, per_lease=True), unheld_spans(reads, beliefs, per_lease=False)
    return {
        "seconds": seconds,
        "leases held": counts["held"],
        "acquires timed out": counts["timed out"],
        "errors": {key: value for key, value in counts.items() if key not in _NOT_ERRORS},
        "released tokens put back": counts["put back"],
        "releases not recorded (none put back)": counts["not put back"],
        "fail points armed": armed,
        "reads": len(reads),
        "leases left by lost outcomes": sum(1 for span in leases if span.seconds > 0.5),
        "reads of a lease held by a token done with": sum(read.owner_done for read in reads),
        "longest unheld leases": described(leases, start_at),
        "longest the name was held by nobody": described(name, start_at),
    }


async def drop(uri: str, database: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        await client.drop_database(database)
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def server(uri: str | None, database: str) -> AsyncIterator[str]:
    """The server given (its database dropped at the end), or an embedded one with the test commands."""
    if uri:
        try:
            yield uri
        finally:
            await drop(uri, database)
        return
    async with EmbeddedMongo(test_commands=True) as embedded:
        yield embedded.uri


def longest(run: dict[str, Any], key: str = "longest unheld leases") -> float:
    return run[key][0]["seconds"] if run[key] else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, help="instead of --seconds")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=3, help="per process")
    parser.add_argument("--control-seconds", type=float, default=10.0)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"), help="a server with the test commands")
    parser.add_argument("--database", default="lease_chaos", help="dropped before each run and at the end")
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    seconds = arguments.seconds if arguments.minutes is None else arguments.minutes * 60
    print(environment(arguments.uri), flush=True)
    print(f"{arguments.processes} processes x {arguments.tasks} tasks on one name, TTL {TTL:g} s, no heartbeat, "
          f"0.2-1 s acquire timeouts, half fair; a fail point every {FAULT_EVERY * 1000:.0f} ms",
          flush=True)  # fmt: skip
    async with server(arguments.uri, arguments.database) as uri:
        real = await chaos(uri, "real", arguments, seconds)
        control = await chaos(uri, "control", arguments, arguments.control_seconds)
    bound = TTL + SLACK
    done_real, done_control = (run["reads of a lease held by a token done with"] for run in (real, control))
    print(
        f"\nchaos, {seconds:g} s: {real['leases held']} leases held, {real['acquires timed out']} acquires timed out, "
        f"errors {real['errors']}, {real['fail points armed']} fail points; leases left by lost outcomes "
        f"{real['leases left by lost outcomes']}; the longest a live lease went unheld: {longest(real):.3f} s "
        f"(promise: at most a TTL, {TTL:g} s, seen within {bound:g} s); the name held by nobody (leases one after "
        f"another): {longest(real, 'longest the name was held by nobody'):.3f} s; reads of a live lease held by a "
        f"token done with (withdrawn or released): {done_real}",
        flush=True,
    )
    print(f"control (a holder renewing after it let go, and a released token put back), {control['seconds']:g} s: "
          f"the longest unheld {longest(control):.3f} s; reads of a lease held by a token done with {done_control}",
          flush=True)  # fmt: skip
    ok = longest(real) <= bound and not done_real and longest(control) > bound and done_control > 0
    print("PASS" if ok else "FAIL", flush=True)
    if arguments.json:
        print(json.dumps({"real": real, "control": control, "bound": bound, "ok": ok}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
