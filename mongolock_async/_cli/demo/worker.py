"""One OS process of the demo. Prints JSON events, one per line, for the demo to show and check.

python -m mongolock_async._cli.demo.worker sale DATABASE WORKER TASKS
python -m mongolock_async._cli.demo.worker job DATABASE WORKER TTL JOB_SECONDS
python -m mongolock_async._cli.demo.worker ledger DATABASE WORKER TTL PAUSE_SECONDS
python -m mongolock_async._cli.demo.worker export DATABASE WORKER TASKS LIMIT CALLS
python -m mongolock_async._cli.demo.worker replica DATABASE WORKER TTL
python -m mongolock_async._cli.demo.worker periodic DATABASE WORKER EVERY PERIODS

The MongoDB URI comes on the first line of stdin, never on the command line, which every user of
the machine can read.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.write_concern import WriteConcern

from ... import (
    AsyncMongoElection,
    AsyncMongoLock,
    AsyncMongoSemaphore,
    LockError,
    LockLostError,
    LockManager,
    LockTimeoutError,
)
from ..._core.jobs import current_run
from ...fencing import fenced_update_one
from ...store import LockStore

LOCKS = "locks"
INVENTORY = "inventory"
SALES = "sales"
JOB_RUNS = "job_runs"
JOB_LOCK = "nightly-report"
LEDGER = "ledger"
ACCOUNTS = "accounts"
LEDGER_LOCK = "account:42"
API = "partner_api"
API_QUOTA = "partner-api"
ELECTION = "scheduler"
DIGEST = "hourly-digest"
DIGESTS = "digests"
HANG = "hang_marker"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}), flush=True)


async def buy(database: Any, worker: str, task: int) -> int:
    """Buy until everything is sold. Each purchase reads, waits, then writes the stock: a race that
    only the per-item lock prevents."""
    bought = 0
    locks, inventory, sales = database[LOCKS], database[INVENTORY], database[SALES]
    while True:
        available = [item["_id"] async for item in inventory.find({"stock": {"$gt": 0}}, {"_id": 1})]
        if not available:
            return bought
        item = random.choice(available)
        async with AsyncMongoLock(locks, f"item:{item}", ttl=10.0, label=f"{worker}/buyer-{task}") as lock:
            doc = await inventory.find_one({"_id": item})
            if doc["stock"] <= 0:
                continue
            await asyncio.sleep(random.uniform(0.001, 0.004))  # payment, say
            await inventory.update_one({"_id": item}, {"$set": {"stock": doc["stock"] - 1}})
            await sales.insert_one({"item": item, "worker": worker, "fence": lock.fencing_token})
            bought += 1
            emit("sold", worker=worker, item=item, left=doc["stock"] - 1, fence=lock.fencing_token)


async def sale(uri: str, database_name: str, worker: str, tasks: int) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        database = client[database_name]
        emit("ready", worker=worker)
        counts = await asyncio.gather(*(buy(database, worker, task) for task in range(tasks)))
        emit("done", worker=worker, bought=sum(counts))
    finally:
        await client.close()


async def job(uri: str, database_name: str, worker: str, ttl: float, job_seconds: float) -> None:
    """Race for the run-once job; run it under a heartbeat if won, else report who holds it.

    A worker started with ``JOB_SECONDS`` negative waits for the lock (blocking) instead of racing:
    the crash scenario's second process.
    """
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        database = client[database_name]
        blocking = job_seconds < 0
        lock = AsyncMongoLock(database[LOCKS], JOB_LOCK, ttl=ttl, heartbeat=True, label=worker, blocking=blocking)
        emit("ready", worker=worker)
        try:
            async with lock:
                emit("started", worker=worker, fence=lock.fencing_token, ttl=ttl)
                run = await database[JOB_RUNS].insert_one({"worker": worker, "fence": lock.fencing_token})
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < abs(job_seconds):
                    await asyncio.sleep(min(0.25, abs(job_seconds) - elapsed))
                    emit("progress", worker=worker, fraction=min(1.0, (time.monotonic() - started) / abs(job_seconds)))
                await database[JOB_RUNS].update_one({"_id": run.inserted_id}, {"$set": {"finished": True}})
            emit("finished", worker=worker)
        except LockTimeoutError as timed_out:
            holder = await LockStore(database[LOCKS], WriteConcern(w="majority")).read(JOB_LOCK)
            if holder is None:
                raise RuntimeError(f"{JOB_LOCK!r} timed out, yet nobody's lease is on record") from timed_out
            emit("skipped", worker=worker, holder=dict(holder.holder), fence=holder.fencing_token)
        except LockLostError as error:
            emit("lost", worker=worker, reason=error.reason)
    finally:
        await client.close()


async def ledger(uri: str, database_name: str, worker: str, ttl: float, pause: float) -> None:
    """Take the account's lock, wait ``pause`` seconds (the demo stops this process meanwhile), then
    post to the account twice: a ledger entry in a transaction tied to the lease, and the balance
    with a token-checked write, using the token noted when the lock was taken."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        database = client[database_name]
        lock = AsyncMongoLock(database[LOCKS], LEDGER_LOCK, ttl=ttl, label=worker)
        if not await lock.acquire(timeout=60.0):
            raise LockTimeoutError(LEDGER_LOCK, 60.0)
        token = lock.fencing_token
        if token is None:
            raise RuntimeError(f"{LEDGER_LOCK!r} held without a fencing token")
        emit("held", worker=worker, fence=token)
        await asyncio.sleep(pause)
        try:
            async with client.start_session() as session, await session.start_transaction():
                await lock.guard_transaction(session)
                await database[LEDGER].insert_one({"worker": worker, "fence": token, "amount": 100}, session=session)
            transaction = "committed"
        except LockError as error:
            transaction = f"refused: {type(error).__name__}"
        posting = {"$inc": {"balance": 100}, "$set": {"by": worker}}
        balance = await fenced_update_one(database[ACCOUNTS], {"_id": 42}, posting, token=token, upsert=True)
        emit("posted", worker=worker, fence=token, transaction=transaction, balance_applied=balance.applied)
        await lock.release()
    finally:
        await client.close()


async def call_api(database: Any, worker: str, task: int, limit: int, calls: int) -> None:
    """Call the rate-limited API ``calls`` times, each under a permit of the shared semaphore. The
    API counts the calls in flight itself (one atomic increment each way) and keeps the highest."""
    api = database[API]
    for _ in range(calls):
        permit = AsyncMongoSemaphore(database[LOCKS], API_QUOTA, limit, ttl=10.0, label=f"{worker}/exporter-{task}")
        async with permit:
            flight = await api.find_one_and_update({"_id": "quota"}, {"$inc": {"inflight": 1}}, return_document=True)
            await api.update_one({"_id": "quota"}, {"$max": {"most": flight["inflight"]}})
            emit("call", worker=worker, inflight=flight["inflight"], fence=permit.fencing_token)
            await asyncio.sleep(random.uniform(0.03, 0.08))  # the partner's API at work
            await api.update_one({"_id": "quota"}, {"$inc": {"inflight": -1}})


async def export(uri: str, database_name: str, worker: str, tasks: int, limit: int, calls: int) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        database = client[database_name]
        await asyncio.gather(*(call_api(database, worker, task, limit, calls) for task in range(tasks)))
        emit("done", worker=worker)
    finally:
        await client.close()


async def replica(uri: str, database_name: str, worker: str, ttl: float) -> None:
    """A scheduler replica: leads the election while it lives, ticking; SIGTERM shuts it down
    cleanly (its leadership is handed on as it resigns)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        election = AsyncMongoElection(client[database_name][LOCKS], ELECTION, ttl=ttl, label=worker)

        async def schedule(term: int) -> None:
            emit("leading", worker=worker, term=term)
            while True:
                await asyncio.sleep(0.25)
                emit("tick", worker=worker, term=term)

        leading = asyncio.create_task(election.lead(schedule))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, leading.cancel)
        emit("ready", worker=worker)
        try:
            await leading
        except asyncio.CancelledError:
            emit("resigned", worker=worker)  # lead() has resigned by the time it is cancelled
    finally:
        await client.close()


async def periodic(uri: str, database_name: str, worker: str, every: float, periods: int) -> None:
    """A replica of a service with a job due once per period of EVERY seconds: it fires it four
    times per period (at jittered moments) for PERIODS periods. The run whose period and attempt
    the demo wrote into the hang marker never ends (until the demo kills its process)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    database = client[database_name]
    # A TTL of 2 s: renewed every 0.67 s and believed until 1.8 s after a renewal's send, so a
    # renewal may take about 1.1 s. With 1 s it had 0.6 s, which a loaded machine's stalls passed:
    # a replica lost its lease mid-run and the demo failed.
    locks = LockManager(database[LOCKS], ttl=2.0, heartbeat=True, label=worker)

    @locks.run_once(DIGEST, every=every)
    async def build_digest() -> None:
        run = current_run()
        if run.period is None:  # run_once(every=...) runs in a period
            raise RuntimeError(f"{DIGEST!r} ran outside a period")
        period = (run.period.start - EPOCH) // timedelta(milliseconds=1)  # its start, in ms since the epoch
        emit("started", worker=worker, period=period, attempt=run.attempt, fence=run.fencing_token)
        if await database[HANG].find_one({"period": period, "attempt": run.attempt}):
            emit("hanging", worker=worker, period=period)
            await asyncio.Event().wait()
        await asyncio.sleep(0.2)  # the digest
        await database[DIGESTS].insert_one({"period": period, "attempt": run.attempt, "by": worker})
        emit("finished", worker=worker, period=period, attempt=run.attempt)

    try:
        emit("ready", worker=worker)
        for _ in range(periods * 4):
            await asyncio.sleep(every / 4 * random.uniform(0.8, 1.2))
            await build_digest()
    finally:
        await client.close()


def main(argv: list[str]) -> None:
    kind, database = argv[0], argv[1]
    uri = sys.stdin.readline().strip()
    if kind == "sale":
        asyncio.run(sale(uri, database, argv[2], int(argv[3])))
    elif kind == "job":
        asyncio.run(job(uri, database, argv[2], float(argv[3]), float(argv[4])))
    elif kind == "ledger":
        asyncio.run(ledger(uri, database, argv[2], float(argv[3]), float(argv[4])))
    elif kind == "export":
        asyncio.run(export(uri, database, argv[2], int(argv[3]), int(argv[4]), int(argv[5])))
    elif kind == "replica":
        asyncio.run(replica(uri, database, argv[2], float(argv[3])))
    elif kind == "periodic":
        asyncio.run(periodic(uri, database, argv[2], float(argv[3]), int(argv[4])))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
