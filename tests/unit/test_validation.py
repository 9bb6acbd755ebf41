"""Bad input raises a typed error naming the argument, before any command reaches the server."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import bson
import pytest
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoElection,
    AsyncMongoLock,
    AsyncMongoRWLock,
    AsyncMongoSemaphore,
    LockManager,
    ensure_idle_cleanup_index,
)
from mongolock_async._core.lock import LOCK_OPTIONS
from mongolock_async._core.options import LeaseOptions
from mongolock_async._core.rwlock import RWLockHandle
from mongolock_async._util import validation as _validate
from mongolock_async._util.validation import MAX_LABEL_BYTES
from mongolock_async.jobs import AsyncMongoJob
from mongolock_async.store import LockStore, Permits, Renewal
from mongolock_async.store.documents import MAX_PERMITS
from tests.support.commands import CommandCounter
from tests.support.run_settings import child_environment

pytestmark = pytest.mark.one_driver  # above the requests: the drivers never differ here

BAD_CONSTRUCTOR_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"name": 42}, TypeError, "name"),
    ({"name": b"bytes"}, TypeError, "name"),
    ({"name": ""}, ValueError, "name"),
    ({"name": "x" * 1025}, ValueError, "name"),
    ({"name": "nul\x00inside"}, ValueError, "name"),
    ({"ttl": 0}, ValueError, "ttl"),
    ({"ttl": -1}, ValueError, "ttl"),
    ({"ttl": math.inf}, ValueError, "ttl"),
    ({"ttl": math.nan}, ValueError, "ttl"),
    ({"ttl": "30"}, TypeError, "ttl"),
    ({"ttl": True}, TypeError, "ttl"),
    ({"timeout": -0.5}, ValueError, "timeout"),
    ({"timeout": "1"}, TypeError, "timeout"),
    ({"blocking": 1}, TypeError, "blocking"),
    ({"blocking": False, "timeout": 1.0}, ValueError, "timeout"),
    ({"label": 7}, TypeError, "label"),
    ({"label": "x" * 129}, ValueError, "label"),  # MAX_LABEL_BYTES: each holder and place stores it
    ({"label": "é" * 65}, ValueError, "label"),  # 130 bytes of UTF-8
    ({"write_concern": {"w": 1}}, TypeError, "write_concern"),
    ({"write_concern": WriteConcern(w=0)}, ValueError, "write_concern"),
    ({"heartbeat": 0}, ValueError, "heartbeat"),
    ({"heartbeat": "yes"}, TypeError, "heartbeat"),
    ({"ttl": 3.0, "heartbeat": 1.5}, ValueError, "heartbeat"),
    ({"ttl": 3.0, "safety_margin": 3.0}, ValueError, "safety_margin"),
    ({"ttl": 3.0, "safety_margin": -1}, ValueError, "safety_margin"),
    ({"on_lost": "not callable"}, TypeError, "on_lost"),
    ({"retry_base": 0}, ValueError, "retry_base"),
    ({"retry_base": 0.5, "retry_cap": 0.1}, ValueError, "retry_cap"),
]


@pytest.mark.parametrize(("overrides", "error", "argument"), BAD_CONSTRUCTOR_ARGUMENTS)
async def test_bad_constructor_argument(
    counted_collection: Any,
    command_counter: CommandCounter,
    overrides: dict[str, Any],
    error: type[Exception],
    argument: str,
) -> None:
    arguments: dict[str, Any] = {"collection": counted_collection, "name": "job", "ttl": 30.0, **overrides}
    with pytest.raises(error, match=argument):
        AsyncMongoLock(**arguments)
    assert command_counter.names == []


def _semaphore(collection: Any, name: Any, **options: Any) -> object:
    return AsyncMongoSemaphore(collection, name, 2, **options)


def _reader(collection: Any, name: Any, **options: Any) -> object:
    return RWLockHandle(collection, name, "read", **options)


def _manager(collection: Any, name: Any, **options: Any) -> object:
    _validate.lock_name(name)  # a manager takes names per call
    return LockManager(collection, **options)


# Every handle takes the lease options from one definition: each checks them all, with the same
# errors, before any I/O, and refuses with a TypeError the options that do not apply to it.
MAKERS: dict[str, tuple[Callable[..., object], tuple[str, ...]]] = {
    "semaphore": (_semaphore, ()),
    "rwlock": (AsyncMongoRWLock, ("fair",)),
    "reader": (_reader, ("fair",)),
    "election": (AsyncMongoElection, ("fair", "blocking")),
    "job": (AsyncMongoJob, ("fair", "blocking", "timeout", "retry_base", "retry_cap")),
    "manager": (_manager, ()),
}


@pytest.mark.parametrize("kind", MAKERS)
async def test_every_handle_checks_the_shared_options(
    counted_collection: Any, command_counter: CommandCounter, kind: str
) -> None:
    make, not_taken = MAKERS[kind]
    checked = 0
    for overrides, error, argument in BAD_CONSTRUCTOR_ARGUMENTS:
        if set(overrides) & set(not_taken):
            continue
        with pytest.raises(error, match=argument):
            make(counted_collection, **{"name": "job", "ttl": 30.0, **overrides})
        checked += 1
    assert checked >= len(BAD_CONSTRUCTOR_ARGUMENTS) - 8
    for option in (*not_taken, "ttl_seconds"):
        with pytest.raises(TypeError, match=option):
            make(counted_collection, "job", **{option: 1.0})
    make(counted_collection, "job")  # and the defaults pass
    assert command_counter.names == []


async def test_handles_with_the_same_options_share_one_checked_copy(mongolock_collection: Any) -> None:
    # One handle per order, tenant or file: 10,000 handles should not hold 10,000 copies of the
    # same options (136 bytes each, a seventh of what a held lease costs).
    handles = [AsyncMongoLock(mongolock_collection, f"order-{i}", ttl=30.0, heartbeat=True) for i in range(3)]
    assert handles[0]._options is handles[1]._options is handles[2]._options
    # The same means the same type too: heartbeat=True renews every third of the TTL, 1.0 every
    # second, though True == 1.0.
    every_third = LeaseOptions.checked("AsyncMongoLock", LOCK_OPTIONS, ttl=6.0, heartbeat=True)
    every_second = LeaseOptions.checked("AsyncMongoLock", LOCK_OPTIONS, ttl=6.0, heartbeat=1.0)
    assert every_third.heartbeat_interval(6.0) == 2.0
    assert every_second.heartbeat_interval(6.0) == 1.0
    other = AsyncMongoLock(mongolock_collection, "order-x", ttl=30.0, heartbeat=True, label="x")
    assert other._options is not handles[0]._options and other._options.label == "x"


async def test_bad_call_arguments(counted_collection: Any, command_counter: CommandCounter) -> None:
    lock = AsyncMongoLock(counted_collection, "job", ttl=3.0, heartbeat=1.0)
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(timeout=-1)
    with pytest.raises(TypeError, match="blocking"):
        await lock.acquire(blocking="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(blocking=False, timeout=1.0)
    with pytest.raises(TypeError, match="idle_after"):
        await ensure_idle_cleanup_index(counted_collection, idle_after=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_after"):
        await ensure_idle_cleanup_index(counted_collection, idle_after=0)
    assert command_counter.names == []
    assert await lock.acquire()
    assert command_counter.count("findAndModify") == 1, "the counter must see real commands"
    started = len(command_counter.names)
    with pytest.raises(ValueError, match="ttl"):
        await lock.extend(ttl=0)
    with pytest.raises(ValueError, match="heartbeat"):
        await lock.extend(ttl=1.0)  # a 1 s heartbeat cannot fit twice into 1 s
    assert len(command_counter.names) == started
    assert await lock.release()


def test_a_blocking_collection_is_refused() -> None:
    client: MongoClient[dict[str, Any]] = MongoClient("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=1")
    try:
        with pytest.raises(TypeError, match="blocking pymongo Collection"):
            AsyncMongoLock(client.db.locks, "job")
        with pytest.raises(TypeError, match="collection"):
            AsyncMongoLock(client.db, "job")
        with pytest.raises(TypeError, match="collection"):
            AsyncMongoLock(object(), "job")
    finally:
        client.close()


@pytest.mark.timing(margin=4.5)  # 5 s leases, released at the end
async def test_an_operator_shaped_name_is_a_plain_string(mongolock_collection: Any) -> None:
    plain = AsyncMongoLock(mongolock_collection, "ordinary", ttl=5.0)
    assert await plain.acquire()
    # If the name reached the query as an operator, {"$gt": ""} would match "ordinary" and find it held.
    tricky = AsyncMongoLock(mongolock_collection, '{"$gt": ""}', ttl=5.0)
    assert await tricky.acquire(blocking=False)
    assert await mongolock_collection.find_one({"_id": '{"$gt": ""}'}) is not None
    dollar = AsyncMongoLock(mongolock_collection, "$where", ttl=5.0)
    assert await dollar.acquire(blocking=False)
    assert await mongolock_collection.count_documents({}) == 3
    for lock in (plain, tricky, dollar):
        assert await lock.release()


@pytest.mark.parametrize(
    ("module", "missing"), [("fastapi", "fastapi"), ("aiohttp", "aiohttp"), ("opentelemetry", "opentelemetry")]
)
def test_an_integration_without_its_extra_names_the_extra(module: str, missing: str) -> None:
    # The dependency made unimportable, as in an environment without the extra.
    script = f"import sys; sys.modules[{missing!r}] = None; import mongolock_async.{module}"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=child_environment()
    )
    assert result.returncode != 0
    assert f"the {module} extra (from a checkout: pip install '.[{module}]')" in result.stderr.splitlines()[-1]


async def test_a_document_at_its_worst_stays_far_below_mongodbs_limit(mongolock_collection: Any) -> None:
    # The most a read-write lock's document holds without its queue: MAX_PERMITS readers, each
    # with the longest label and a 255-byte host name (the longest DNS name; gethostname on Linux
    # gives at most 64), renewed, plus the longest handedOffTo (a writer's release to every reader)
    # and the releases and withdrawals it remembers. Built from entries the store itself wrote.
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    holder = {"host": "h" * 255, "pid": 2**22, "label": "é" * (MAX_LABEL_BYTES // 2)}
    reader, ttl_ms = Permits("rwlock", MAX_PERMITS, 1), 366 * 86_400_000
    token = "0123456789abcdef" + "f" * 32  # a waiting process's token: prefix and 128 random bits
    assert (await store.try_acquire("worst", token, ttl_ms, holder, permits=reader)).holds(token)
    assert await store.renew([Renewal("worst", token, ttl_ms, reader)]) == {("worst", token)}
    writer_place = Permits("rwlock", MAX_PERMITS, MAX_PERMITS)
    await store.try_acquire("worst", "w" + token[1:], ttl_ms, holder, enqueue=True, fair=True, permits=writer_place)
    doc = await mongolock_collection.find_one({"_id": "worst"})
    entry, place = doc["holders"][0], doc["queue"][0]
    assert entry["holder"] == holder and entry.get("r"), entry
    tokens = [f"{n:016x}{token[16:]}" for n in range(MAX_PERMITS)]
    doc["holders"] = [{**entry, "o": each} for each in tokens]
    doc["queue"] = []
    doc["handedOffTo"] = " ".join(tokens)
    doc["releasedOwners"] = doc["withdrawn"] = tokens[:64]
    size = len(bson.encode(doc))
    limit = 16 * 1024 * 1024
    assert size < limit / 2, f"{size:,} bytes"
    # What is left holds the queue: a waiting process's place at the same bounds.
    place_size = len(bson.encode({"9999": place}))
    assert (limit - size) // place_size > MAX_PERMITS, (size, place_size)
