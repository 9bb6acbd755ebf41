"""One OS process of the election benchmark. The URI comes on stdin. Prints JSON lines, times on
the machine's shared monotonic clock.

    python benchmarks/election_worker.py candidate NAME TTL SECONDS HOLD  # lead, hold, resign, again
    python benchmarks/election_worker.py leader NAME TTL                 # lead until killed
    python benchmarks/election_worker.py observer NAME SECONDS           # report each change seen

``candidate`` prints {"led": t, "term": n} when it leads and {"resign": t, "term": n} just before
it sends its resignation, then campaigns again, until SECONDS have passed; at the end it prints
{"find_and_modify_seconds": [...]}: each findAndModify's round trip as the driver timed it.
``observer`` prints {"seen": t, "term": n | null} for each change ``changes()`` yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from hot_lock_worker import Requests  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def candidate(election: AsyncMongoElection, seconds: float, hold: float) -> None:
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        term = await election.campaign()
        say(led=time.monotonic(), term=term)
        await asyncio.sleep(hold)
        say(resign=time.monotonic(), term=term)
        await election.resign()


async def leader(election: AsyncMongoElection) -> None:
    term = await election.campaign()
    say(led=time.monotonic(), term=term)
    await asyncio.Event().wait()


async def observer(election: AsyncMongoElection, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds), contextlib.aclosing(election.changes()) as changes:
            async for leadership in changes:
                say(seen=time.monotonic(), term=None if leadership is None else leadership.term)


async def main(mode: str, name: str, *arguments: str) -> None:
    requests = Requests()
    uri = sys.stdin.readline().strip()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[requests])
    await client.admin.command("ping")
    collection = client["bench"]["elections"]
    if mode == "candidate":
        ttl, seconds, hold = map(float, arguments)
        await candidate(AsyncMongoElection(collection, name, ttl=ttl), seconds, hold)
    elif mode == "leader":
        await leader(AsyncMongoElection(collection, name, ttl=float(arguments[0])))
    else:
        await observer(AsyncMongoElection(collection, name), float(arguments[0]))
    say(find_and_modify_seconds=requests.find_and_modify_seconds)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
