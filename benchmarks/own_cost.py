"""The library's own client CPU per uncontended acquire + release, with the driver and the server
taken out of the measurement.

``client_cost.py`` measures a cycle against a raw replay of its two commands; on a shared machine
the driver's and the loop's share (three quarters of a cycle or more) moves with the load and hides
the library's own. Here the library runs as it does (handle, queue, store, the request's shield
and bound, reply parsing) up to ``sending.find_and_modify``, which answers at once, after one loop
iteration, with the document an uncontended acquire or release reads back. The same answer given
to two bare awaits is subtracted. Not a figure of what a user pays (there is no network, no
driver): a way to see what a change to the library's own work removed.

    python benchmarks/own_cost.py [--cycles 1000] [--repeats 15]

Each repeat runs ``--cycles`` cycles of the library, then as many of the bare awaits; the minimum
over repeats is printed (the least disturbed by other work on the machine), and the median. Run it
with ``PYTHONPATH=<another checkout>`` to measure another version of the library. It starts an
embedded server only to make the store (the version check, the client's server known).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import environment, mongodb  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock
from mongolock_async.store import sending

_fence = 0


async def answered(collection: Any, command: Mapping[str, Any], codec_options: Any, *, session: Any = None) -> Any:
    """What an uncontended acquire (an upsert: taken by its token) or release (freed) reads back."""
    global _fence
    await asyncio.sleep(0)  # a reply arrives in a later loop iteration
    name = command["query"]["_id"]
    if command.get("upsert"):
        _fence += 1
        owner = command["update"][0]["$set"]["_request"]["$literal"]["me"]
        return {"_id": name, "owner": owner, "expiresAt": datetime.now(UTC) + timedelta(seconds=30), "fence": _fence}
    return {"_id": name, "owner": None, "expiresAt": datetime.now(UTC), "fence": _fence}


async def measure(uri: str, cycles: int, repeats: int) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        lock = AsyncMongoLock(client["bench"][f"own_{uuid.uuid4().hex[:6]}"], "cycle", ttl=30.0)
        async with lock:  # the version check, a connection: for real, once
            pass
        sending.find_and_modify = answered  # type: ignore[assignment]
        taken = [{"$set": {"_request": {"$literal": {"me": "x"}}}}]
        acquire = {"query": {"_id": "bare"}, "upsert": True, "update": taken}
        release = {"query": {"_id": "bare"}}

        async def library() -> None:
            async with lock:
                pass

        async def bare() -> None:
            await answered(None, acquire, None)
            await answered(None, release, None)

        spent: dict[str, list[float]] = {"library": [], "bare": []}
        for _ in range(repeats):
            for name, action in (("library", library), ("bare", bare)):
                started = time.process_time()
                for _ in range(cycles):
                    await action()
                spent[name].append((time.process_time() - started) / cycles)
        least = min(spent["library"]) - min(spent["bare"])
        median = statistics.median(spent["library"]) - statistics.median(spent["bare"])
        print(
            f"own client CPU per acquire + release (answers faked), {repeats} x {cycles} cycles: "
            f"{least * 1e6:.1f} us least, {median * 1e6:.1f} us median "
            f"(bare answers {min(spent['bare']) * 1e6:.1f} us)"
        )
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args()
    print(environment(None))
    with mongodb(None) as uri:
        asyncio.run(measure(uri, arguments.cycles, arguments.repeats))


if __name__ == "__main__":
    main()
