"""Indexes on the lock collection: a user's own unique index clash is raised, not retried as a race
on the name, and the idle cleanup index needs an hour and can be changed."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import DuplicateKeyError

from mongolock_async import (
    AsyncMongoLock,
    ensure_idle_cleanup_index,
)
from tests.support.commands import CommandCounter


@pytest.mark.timing(margin=4.5)  # the first lease (5 s) live until released
@pytest.mark.environment
async def test_only_a_duplicate_key_on_the_name_is_retried(
    unsharded_counted_collection: Any, command_counter: CommandCounter
) -> None:
    # A user's unique index on another field: not possible on a collection sharded on hashed _id.
    collection = unsharded_counted_collection
    await collection.create_index("holder.label", unique=True, sparse=True)
    first = AsyncMongoLock(collection, "a", ttl=5.0, label="same")
    assert await first.acquire()
    command_counter.clear()
    with pytest.raises(DuplicateKeyError):
        await AsyncMongoLock(collection, "b", ttl=5.0, label="same").acquire(blocking=False)
    assert command_counter.count("findAndModify") == 1, "a user's unique index clash was retried"
    assert await first.release()


async def test_the_idle_cleanup_index_needs_an_hour_and_can_be_changed(mongolock_collection: Any) -> None:
    with pytest.raises(ValueError, match="3600"):
        await ensure_idle_cleanup_index(mongolock_collection, idle_after=60)
    name = await ensure_idle_cleanup_index(mongolock_collection, idle_after=3600)
    assert await ensure_idle_cleanup_index(mongolock_collection, idle_after=7200) == name
    assert (await mongolock_collection.index_information())[name]["expireAfterSeconds"] == 7200
