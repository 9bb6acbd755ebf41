"""One OS process of the many-names benchmark (``many_names.py``).

    python benchmarks/many_names_worker.py ROLE COLLECTION POOL TASKS KINDS BARRIER  (the URI on stdin)

ROLE ``work``: TASKS tasks acquire and release names drawn uniformly from ``name:0`` ..
``name:POOL-1``, in one phase per kind of KINDS (comma-separated): kind ``library`` is ``async with
AsyncMongoLock(...)`` with an empty body; kind ``raw`` sends the same two ``findAndModify``s the
library builds (``mutex.acquire_pipeline`` without queueing a place, then ``release_pipeline``), the
second one also when the first found the name held (it then matches nothing), and never waits.

The harness times the phases through the directory BARRIER: it writes ``phase-N`` holding
``[start, measure_from, stop]`` (monotonic times, shared by every process of the machine); each
worker starts its tasks at ``start``, stops starting acquisitions at ``stop``, and writes
``done-N-PID`` once its tasks have finished (so that no phase's requests overlap the next one's).

ROLE ``listen``: one task waits for the name ``parked`` (held elsewhere for the whole run), so that
this process keeps a change stream open, from the first phase's start until ``stop-listening``
appears in BARRIER.

The process prints one JSON object: per phase, the acquisitions (and the raw tasks' attempts that
found the name held), the commands it sent (command monitoring, counted when answered), and the change-stream events it
was delivered (documents in the stream's batches), of them how many named no lock any task of this
process waited for (counted by wrapping the watcher's dispatch: a test-only hook, nothing in the
library counts), all counted between the phase's ``measure_from`` and ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient, ReturnDocument, monitoring
from pymongo.errors import DuplicateKeyError, PyMongoError

from mongolock_async import AsyncMongoLock, LockError
from mongolock_async._runtime import watcher
from mongolock_async._runtime.queues import queues_on
from mongolock_async.store import PlaceRequest
from mongolock_async.store.mutex import acquire_pipeline, release_pipeline

DATABASE = "bench"
PARKED = "parked"
TTL = 300.0
"""Seconds: the embedded server can keep 256 requests queued for tens of seconds, and a release
must arrive before its lease would expire."""


class Tally:
    """What happened in each phase's measured window."""

    def __init__(self, phases: int) -> None:
        self.windows: list[tuple[float, float]] = []
        self.counts: list[Counter[str]] = [Counter() for _ in range(phases)]

    def add(self, what: str, amount: int = 1) -> None:
        now = time.monotonic()
        for (measure_from, stop), counts in zip(self.windows, self.counts, strict=False):
            if measure_from <= now < stop:
                counts[what] += amount


class Commands(monitoring.CommandListener):
    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        # Counted as answered, as acquisitions are: a request waits seconds among 256 in flight on
        # the embedded server, and one sent during the warm-up may be answered in the window.
        self.tally.add(f"sent:{event.command_name}")
        cursor = event.reply.get("cursor") if isinstance(event.reply, dict) else None
        if event.command_name in ("getMore", "aggregate") and isinstance(cursor, dict):
            batch = cursor.get("nextBatch", cursor.get("firstBatch")) or []
            if batch and "_id" in batch[0] and "operationType" in batch[0]:
                self.tally.add("events", len(batch))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.tally.add(f"sent:{event.command_name}")


def count_dispatches(tally: Tally) -> None:
    """Wrap the watcher's dispatch to count the events that named no lock this process waits for
    (benchmark only)."""
    dispatch = watcher.ReleaseWatcher._dispatch

    def counted(self: watcher.ReleaseWatcher, change: dict[str, Any]) -> None:
        name = (change.get("documentKey") or {}).get("_id")
        waited = {queue.name for queue in queues_on(self._client_id, self._full_name)}
        tally.add("dispatched")
        if name not in waited:
            tally.add("dispatched_to_nobody")
        dispatch(self, change)

    watcher.ReleaseWatcher._dispatch = counted  # type: ignore[method-assign]


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def appears(path: Path) -> str:
    """The text of ``path`` once it exists (the harness renames it into place whole). Polled: the
    barrier is between processes, and a file is all they share."""
    while not path.exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.01)
    return path.read_text()  # noqa: ASYNC240


async def library_task(collection: Any, pool: int, stop: float, tally: Tally) -> None:
    while time.monotonic() < stop:
        try:
            async with AsyncMongoLock(collection, f"name:{random.randrange(pool)}", ttl=TTL, unreachable_timeout=None):
                pass
        except (LockError, PyMongoError) as error:
            tally.add(f"error:{type(error).__name__}")
            continue
        # Counted once released, as a raw pair is once its release is answered: on the embedded
        # server a request waits seconds among 256 in flight, and counting at the acquire's answer
        # would count the first wave of a phase half a cycle earlier than the raw pairs.
        tally.add("acquisitions")


async def raw_task(collection: Any, pool: int, stop: float, tally: Tally) -> None:
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "label": None}
    while time.monotonic() < stop:
        name, owner = f"name:{random.randrange(pool)}", secrets.token_hex(24)
        try:
            state = await collection.find_one_and_update(
                {"_id": name},
                acquire_pipeline(PlaceRequest(owner, int(TTL * 1000), holder), enqueue=False, fair=False),
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            state = None  # two upserts of a new name raced: as if held
        # The pair is sent whole, as bench.py's raw cycle: a release of a name someone else holds
        # matches nothing.
        await collection.find_one_and_update(
            {"_id": name, "owner": owner},
            release_pipeline(owner, None, fair=False, successor_first=True),
            return_document=ReturnDocument.AFTER,
        )
        tally.add("pairs")
        tally.add("acquisitions" if state is not None and state.get("owner") == owner else "found_held")


async def listen(collection: Any, barrier: Path) -> None:
    # Never gives up: the embedded server can leave a request unanswered for tens of seconds here.
    waiting = asyncio.create_task(AsyncMongoLock(collection, PARKED, ttl=TTL, unreachable_timeout=None).acquire())
    await appears(barrier / "stop-listening")
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def run(
    role: str, uri: str, collection_name: str, pool: int, tasks: int, kinds: list[str], barrier: Path
) -> None:
    tally = Tally(len(kinds))
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[Commands(tally)])
    collection = client[DATABASE][collection_name]
    count_dispatches(tally)
    await client.admin.command("ping")
    (barrier / f"ready-{os.getpid()}").write_text("")
    for index, kind in enumerate(kinds):
        start, measure_from, stop = json.loads(await appears(barrier / f"phase-{index}"))
        tally.windows.append((measure_from, stop))
        await sleep_until(start)
        if role == "listen":
            if index == 0:
                listening = asyncio.create_task(listen(collection, barrier))
            continue
        task = library_task if kind == "library" else raw_task
        await asyncio.gather(*(task(collection, pool, stop, tally) for _ in range(tasks)))
        (barrier / f"done-{index}-{os.getpid()}").write_text("")
    if role == "listen":
        await listening
    await client.close()
    print(json.dumps([{"kind": kind, **counts} for kind, counts in zip(kinds, tally.counts, strict=True)]))


if __name__ == "__main__":
    role, collection_name, pool, tasks, kinds, barrier = sys.argv[1:7]
    uri = sys.stdin.readline().strip()
    asyncio.run(run(role, uri, collection_name, int(pool), int(tasks), kinds.split(","), Path(barrier)))
