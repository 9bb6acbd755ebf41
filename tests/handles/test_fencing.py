"""Fencing tokens only go up: across release, expiry takeover, purge of idle documents and restarts."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import PyMongoError

from mongolock_async import AsyncMongoLock, ServerUnreachableError, ensure_idle_cleanup_index
from mongolock_async.store import SERVER_NOW, is_transient
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import DRIVERS, close_client, make_client

HANDLES = 3
TTL = 0.2
RECONNECT = 10.0
"""Seconds an acquire is tried again after transient errors (a restarted server's first moments)."""
Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, HANDLES - 1)),
        st.tuples(st.just("release"), st.integers(0, HANDLES - 1)),
        st.tuples(st.just("expire"), st.just(0)),
        st.tuples(st.just("purge"), st.just(0)),
        st.tuples(st.sampled_from(["restart", "crash"]), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


@pytest.fixture(scope="module")
def fencing_server() -> Iterator[EmbeddedMongo]:
    with EmbeddedMongo() as server:
        yield server


async def acquire_once(lock: AsyncMongoLock) -> bool:
    """A non-blocking acquire, tried again after a transient error for up to ``RECONNECT`` seconds:
    each attempt is bounded by the 0.2 s TTL, and after a restart the driver may find the server again
    only at its next check, which a loaded machine delays past several attempts (the library undoes
    whatever a failed attempt may have taken, so the tokens must still only go up)."""
    give_up_at = time.monotonic() + RECONNECT
    while True:
        try:
            return await lock.acquire(blocking=False)
        except ServerUnreachableError:  # no server selected within the TTL: nothing was sent
            if time.monotonic() >= give_up_at:
                raise
        except PyMongoError as error:
            if time.monotonic() >= give_up_at or not is_transient(error):
                raise
        await asyncio.sleep(0.2)


async def run_steps(server: EmbeddedMongo, driver: str, collection_name: str, plan: list[Step]) -> list[int]:
    client = make_client(driver, server.uri)
    collection = client["fencing"][collection_name]
    locks = [AsyncMongoLock(collection, "fenced", ttl=TTL) for _ in range(HANDLES)]
    tokens: list[int] = []
    try:
        # The first token, on a free lock: tried until taken (an attempt is bounded by the 0.2 s
        # TTL, which a loaded machine's server can take longer than to answer).
        assert await locks[0].acquire(timeout=RECONNECT)
        assert locks[0].fencing_token is not None
        tokens.append(locks[0].fencing_token)
        for action, index in [*plan, ("acquire", 1)]:
            if action == "acquire":
                lock = locks[index]
                if lock.fencing_token is not None:
                    await lock.release()
                if await acquire_once(lock):
                    assert lock.fencing_token is not None
                    tokens.append(lock.fencing_token)
            elif action == "release":
                await locks[index].release()
            elif action == "expire":
                await asyncio.sleep(TTL + 0.05)
            elif action == "purge":
                # What the idle-cleanup TTL index does: delete documents whose lease has ended.
                await asyncio.sleep(0.005)
                await collection.delete_many({"$expr": {"$lt": ["$expiresAt", SERVER_NOW]}})
            else:
                await asyncio.to_thread(server.restart, crash=action == "crash")
        # The final acquire must always get a token: wait for any lease left by the plan to expire.
        if locks[1].fencing_token is None:
            await asyncio.sleep(TTL + 0.05)
            for lock in locks:
                await lock.release()
            assert await locks[1].acquire(timeout=5)
            assert locks[1].fencing_token is not None
            tokens.append(locks[1].fencing_token)
    finally:
        await collection.drop()
        await close_client(client)
    return tokens


@pytest.mark.safety
@pytest.mark.parametrize("driver", DRIVERS)
def test_tokens_strictly_increase(fencing_server: EmbeddedMongo, driver: str) -> None:
    counter = iter(range(1_000_000))

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plan=steps)
    def check(plan: list[Step]) -> None:
        tokens = asyncio.run(run_steps(fencing_server, driver, f"run{next(counter)}", plan))
        assert len(tokens) >= 2
        assert all(earlier < later for earlier, later in itertools.pairwise(tokens)), tokens

    check()


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
