"""One OS process of the hot-lock benchmark: TASKS tasks take one lock in turn until a deadline.

Each task loops: acquire (timing the wait), hold for BODY_MS, release. The process prints one JSON
object: acquisitions per task, every wait, each critical section's (enter, exit) on the machine's
shared monotonic clock, and for MongoDB backends the requests it sent (command monitoring), how
many change-stream getMores carried events or came back empty, and connections it created.

    python benchmarks/hot_lock_worker.py BACKEND URI NAME TASKS WARMUP SECONDS START_AT BODY_MS

BACKEND is mongolock, mongolock-fair, redis (redis-py's default polling), redis-fast, or
semaphore-N (an AsyncMongoSemaphore of N permits). The tasks
start at START_AT; what happens in the first WARMUP seconds (each process opening its change stream,
the first attempts) is not counted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient, monitoring

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore


class Requests(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.events = 0
        self.empty_get_mores = 0
        self.connections_created = 0
        self.find_and_modify_seconds: list[float] = []  # each one's round trip, as the driver timed it

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent[event.command_name] = self.sent.get(event.command_name, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "findAndModify":
            self.find_and_modify_seconds.append(event.duration_micros / 1e6)
        elif event.command_name == "getMore":
            if event.reply.get("cursor", {}).get("nextBatch"):
                self.events += 1
            else:
                self.empty_get_mores += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None:
        self.connections_created += 1

    # The other connection-pool events are not needed.
    def pool_created(self, event: Any) -> None: ...
    def pool_ready(self, event: Any) -> None: ...
    def pool_cleared(self, event: Any) -> None: ...
    def pool_closed(self, event: Any) -> None: ...
    def connection_ready(self, event: Any) -> None: ...
    def connection_closed(self, event: Any) -> None: ...
    def connection_check_out_started(self, event: Any) -> None: ...
    def connection_check_out_failed(self, event: Any) -> None: ...
    def connection_checked_out(self, event: Any) -> None: ...
    def connection_checked_in(self, event: Any) -> None: ...

    def reset(self) -> None:
        self.sent.clear()
        self.find_and_modify_seconds.clear()
        self.events = self.empty_get_mores = self.connections_created = 0


async def run(
    backend: str, uri: str, name: str, tasks: int, warmup: float, seconds: float, start_at: float, body: float
) -> None:
    requests = Requests()
    counts = [0] * tasks
    waits: list[float] = []
    sections: list[tuple[float, float]] = []
    if backend.startswith("redis"):
        from redis.asyncio import BlockingConnectionPool, Redis

        # Like PyMongo's pool (100 connections), tasks wait for a connection rather than fail.
        redis = Redis(connection_pool=BlockingConnectionPool.from_url(uri, max_connections=100))
        await redis.ping()

        def make_lock() -> Any:
            # redis-py's default polls every 0.1 s; "redis-fast" polls every 5 ms.
            return redis.lock(name, timeout=30, sleep=0.005 if backend == "redis-fast" else 0.1)
    else:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[requests])
        collection = client["bench"][name]
        await client.admin.command("ping")
        options = {"fair": True} if backend == "mongolock-fair" else {}  # (a baseline may predate fair)

        def make_lock() -> Any:
            if backend.startswith("semaphore-"):
                return AsyncMongoSemaphore(collection, name, int(backend.split("-")[1]), ttl=30.0)
            return AsyncMongoLock(collection, name, ttl=30.0, **options)

        # Warm up: the document exists and the pool has a connection before the clock starts.
        async with make_lock():
            pass

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    measure_from = start_at + warmup
    stop_at = measure_from + seconds
    asyncio.get_running_loop().call_later(measure_from - time.monotonic(), requests.reset)

    async def task(index: int) -> None:
        while time.monotonic() < stop_at:
            asked = time.monotonic()
            async with make_lock():
                entered = time.monotonic()
                await asyncio.sleep(body)
                if entered >= measure_from:
                    waits.append(entered - asked)
                    counts[index] += 1
                    sections.append((entered, time.monotonic()))

    await asyncio.gather(*(task(index) for index in range(tasks)))
    result: dict[str, Any] = {"counts": counts, "waits": waits, "sections": sections}
    if backend.startswith("redis"):
        await redis.aclose()
    else:
        result.update(
            sent=dict(requests.sent),
            events=requests.events,
            empty_get_mores=requests.empty_get_mores,
            connections_created=requests.connections_created,
            find_and_modify_seconds=requests.find_and_modify_seconds,
        )
        await client.close()
    print(json.dumps(result))


if __name__ == "__main__":
    backend, uri, name, tasks, warmup, seconds, start_at, body_ms = sys.argv[1:9]
    asyncio.run(
        run(backend, uri, name, int(tasks), float(warmup), float(seconds), float(start_at), float(body_ms) / 1000)
    )
