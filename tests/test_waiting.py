"""Waiters wake on releases by other processes (change streams) and fall back to backoff without them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from mongolock_async import AsyncMongoLock
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.conftest import CommandCounter


async def foreign_release(collection: Any, name: str) -> None:
    """What a release by another process looks like here: the document changes, no in-process signal."""
    await collection.update_one({"_id": name}, {"$set": {"owner": None}})


async def test_a_release_elsewhere_wakes_the_waiter(lock_collection: Any) -> None:
    holder = AsyncMongoLock(lock_collection, "shared", ttl=60.0)
    # Backoff (uniform in [0, 3600] s) or the holder's expiry (60 s) would hardly wake it within 10 s.
    waiter = AsyncMongoLock(lock_collection, "shared", ttl=60.0, retry_base=3600.0, retry_cap=3600.0)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=10))
    await asyncio.sleep(0.5)  # the waiter has tried once and its change stream is open
    assert not waiting.done()
    await foreign_release(lock_collection, "shared")
    assert await asyncio.wait_for(waiting, 15), "the waiter was not woken by the change stream"
    assert await waiter.release()
    await asyncio.sleep(0)
    assert not [task for task in asyncio.all_tasks() if task.get_name() == "mongolock-release-watcher"]


async def test_renewals_do_not_wake_waiters(counted_collection: Any, command_counter: CommandCounter) -> None:
    holder = AsyncMongoLock(counted_collection, "busy", ttl=6.0, heartbeat=0.2)
    waiter = AsyncMongoLock(counted_collection, "busy", ttl=6.0, retry_base=3600.0, retry_cap=3600.0)
    assert await holder.acquire()
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await asyncio.sleep(0.3)
    attempts_before = command_counter.count("findAndModify")
    renewals_before = command_counter.count("update")
    await asyncio.sleep(1.0)
    assert command_counter.count("update") - renewals_before >= 3, "the holder kept renewing"
    assert command_counter.count("findAndModify") == attempts_before, "a renewal woke the waiter"
    await foreign_release(counted_collection, "busy")
    assert await asyncio.wait_for(waiting, 15)
    assert command_counter.count("findAndModify") == attempts_before + 1
    await asyncio.wait_for(holder.lost.wait(), 5)  # and the holder notices it lost the lease
    assert await waiter.release()


async def test_without_change_streams_waiters_use_backoff(driver: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="mongolock_async")
    with EmbeddedMongo(replica_set=False) as server:
        client = make_client(driver, server.uri)
        try:
            collection = client[TEST_DATABASE]["locks"]
            holder = AsyncMongoLock(collection, "standalone", ttl=60.0)
            waiter = AsyncMongoLock(collection, "standalone", ttl=60.0, retry_base=0.05, retry_cap=0.2)
            assert await holder.acquire()
            waiting = asyncio.create_task(waiter.acquire(timeout=10))
            await asyncio.sleep(0.5)
            await foreign_release(collection, "standalone")
            assert await asyncio.wait_for(waiting, 15)
            assert await waiter.release()
            assert "no change stream" in caplog.text, "the standalone server did offer a change stream"
        finally:
            await close_client(client)
