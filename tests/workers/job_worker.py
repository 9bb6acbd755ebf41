"""One OS process of the job tests. Prints one JSON line per run it completed, {"run": [period,
start, end, pid]}, times on CLOCK_MONOTONIC (shared by the machine's processes; libfaketime is told
to leave it alone), the period (its start, in milliseconds since the epoch) as the server decided
it (for ``control``: from this process's own clock); and with ``fire``, one per call that did not
run the job, {"skipped": [period, reason]}. A run counts as completed once the server recorded its
end (``run`` returned): one whose lease was lost (``LockLostError``, as after a pause past its
TTL) left its period to be run again, so it is not printed, and the process goes on.

``fire``: calls the job ``NAME`` (``every`` EVERY seconds) at a jittered moment of each of its own
periods (spread over most of it), until SECONDS have passed; the job runs 50 ms. ``control`` does
the same with a plain ``run_once`` (no ``every``): one run at a time, but nothing per period.
``delay``: calls the job (``min_interval`` EVERY seconds; 0: none) and sleeps 0.2 s after each
call (a fixed-delay loop), until SECONDS have passed; the job runs 0.1 s. ``hang``: calls the job
(``every`` EVERY seconds, offset OFFSET, TTL 1.5 s, renewed) once; the run prints ``running <period>`` and
waits until the process is killed.

    python tests/workers/job_worker.py URI DATABASE COLLECTION MODE NAME EVERY SECONDS [OFFSET]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoJob, LockLostError, LockManager
from mongolock_async.jobs import Period, current_run

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def start_ms(period: Period | None) -> int | None:
    """A period's start, in milliseconds since the epoch: its key in the output."""
    return None if period is None else (period.start - EPOCH) // timedelta(milliseconds=1)


async def main(
    uri: str, database: str, collection: str, mode: str, name: str, every: str, seconds: str, *rest: str
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    await client.admin.command("ping")
    locks = LockManager(client[database][collection], ttl=10.0)
    period = float(every)
    runs: list[list[Any]] = []
    calls: list[list[Any]] = []  # [period, reason] of each call that did not run the job

    async def work(body: float) -> list[Any]:
        start = time.monotonic()
        key = start_ms(current_run().period) if mode != "control" else int(time.time() // period * period * 1000)
        await asyncio.sleep(body)
        return [key, start, time.monotonic(), os.getpid()]

    stop_at = time.monotonic() + float(seconds)
    if mode in ("fire", "control"):
        options: dict[str, Any] = {"every": period} if mode == "fire" else {}
        job = AsyncMongoJob(locks.collection, name, ttl=10.0, **options)
        while time.monotonic() < stop_at:
            # A moment of this period, 5 % to 80 % into it (by this process's clock).
            into = time.time() % period
            await asyncio.sleep(max(0.0, period - into) + random.uniform(0.05, 0.8) * period)
            try:
                result = await job.run(work, 0.05)
            except LockLostError:
                continue
            if result.ran and result.value is not None:
                runs.append(result.value)
            elif result.record.skipped is not None:
                calls.append([start_ms(result.record.skipped[0]), result.record.skipped[1]])
    elif mode == "delay":
        options = {"min_interval": period} if period else {}
        job = locks.run_once(name, **options)(work)
        while time.monotonic() < stop_at:
            with contextlib.suppress(LockLostError):
                if (run := await job(0.1)) is not None:
                    runs.append(run)
            await asyncio.sleep(0.2)
    else:
        assert mode == "hang", mode
        offset = float(rest[0])

        @locks.run_once(name, every=period, offset=offset, ttl=1.5, heartbeat=True)
        async def hang() -> None:
            print("running", start_ms(current_run().period), flush=True)
            await asyncio.Event().wait()

        await hang()
    await client.close()
    for run in runs:
        print(json.dumps({"run": run}))
    for call in calls:
        print(json.dumps({"skipped": call}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
