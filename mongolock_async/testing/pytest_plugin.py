"""pytest fixtures for code that uses mongolock-async: a MongoDB server, a client, a fresh lock
collection. Registered automatically (a ``pytest11`` entry point) when the package is installed.

- ``mongolock_server`` (session): the server, chosen once per session: ``MONGODB_URI`` if set,
  else a testcontainers MongoDB where a Docker engine answers, else the embedded server (needs the
  ``embedded`` extra). A [`ServerChoice`][mongolock_async.testing.ServerChoice].
- ``mongolock_uri`` (session): its URI.
- ``mongolock_driver``: ``"pymongo"``, and ``"motor"`` too when Motor is installed: tests that use
  the fixtures below run once per driver (``MONGOLOCK_TEST_DRIVERS=pymongo`` picks, comma-separated).
- ``mongolock_client``: an async client of that driver, closed after the test.
- ``mongolock_collection``: a fresh, uniquely named collection for locks, dropped after the test;
  with ``MONGOLOCK_TEST_SHARDED=1`` (against a mongos) sharded on ``{_id: "hashed"}``.
- ``mongolock_admin_client`` (session): a blocking PyMongo client that shards and drops those
  collections: of ``MONGOLOCK_TEST_ADMIN_URI`` if set, so that the user of ``MONGODB_URI`` needs
  no more than the lock's own privileges, else of the session's server.

The async fixtures are pytest-asyncio fixtures (``pip install pytest-asyncio``), so they work in
its strict mode as well as in auto mode.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from .clients import TEST_DATABASE, close_client, make_client, shard_blocking
from .selection import ServerChoice, select_server


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _drivers() -> list[str]:
    chosen = os.environ.get("MONGOLOCK_TEST_DRIVERS")
    if chosen:
        return [driver.strip() for driver in chosen.split(",") if driver.strip()]
    return ["pymongo", *(["motor"] if _installed("motor") else [])]


DRIVERS = _drivers()


@pytest.fixture(scope="session")
def mongolock_server() -> Iterator[ServerChoice]:
    """The session's MongoDB server: ``MONGODB_URI``, else testcontainers, else embedded."""
    with select_server() as choice:
        yield choice


@pytest.fixture(scope="session")
def mongolock_uri(mongolock_server: ServerChoice) -> str:
    """The URI of the session's server."""
    return mongolock_server.uri


@pytest.fixture(scope="session")
def mongolock_admin_client(mongolock_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A blocking client for creating, sharding and dropping test collections:
    ``MONGOLOCK_TEST_ADMIN_URI`` if set, else the session's server."""
    uri = os.environ.get("MONGOLOCK_TEST_ADMIN_URI") or mongolock_uri
    client: MongoClient[dict[str, Any]]
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


@pytest.fixture(params=DRIVERS)
def mongolock_driver(request: pytest.FixtureRequest) -> str:
    """The driver a test runs with: every test that uses it runs once per installed driver."""
    return str(request.param)


if _installed("pytest_asyncio"):
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def mongolock_client(mongolock_driver: str, mongolock_uri: str) -> AsyncIterator[Any]:
        """An async client (PyMongo's ``AsyncMongoClient``, or Motor's) of the session's server."""
        client = make_client(mongolock_driver, mongolock_uri)
        try:
            yield client
        finally:
            await close_client(client)

    @pytest_asyncio.fixture
    async def mongolock_collection(
        mongolock_client: Any, mongolock_admin_client: MongoClient[dict[str, Any]]
    ) -> AsyncIterator[Any]:
        """A fresh, uniquely named collection for locks, dropped after the test."""
        collection = mongolock_client[TEST_DATABASE][f"locks_{uuid.uuid4().hex[:12]}"]
        if os.environ.get("MONGOLOCK_TEST_SHARDED") == "1":
            shard_blocking(mongolock_admin_client, TEST_DATABASE, collection.name)
        try:
            yield collection
        finally:
            mongolock_admin_client[TEST_DATABASE].drop_collection(collection.name)
