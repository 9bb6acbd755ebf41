"""What one request by ``_id`` costs on the embedded server as its collection grows.

    .venv/bin/python benchmarks/collection_size.py [--sizes 0 5000 25000] [--rounds 20]

For each size, a fresh embedded server gets that many lock documents (``view_scale.seed``: shaped
as the library writes them, seeded with ``insert_many``), then, interleaved round by round on one
client and one name: the raw driver's ``find_one_and_update``, ``update_one`` and ``find_one``,
each by ``_id`` on an existing document, and the library's acquire + release of a name of its own
(two ``findAndModify``s). The medians are printed, in milliseconds.

On MongoDB each of these is answered from the ``_id`` index whatever the collection's size (the
citations are in tests/handles/test_request_shapes.py). The embedded server's ``findAndModify`` scans the
collection instead, so its figures grow with the number of documents while ``update_one`` and
``find_one`` stay flat: what docs/testing.md and ``mongolock server --help`` tell users. Nothing
here is MongoDB's speed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import environment  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient
from view_scale import COLLECTION, DATABASE, seed

from mongolock_async import AsyncMongoLock
from mongolock_async.testing import EmbeddedMongo


async def timed(request: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await request()
    return (time.perf_counter() - started) * 1000


async def figures(uri: str, rounds: int) -> dict[str, float]:
    """Median milliseconds of each request, measured in interleaved rounds."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[DATABASE][COLLECTION]
    await collection.update_one({"_id": "bench:raw"}, {"$set": {"owner": None}}, upsert=True)
    lock = AsyncMongoLock(collection, "bench:lock", ttl=30.0)

    async def cycle() -> None:
        await lock.acquire()
        await lock.release()

    requests: dict[str, Callable[[], Awaitable[Any]]] = {
        "find_one_and_update": lambda: collection.find_one_and_update({"_id": "bench:raw"}, {"$inc": {"n": 1}}),
        "update_one": lambda: collection.update_one({"_id": "bench:raw"}, {"$inc": {"n": 1}}),
        "find_one": lambda: collection.find_one({"_id": "bench:raw"}),
        "acquire_release": cycle,
    }
    try:
        for request in requests.values():  # warm: connections, the version check
            await request()
        samples: dict[str, list[float]] = {name: [] for name in requests}
        for _ in range(rounds):
            for name, request in requests.items():
                samples[name].append(await timed(request))
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 5_000, 25_000])
    parser.add_argument("--rounds", type=int, default=20)
    arguments = parser.parse_args()
    print(environment(None, "requests by _id against the collection's size"))
    for size in arguments.sizes:
        with EmbeddedMongo() as server:
            seed(server.uri, size)
            measured = asyncio.run(figures(server.uri, arguments.rounds))
        print(
            f"{size:>7,} documents | medians, ms: find_one_and_update {measured['find_one_and_update']:7.1f} | "
            f"update_one {measured['update_one']:5.1f} | find_one {measured['find_one']:5.1f} | "
            f"library acquire + release {measured['acquire_release']:7.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
