"""A digest built once per period by a service that runs on several replicas: each replica runs
the same schedule, and in each period exactly one of them builds the digest. Three ways to
schedule it, one per ``--scheduler``:

- ``loop``: a plain asyncio loop that fires a few times per period;
- ``apscheduler``: APScheduler's ``AsyncIOScheduler`` with an interval trigger (``pip install
  apscheduler``);
- ``fastapi``: the loop started and stopped by a FastAPI app's lifespan (the ``fastapi`` extra),
  entered here as uvicorn enters it, so that no port is needed.

Run it in two or three terminals at once and compare what they print:

    mongolock server                                             # in another terminal (or set MONGODB_URI)
    python -m mongolock_async.examples.periodic_job --scheduler loop --every 2 --seconds 10
    mongolock inspect digest                                     # the job: its period, last run, holder

Each replica prints the starts of the periods it built the digests of; the digests are in the
``jobs`` database (``JOBS_DATABASE``), one per period. Each scheduler stops between runs, never
during one: a run cut off midway leaves its period not done, and another replica would build that
digest again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import LockManager
from mongolock_async.examples import lock_collection, mongodb_uri
from mongolock_async.jobs import current_run


async def on_a_loop(
    fire: Callable[[], Awaitable[object]], every: float, seconds: float, stopping: asyncio.Event | None = None
) -> None:
    """Fire four times per period, for ``seconds`` or until ``stopping`` is set: a replica may be
    busy, or start late; one call per period runs."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    stopping = stopping or asyncio.Event()
    while loop.time() < stop_at and not stopping.is_set():
        await fire()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every / 4):
                await stopping.wait()


async def with_apscheduler(fire: Callable[[], Awaitable[object]], every: float, seconds: float) -> None:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    running = asyncio.Lock()

    async def fire_in_turn() -> None:
        async with running:
            await fire()

    scheduler = AsyncIOScheduler()
    scheduler.add_job(fire_in_turn, "interval", seconds=every / 4, max_instances=1, coalesce=True)
    scheduler.start()
    try:
        await asyncio.sleep(seconds)
    finally:
        # APScheduler's shutdown cancels a coroutine job that is running: no new runs, then the
        # run in progress finishes before it.
        scheduler.pause()
        async with running:
            scheduler.shutdown(wait=False)


async def in_a_fastapi_lifespan(fire: Callable[[], Awaitable[object]], every: float, seconds: float) -> None:
    from fastapi import FastAPI

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stopping = asyncio.Event()
        schedule = asyncio.create_task(on_a_loop(fire, every, float("inf"), stopping))
        yield
        stopping.set()  # not cancel(): the run in progress finishes
        await schedule

    app = FastAPI(lifespan=lifespan)
    async with app.router.lifespan_context(app):  # what uvicorn does when the app starts and stops
        await asyncio.sleep(seconds)


SCHEDULERS = {"loop": on_a_loop, "apscheduler": with_apscheduler, "fastapi": in_a_fastapi_lifespan}


async def main(scheduler: str, every: float, seconds: float) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri())
    digests = client[os.environ.get("JOBS_DATABASE", "jobs")]["digests"]
    locks = LockManager(lock_collection(client), ttl=30, label=f"replica {os.getpid()}")
    built: list[str] = []

    @locks.run_once("digest", every=timedelta(seconds=every))
    async def build_digest() -> None:
        run = current_run()  # its period (start, end) on the server's clock, attempt and fencing token
        if run.period is None:  # never: a job with `every` runs in a period
            raise RuntimeError("the digest ran outside a period")
        # Keyed by the period's start: a second run of a period (its first cut off) would find it.
        await digests.insert_one({"period": run.period.start, "by": os.getpid(), "attempt": run.attempt})
        built.append(f"{run.period.start:%H:%M:%S}")

    await SCHEDULERS[scheduler](build_digest, every, seconds)
    await client.close()
    print(f"replica {os.getpid()} built the digests of {', '.join(built) or 'none'}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A digest once per period, whichever replica gets there first.")
    parser.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="loop")
    parser.add_argument("--every", type=float, default=2.0, help="the period, in seconds (at least 1)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long this replica runs")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.scheduler, arguments.every, arguments.seconds))
