"""Async clients of either driver, for tests and the demo."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient, MongoClient

from .._util.collection_types import AsyncClient, AsyncCollection

DRIVERS = ("pymongo", "motor")
TEST_DATABASE = "mongolock_tests"


def make_client(driver: str, uri: str, **options: Any) -> Any:
    """An async client of ``driver`` ("pymongo" or "motor") for ``uri``."""
    options.setdefault("serverSelectionTimeoutMS", 10_000)
    if driver == "pymongo":
        return AsyncMongoClient(uri, **options)
    if driver == "motor":
        from motor.motor_asyncio import AsyncIOMotorClient

        return AsyncIOMotorClient(uri, **options)
    raise ValueError(f"unknown driver {driver!r}; expected one of {DRIVERS}")


async def close_client(client: AsyncClient) -> None:
    """Close a client of either driver (PyMongo's close is a coroutine; Motor's is not)."""
    result = client.close()
    if result is not None:
        await result


async def shard(collection: AsyncCollection) -> None:
    """Shard ``collection`` on ``{_id: "hashed"}`` (through a mongos), as docs/deploying.md advises."""
    admin = collection.database.client.admin
    await admin.command("enableSharding", collection.database.name)
    await admin.command("shardCollection", collection.full_name, key={"_id": "hashed"})


def shard_blocking(client: MongoClient[dict[str, Any]], database: str, collection: str) -> None:
    """``shard``, with a blocking client (of a user allowed to shard: the test user may not be)."""
    client.admin.command("enableSharding", database)
    client.admin.command("shardCollection", f"{database}.{collection}", key={"_id": "hashed"})
