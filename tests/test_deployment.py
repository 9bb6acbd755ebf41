"""Deployments as users run them: a strict Stable API client, TLS, authentication, least privileges."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pymongo.server_api import ServerApi
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, ensure_idle_cleanup_index
from mongolock_async.fencing import fenced_update_one
from mongolock_async.store import LockStore
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.conftest import CommandCounter, transaction

# The operators the library's requests use, all in MongoDB's Stable API (V1) since 5.0.0. SERVER-58076
# left out of V1 only what 5.0 itself brought ($dateAdd, $dateSubtract, $dateDiff, $dateTrunc,
# $getField, $setField, $setWindowFields); SERVER-60899 added those later in the 5.0 series, so a
# strict client of an early 5.0.x refuses them. src/mongo/db/pipeline/expression.cpp registers
# every expression below with REGISTER_STABLE_EXPRESSION.
STABLE_API_V1_OPERATORS = {
    # stages
    "$set", "$unset", "$match", "$project", "$addFields", "$sort", "$changeStream",
    # query and update operators
    "$and", "$or", "$in", "$nin", "$type", "$regex", "$exists", "$gt", "$gte", "$lt", "$lte", "$inc",
    # expressions
    "$add", "$multiply", "$subtract", "$max", "$cond", "$not", "$eq", "$ne", "$ifNull", "$literal",
    "$toDate", "$toLong", "$filter", "$map", "$indexOfArray", "$size", "$concatArrays", "$first",
    "$isArray", "$mergeObjects",
}  # fmt: skip


def operators_in(value: Any, *, top: bool = True) -> set[str]:
    """Every ``$``-operator in a command (its top-level ``$db``, ``$clusterTime`` and kin are fields)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key.startswith("$") and not top:
                found.add(key)
            found |= operators_in(item, top=False)
    elif isinstance(value, list):
        for item in value:
            found |= operators_in(item, top=False)
    return found


async def test_a_strict_stable_api_client_works(driver: str, mongodb_uri: str) -> None:
    strict = ServerApi("1", strict=True)
    counter = CommandCounter()
    client = make_client(driver, mongodb_uri, server_api=strict, event_listeners=[counter])
    other = make_client(driver, mongodb_uri, server_api=strict, event_listeners=[counter])  # another process
    name = f"locks_{uuid.uuid4().hex[:12]}"
    locks, elsewhere = client[TEST_DATABASE][name], other[TEST_DATABASE][name]
    try:
        holder = AsyncMongoLock(locks, "strict", ttl=3.0, heartbeat=0.5)
        async with holder:
            waiter = AsyncMongoLock(elsewhere, "strict", ttl=30.0)
            waiting = asyncio.create_task(waiter.acquire(timeout=20))
            await asyncio.sleep(1.2)  # renewed twice; the waiter queued and its stream opened
            assert await holder.locked() and await holder.owned()
            await holder.extend(4.0)
            stock = client[TEST_DATABASE][name + "_stock"]
            written = await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"n": 1}}, token=holder, upsert=True)
            assert written.applied
            async with transaction(client) as session:
                await holder.guard_transaction(session)
        assert await waiting, "the hand-off to the other process did not arrive"
        assert await waiter.release()
        store = LockStore(locks, WriteConcern(w="majority"))
        assert [report.name for report in await store.report()] == ["strict"]
        assert await store.force_release("strict") is None
        await ensure_idle_cleanup_index(locks, idle_after=3600)
        used = set().union(*(operators_in(command) for command in counter.commands))
        assert "$dateAdd" not in used
        assert used <= STABLE_API_V1_OPERATORS, f"outside the Stable API: {used - STABLE_API_V1_OPERATORS}"
        assert {"findAndModify", "update", "aggregate", "getMore"} <= set(counter.names)
    finally:
        await locks.drop()
        await client[TEST_DATABASE][name + "_stock"].drop()
        await close_client(other)
        await close_client(client)
