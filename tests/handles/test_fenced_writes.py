"""Fenced writes: the transactional guard and token-checked writes, with both drivers; a paused
holder process (SIGSTOP) whose writes are refused after a takeover."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, LockLostError, LockNotOwnedError, TransactionsUnsupportedError
from mongolock_async.fencing import fenced_insert_one, fenced_replace_one, fenced_update_one
from mongolock_async.store import LockStore
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter
from tests.support.processes import ROOT, WORKERS
from tests.support.run_settings import child_environment
from tests.support.sessions import transaction

FENCED_HOLDER = WORKERS / "fenced_holder.py"


async def take_over(lock: AsyncMongoLock, collection: Any, how: str) -> AsyncMongoLock:
    """Take ``lock``'s lock with another handle once its lease ended: by expiry (``lock`` knows its
    local deadline passed) or broken by an operator (``lock`` still believes it holds the lease)."""
    if how == "expiry":
        await asyncio.sleep(lock.ttl + 0.3)
    else:
        assert await LockStore(collection, WriteConcern(w="majority")).force_release(lock.name) is not None
    successor = AsyncMongoLock(collection, lock.name, ttl=30.0)
    assert await successor.acquire(blocking=False)
    return successor


# -- the transactional guard --------------------------------------------------------------------------


async def test_a_guarded_transaction_commits_while_the_lease_is_live(mongolock_collection: Any) -> None:
    database = mongolock_collection.database
    client, orders = database.client, database[mongolock_collection.name + "_orders"]
    async with AsyncMongoLock(mongolock_collection, "checkout", ttl=10.0) as lock:
        token = lock.fencing_token
        async with transaction(client) as session:
            await lock.guard_transaction(session)
            await orders.insert_one({"_id": 1, "token": token}, session=session)
    assert await orders.find_one({"_id": 1}) == {"_id": 1, "token": token}
    await orders.drop()


@pytest.mark.safety
@pytest.mark.parametrize("how", ["expiry", "force"])
async def test_a_transaction_guarded_after_a_takeover_commits_nothing(mongolock_collection: Any, how: str) -> None:
    database = mongolock_collection.database
    client, orders = database.client, database[mongolock_collection.name + "_orders"]
    stale = AsyncMongoLock(mongolock_collection, "checkout", ttl=0.5 if how == "expiry" else 30.0)
    assert await stale.acquire()
    successor = await take_over(stale, mongolock_collection, how)
    # After expiry the handle knows (no request is sent); after a forced release only the server does.
    with pytest.raises(LockLostError, match="local deadline" if how == "expiry" else "guard_transaction found"):
        async with transaction(client) as session:
            await orders.insert_one({"_id": "stale"}, session=session)
            await stale.guard_transaction(session)
    assert await orders.count_documents({}) == 0, "a write of the stale holder's transaction landed"
    assert stale.lost.is_set() and stale.fencing_token is None
    await successor.release()
    await orders.drop()


@pytest.mark.safety
async def test_a_takeover_during_the_transaction_fails_the_guard(mongolock_collection: Any) -> None:
    """The transaction's snapshot predates the takeover: the guard's write conflicts (WriteConflict,
    TransientTransactionError), and with_transaction's retry then finds the lease gone."""
    database = mongolock_collection.database
    client, orders = database.client, database[mongolock_collection.name + "_orders"]
    lock = AsyncMongoLock(mongolock_collection, "checkout", ttl=30.0)
    assert await lock.acquire()
    errors: list[BaseException] = []
    with pytest.raises((LockLostError, OperationFailure)) as raised:
        async with transaction(client) as session:
            await orders.insert_one({"_id": "first"}, session=session)  # the snapshot is taken here
            successor = await take_over(lock, mongolock_collection, "force")
            try:
                await lock.guard_transaction(session)
            except BaseException as error:
                errors.append(error)
                raise
    assert errors, "the guard passed although the lock was taken over within the transaction"
    if isinstance(raised.value, OperationFailure):
        assert raised.value.has_error_label("TransientTransactionError"), raised.value
        # What with_transaction does next: run the callback again, in a new transaction.
        with pytest.raises(LockLostError):
            async with transaction(client) as session:
                await lock.guard_transaction(session)
                await orders.insert_one({"_id": "retry"}, session=session)
    assert await orders.count_documents({}) == 0
    await successor.release()
    await orders.drop()


@pytest.mark.safety
async def test_a_takeover_waits_for_the_guarded_commit(mongolock_collection: Any) -> None:
    """Guarded first, the transaction holds the lock document: an acquire after the lease expired
    waits until the commit, so the stale holder's writes are ordered before the new holder's."""
    database = mongolock_collection.database
    client, orders = database.client, database[mongolock_collection.name + "_orders"]
    # 2 s: the acquire, the guard and the first write have 1.8 s on a loaded machine. A guard that
    # finds the lease past its local deadline (a pause of this process) rightly refuses: then the
    # scenario runs again, on a fresh name.
    for attempt in range(3):
        name = f"checkout-{attempt}"
        lock = AsyncMongoLock(mongolock_collection, name, ttl=2.0)
        assert await lock.acquire()
        token = lock.fencing_token
        successor = AsyncMongoLock(mongolock_collection, name, ttl=30.0)
        takeover: asyncio.Task[bool] | None = None
        deadline = lock.deadline
        assert deadline is not None
        try:
            async with transaction(client) as session:
                await lock.guard_transaction(session)
                await orders.insert_one({"_id": name, "token": token}, session=session)
                await asyncio.sleep(2.2)  # the lease has expired on the server; the transaction is open
                takeover = asyncio.create_task(successor.acquire(timeout=20.0))
                await asyncio.sleep(0.5)
                assert not takeover.done(), "the takeover did not wait for the guarded transaction"
        except LockLostError:
            assert time.monotonic() >= deadline, "the guard refused a lease before its local deadline"
            continue
        break
    else:
        pytest.fail("the guard came after the lease's local deadline three times")
    assert await takeover
    assert successor.fencing_token is not None and token is not None
    assert successor.fencing_token > token
    assert await orders.count_documents({}) == 1
    await successor.release()
    await orders.drop()


async def test_cancelling_a_guarded_transaction_leaves_no_partial_data(mongolock_collection: Any) -> None:
    database = mongolock_collection.database
    client, orders = database.client, database[mongolock_collection.name + "_orders"]
    wrote_first = asyncio.Event()

    async def transfer() -> None:
        async with AsyncMongoLock(mongolock_collection, "ledger", ttl=10.0) as lock:
            async with transaction(client) as session:
                await lock.guard_transaction(session)
                await orders.insert_one({"_id": "debit"}, session=session)
                wrote_first.set()
                await asyncio.sleep(30)
                await orders.insert_one({"_id": "credit"}, session=session)

    task = asyncio.create_task(transfer())
    await wrote_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await orders.count_documents({}) == 0, "half of the transfer was committed"
    free = AsyncMongoLock(mongolock_collection, "ledger", ttl=5.0)
    assert await free.acquire(blocking=False), "the cancelled holder left the lock held"
    await free.release()
    await orders.drop()


async def test_guard_misuse_is_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    client = counted_collection.database.client
    lock = AsyncMongoLock(counted_collection, "checkout", ttl=10.0)
    session = client.start_session()
    if asyncio.iscoroutine(session) or asyncio.isfuture(session):
        session = await session
    async with session:
        command_counter.clear()
        with pytest.raises(ValueError, match="in a transaction"):
            await lock.guard_transaction(session)
        async with transaction(client) as in_transaction:
            with pytest.raises(LockNotOwnedError):
                await lock.guard_transaction(in_transaction)
    assert command_counter.count("findAndModify", "update", "insert") == 0


async def test_the_guard_needs_transactions(mongolock_driver: str) -> None:
    with EmbeddedMongo(replica_set=False) as server:
        client = make_client(mongolock_driver, server.uri)
        try:
            collection = client[TEST_DATABASE]["locks"]
            async with AsyncMongoLock(collection, "standalone", ttl=10.0) as lock:
                with pytest.raises(TransactionsUnsupportedError, match="replica set"):
                    async with transaction(client) as session:
                        await lock.guard_transaction(session)
        finally:
            await close_client(client)


# -- token-checked writes ------------------------------------------------------------------------------


@pytest.mark.safety
async def test_token_checked_writes_refuse_older_tokens(mongolock_collection: Any) -> None:
    stock = mongolock_collection.database[mongolock_collection.name + "_stock"]
    await stock.insert_one({"_id": "sku", "sold": 0})
    first = await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=100)
    assert first.applied, "a document without a token takes the first write"
    assert (await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=100)).applied, "same token"
    assert not (await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=99)).applied
    pipeline = [{"$set": {"sold": {"$add": ["$sold", 10]}}}]
    assert (await fenced_update_one(stock, {"_id": "sku"}, pipeline, token=101)).applied
    assert await stock.find_one({"_id": "sku"}) == {"_id": "sku", "sold": 12, "fence": 101}

    assert not (await fenced_replace_one(stock, {"_id": "sku"}, {"sold": 0}, token=100)).applied
    assert (await fenced_replace_one(stock, {"_id": "sku"}, {"sold": 0}, token=102)).applied
    assert not (await fenced_update_one(stock, {"_id": "none"}, {"$set": {"x": 1}}, token=200)).applied, "no document"

    inserted = await fenced_insert_one(stock, {"_id": "new", "sold": 1}, token=50)
    assert inserted.applied and inserted.upserted_id == "new"
    assert not (await fenced_insert_one(stock, {"_id": "new", "sold": 2}, token=49)).applied
    assert (await fenced_insert_one(stock, {"_id": "new", "sold": 3}, token=51)).applied
    upserted = await fenced_update_one(stock, {"_id": "up"}, {"$set": {"sold": 7}}, token=60, upsert=True)
    assert upserted.applied and upserted.upserted_id == "up"
    assert not (await fenced_update_one(stock, {"_id": "up"}, {"$set": {"sold": 8}}, token=59, upsert=True)).applied
    assert await stock.find({}, sort=[("_id", 1)]).to_list(None) == [
        {"_id": "new", "sold": 3, "fence": 51},
        {"_id": "sku", "sold": 0, "fence": 102},
        {"_id": "up", "sold": 7, "fence": 60},
    ]
    await stock.update_one({"_id": "sku"}, {"$set": {"fence": "not-a-number"}})
    assert not (await fenced_update_one(stock, {"_id": "sku"}, {"$set": {"sold": 1}}, token=10**15)).applied
    await stock.drop()


async def test_token_checked_writes_take_the_lock_and_its_token(mongolock_collection: Any) -> None:
    stock = mongolock_collection.database[mongolock_collection.name + "_stock"]
    async with AsyncMongoLock(mongolock_collection, "stock:sku", ttl=10.0) as lock:
        result = await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=lock, upsert=True)
        assert result.applied
        token = lock.fencing_token
    assert await stock.find_one({"_id": "sku"}) == {"_id": "sku", "sold": 1, "fence": token}
    with pytest.raises(LockNotOwnedError, match="no token"):
        await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"sold": 1}}, token=lock)
    await stock.drop()


class _LosesTheCreationRace:
    """A real collection whose first write loses the race to create its document, as MongoDB lets
    it happen: the filter found no document, a competing writer (token ``competitor``) inserted
    one, and this write's insert collided with it. The error is the server's own; every later call
    goes to the collection as it is."""

    def __init__(self, collection: Any, competitor: int) -> None:
        self.collection = collection
        self.competitor = competitor
        self.calls = 0

    async def _race(self, method: str, filter: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            _id = filter["$and"][0]["_id"]
            await self.collection.insert_one({"_id": _id, "fence": self.competitor, "by": "competitor"})
            await self.collection.insert_one({"_id": _id})  # raises the server's DuplicateKeyError
        return await getattr(self.collection, method)(filter, *args, **kwargs)

    async def update_one(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._race("update_one", filter, *args, **kwargs)

    async def replace_one(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._race("replace_one", filter, *args, **kwargs)


@pytest.mark.safety
@pytest.mark.parametrize("write", ["update", "insert"])
async def test_a_newer_token_that_loses_the_race_to_create_the_document_still_writes(
    mongolock_collection: Any, write: str
) -> None:
    # MongoDB retries an upsert's duplicate key only for filters of plain equalities
    # (write_ops_exec.cpp, shouldRetryDuplicateKeyException); the fenced filter has an $or. The
    # embedded server retries every one itself, so the race is staged with the server's own error.
    stock = mongolock_collection.database[mongolock_collection.name + "_stock"]
    for competitor, ours, applied in [(5, 9, True), (9, 5, False)]:
        racing = _LosesTheCreationRace(stock, competitor)
        if write == "update":
            update = {"$set": {"by": "us"}}
            result = await fenced_update_one(racing, {"_id": competitor}, update, token=ours, upsert=True)
        else:
            result = await fenced_insert_one(racing, {"_id": competitor, "by": "us"}, token=ours)
        assert racing.calls == 2, "a duplicate key on _id is answered by sending the write once more"
        assert result.applied is applied
        stored = await stock.find_one({"_id": competitor})
        expected = {"fence": ours, "by": "us"} if applied else {"fence": competitor, "by": "competitor"}
        assert stored == {"_id": competitor, **expected}
    await stock.drop()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: fenced_update_one(c, {"_id": 1}, {"$set": {"fence": 1}}, token=5), ValueError, "must not write"),
        (lambda c: fenced_update_one(c, {"_id": 1}, {"$set": {"fence.x": 1}}, token=5), ValueError, "must not write"),
        (lambda c: fenced_update_one(c, {"_id": 1}, {"sold": 1}, token=5), ValueError, "update operators"),
        (lambda c: fenced_update_one(c, {"sku": 1}, {"$set": {"a": 1}}, token=5, upsert=True), ValueError, "_id"),
        (lambda c: fenced_update_one(c, {"_id": 1}, {"$set": {"a": 1}}, token=True), TypeError, "int fencing token"),
        (lambda c: fenced_update_one(c, {"_id": 1}, {"$set": {"a": 1}}, token=-1), ValueError, "0 to 2"),
        (lambda c: fenced_update_one(c, {"_id": 1}, {"$set": {"a": 1}}, token=5, field="a.b"), ValueError, "field"),
        (lambda c: fenced_replace_one(c, {"_id": 1}, {"fence": 3}, token=5), ValueError, "must not hold"),
        (lambda c: fenced_replace_one(c, {"_id": 1}, {"$set": {"a": 1}}, token=5), ValueError, "no update operators"),
        (lambda c: fenced_insert_one(c, {"sold": 1}, token=5), ValueError, "_id"),
    ],
)
async def test_token_checked_write_misuse_is_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter, call: Any, error: type[Exception], message: str
) -> None:
    command_counter.clear()
    with pytest.raises(error, match=message):
        await call(counted_collection)
    assert command_counter.names == []


# -- a paused holder process ---------------------------------------------------------------------------


@pytest.mark.safety
@pytest.mark.parametrize("takeover", ["expiry", "force"])
@pytest.mark.parametrize("mode", ["transaction", "token"])
def test_a_paused_holders_writes_are_refused_after_a_takeover(mongolock_uri: str, mode: str, takeover: str) -> None:
    """The holder process is stopped (SIGSTOP) between acquiring and writing; meanwhile its lease
    expires (``expiry``: paused past its TTL) or an operator breaks it (``force``: the holder resumes
    believing it still holds the lock, so only the server's check can stop it); another process
    takes over and writes. The resumed holder's write is refused; the data shows only the new
    holder's write."""
    collection = f"paused_{mode}_{takeover}"
    stale_ttl = 1.0 if takeover == "expiry" else 60.0

    def holder(role: str, ttl: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(FENCED_HOLDER), mongolock_uri, TEST_DATABASE, collection, mode, role, str(ttl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_environment(),
        )

    def say(process: subprocess.Popen[str], line: str) -> None:
        assert process.stdin is not None
        process.stdin.write(line + "\n")
        process.stdin.flush()

    def hear(process: subprocess.Popen[str]) -> str:
        assert process.stdout is not None
        return process.stdout.readline()

    stale = holder("stale", stale_ttl)
    successor = None
    try:
        assert hear(stale).split()[0] == "held"
        os.kill(stale.pid, signal.SIGSTOP)  # paused between acquiring and writing
        say(stale, "write")
        if takeover == "expiry":
            time.sleep(stale_ttl + 0.5)
        else:
            broken = subprocess.run(
                [sys.executable, "-m", "mongolock_async", "release", "resource", "--force", "--yes",
                 "--db", TEST_DATABASE, "--collection", collection, "--uri", mongolock_uri],
                capture_output=True, text=True, timeout=60, env=child_environment(),
            )  # fmt: skip
            assert broken.returncode == 0, broken.stderr
        successor = holder("successor", 30.0)
        assert hear(successor).split()[0] == "held"
        say(successor, "write")
        new_result = json.loads(hear(successor))
        os.kill(stale.pid, signal.SIGCONT)
        stale_result = json.loads(hear(stale))
        for process in (stale, successor):
            process.communicate(timeout=60)
    finally:
        for process in (stale, successor):
            if process is not None:
                process.kill()
    assert new_result["applied"] is True and new_result["error"] is None, new_result
    assert new_result["token"] > stale_result["token"]
    assert stale_result["applied"] is False, stale_result
    if mode == "transaction":
        assert stale_result["error"] == "LockLostError", stale_result

    async def resource() -> list[dict[str, Any]]:
        client = make_client("pymongo", mongolock_uri)
        try:
            return await client[TEST_DATABASE][collection + "_resource"].find({}, {"_id": 0}).to_list(None)
        finally:
            await close_client(client)

    assert asyncio.run(resource()) == [{"writer": "successor", "fence": new_result["token"]}]
