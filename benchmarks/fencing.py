"""The cost of fenced writes, measured side by side on one server, in alternating rounds.

1. A transaction of one update, with and without ``guard_transaction`` (one more write, to the lock
   document, in the same transaction).
2. One update with and without the token check (``fenced_update_one``: the same single request with
   a larger filter and one more field set).

    python benchmarks/fencing.py [--uri URI] [--rounds 10] [--per-round 50]

Without ``--uri``/``MONGODB_URI``: a fresh embedded server. Prints the environment, the median time
per operation of each kind and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import environment, mongodb  # benchmarks/ is the script's directory
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock
from mongolock_async.fencing import fenced_update_one


async def measure(uri: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    database = client["mongolock_bench_fencing"]
    await client.drop_database(database.name)
    orders = database["orders"]
    await orders.insert_one({"_id": "sku", "sold": 0})
    lock = AsyncMongoLock(database["locks"], "stock:sku", ttl=600.0)
    assert await lock.acquire()
    token = lock.fencing_token
    assert token is not None

    async def transaction(guarded: bool) -> None:
        async with client.start_session() as session, await session.start_transaction():
            if guarded:
                await lock.guard_transaction(session)
            await orders.update_one({"_id": "sku"}, {"$inc": {"sold": 1}}, session=session)

    async def plain_update() -> None:
        await orders.update_one({"_id": "sku"}, {"$inc": {"sold": 1}})

    async def fenced_update() -> None:
        assert (await fenced_update_one(orders, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=token)).applied

    kinds: dict[str, Callable[[], Awaitable[None]]] = {
        "transaction": lambda: transaction(False),
        "guarded transaction": lambda: transaction(True),
        "update": plain_update,
        "token-checked update": fenced_update,
    }
    for operation in kinds.values():  # warm-up: connections, sessions, plan cache
        for _ in range(5):
            await operation()
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind, operation in kinds.items():
            started = time.perf_counter()
            for _ in range(per_round):
                await operation()
            seconds[kind].append((time.perf_counter() - started) / per_round)
    await lock.release()
    await client.drop_database(database.name)
    await client.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=50)
    arguments = parser.parse_args()
    print(environment(arguments.uri))
    with mongodb(arguments.uri) as uri:
        seconds = asyncio.run(measure(uri, arguments.rounds, arguments.per_round))
    median = {kind: statistics.median(values) * 1000 for kind, values in seconds.items()}
    print(f"\n{arguments.rounds} alternating rounds of {arguments.per_round} operations each; median ms per operation")
    for kind, ms in median.items():
        print(f"  {kind:22} {ms:7.2f} ms")
    print(f"guarded / plain transaction:      {median['guarded transaction'] / median['transaction']:.2f}x")
    print(f"token-checked / plain update:     {median['token-checked update'] / median['update']:.2f}x")


if __name__ == "__main__":
    main()
