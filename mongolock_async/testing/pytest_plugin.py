"""pytest fixtures: one MongoDB server per session, a fresh lock collection per test and driver.

``lock_collection`` is parametrized over both drivers, so every test that uses it runs twice: once
with a PyMongo ``AsyncCollection``, once with a Motor collection.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from .clients import DRIVERS, TEST_DATABASE, close_client, make_client
from .selection import ServerChoice, select_server


@pytest.fixture(scope="session")
def mongodb_server() -> Iterator[ServerChoice]:
    """The session's server: ``MONGODB_URI``, else testcontainers, else embedded."""
    with select_server() as choice:
        yield choice


@pytest.fixture(scope="session")
def mongodb_uri(mongodb_server: ServerChoice) -> str:
    return mongodb_server.uri


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """The driver a test runs with; tests using it run once per driver."""
    return str(request.param)


@pytest.fixture
async def mongo_client(driver: str, mongodb_uri: str) -> AsyncIterator[Any]:
    client = make_client(driver, mongodb_uri)
    try:
        yield client
    finally:
        await close_client(client)


@pytest.fixture
async def lock_collection(mongo_client: Any) -> AsyncIterator[Any]:
    """A fresh, uniquely named collection, dropped after the test."""
    collection = mongo_client[TEST_DATABASE][f"locks_{uuid.uuid4().hex[:12]}"]
    try:
        yield collection
    finally:
        await collection.drop()
