"""The idle-cleanup index (``ensure_idle_cleanup_index``): its shape, asked for twice. That fencing
tokens only go up across release, expiry takeover, the purge of idle documents it does, and
restarts is checked over generated histories in tests/handles/test_stateful.py."""

from __future__ import annotations

from typing import Any

from mongolock_async import AsyncMongoLock, ensure_idle_cleanup_index


async def test_idle_cleanup_index_spares_live_leases(mongolock_collection: Any) -> None:
    name = await ensure_idle_cleanup_index(mongolock_collection, idle_after=3600)
    info = await mongolock_collection.index_information()
    assert info[name]["expireAfterSeconds"] == 3600
    assert info[name]["key"] == [("expiresAt", 1)]
    lock = AsyncMongoLock(mongolock_collection, "indexed", ttl=30.0)
    assert await lock.acquire()
    assert await lock.release()
    # Idempotent: asking again with the same setting is fine.
    assert await ensure_idle_cleanup_index(mongolock_collection, idle_after=3600) == name
