"""Code as a user writes it, checked with ``mypy --strict`` (``make lint``); never run."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import (
    AsyncMongoElection,
    AsyncMongoLock,
    AsyncMongoRWLock,
    AsyncMongoSemaphore,
    LockHooks,
    LockManager,
    LockTimeoutError,
)
from mongolock_async.jobs import AsyncMongoJob

client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient()
collection = client["app"]["locks"]


async def fencing_token_of_a_job() -> int:
    async with AsyncMongoLock(collection, "nightly-report", ttl=30, heartbeat=True) as lock:
        token = lock.fencing_token
        assert token is not None
        return token  # no "missing return": __aexit__ does not claim to swallow exceptions


async def stock_left(locks: LockManager, sku: str) -> int | None:
    try:
        async with locks(f"stock:{sku}", timeout=2):
            return 1
    except LockTimeoutError:
        return None


locks = LockManager(collection, ttl=10, label="checkout")


@locks.run_once("cleanup")
async def cleanup(days: int) -> str:
    return f"cleaned {days} days"


async def run_cleanup() -> str | None:
    result: str | None = await cleanup(7)
    return result


class Metrics(LockHooks):
    def acquired(self, name: str, *, fencing_token: int, waited: float) -> None:
        print(name, fencing_token, waited)


def options_a_type_checker_refuses() -> None:
    """Each handle's options are typed: a misspelt one, or one that does not apply to the handle,
    is an error here (``--strict`` reports an ignore that is not needed, so each line must fail)."""
    AsyncMongoLock(collection, "a", ttl_seconds=3)  # type: ignore[call-arg]
    AsyncMongoLock(collection, "a", heartbeat="yes")  # type: ignore[arg-type]
    AsyncMongoSemaphore(collection, "a", 2, fair="no")  # type: ignore[arg-type]
    AsyncMongoElection(collection, "a", fair=True)  # type: ignore[call-arg]
    AsyncMongoRWLock(collection, "a", fair=True)  # type: ignore[call-arg]
    AsyncMongoJob(collection, "a", every=60, timeout=3)  # type: ignore[call-arg]
    locks.semaphore("a", 2, retry_cap="1")  # type: ignore[arg-type]
