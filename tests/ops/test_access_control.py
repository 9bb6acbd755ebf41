"""Least privileges on a server that enforces them: what a user without the ``changeStream`` action
gets when it has to wait for a lock.

The workflow's access-control job runs the lock, semaphore, read-write lock, election, heartbeat,
change-stream and command tests as users with exactly the roles docs/deploying.md gives (MongoDB
with a keyfile enforces them). This file adds the one privilege those roles include and a user may
leave out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongolock_async import AsyncMongoLock
from mongolock_async.privileges import lock_privileges
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.fail_points import FaultServer, set_fail_point

pytestmark = pytest.mark.environment
_UNAUTHORIZED = 13


def with_credentials(uri: str, user: str, password: str) -> str:
    """``uri`` with ``user`` and ``password`` in place of its own (authSource=admin)."""
    scheme, _, rest = uri.partition("://")
    hosts = rest.split("/", 1)[0].rpartition("@")[2]
    tail = rest.split("/", 1)[1] if "/" in rest else ""
    credentials = f"{urllib.parse.quote_plus(user)}:{urllib.parse.quote_plus(password)}@"
    return f"{scheme}://{credentials}{hosts}/{tail}"


@pytest.fixture
async def without_change_streams(
    mongolock_driver: str, fault_server: FaultServer, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> AsyncIterator[Any]:
    """A client that may find, insert and update the lock collection but not open a change stream
    on it: a user whose role lacks ``changeStream`` where the server enforces roles
    (MONGOLOCK_TEST_ADMIN_URI names its administrator, as in the workflow's access-control job),
    else a client whose change streams fail as MongoDB then fails them (Unauthorized, through a
    fail point scoped to it)."""
    enforcing = bool(os.environ.get("MONGOLOCK_TEST_ADMIN_URI")) and fault_server.on_target
    uri, user = fault_server.uri, None
    if enforcing:
        user = f"no-stream-{uuid.uuid4().hex[:8]}"
        privileges = lock_privileges(TEST_DATABASE, fault_server.collection)
        privileges[0]["actions"] = [action for action in privileges[0]["actions"] if action != "changeStream"]
        mongolock_admin_client.admin.command("createRole", user, privileges=privileges, roles=[])
        mongolock_admin_client.admin.command("createUser", user, pwd="no-stream", roles=[{"role": user, "db": "admin"}])
        uri = with_credentials(uri, user, "no-stream")
    client = make_client(mongolock_driver, uri, appName=fault_server.app_name)
    collection = client[TEST_DATABASE][fault_server.collection]
    try:
        try:
            await (await _watch(collection)).close()
            refused = False
        except OperationFailure as error:
            refused = error.code == _UNAUTHORIZED
        if os.environ.get("MONGOLOCK_TEST_ROLES_ENFORCED") == "1":
            assert refused, "mongod opened a change stream for a user without the changeStream action"
        if not refused:  # a server that does not check the action (the embedded one): as MongoDB refuses it
            await set_fail_point(collection, "alwaysOn", failCommands=["aggregate"], errorCode=_UNAUTHORIZED)
        yield collection
    finally:
        await close_client(client)
        if user is not None:
            mongolock_admin_client.admin.command("dropUser", user)
            mongolock_admin_client.admin.command("dropRole", user)


async def _watch(collection: Any) -> Any:
    stream = collection.watch()
    return await stream if asyncio.iscoroutine(stream) else stream


async def test_a_waiter_without_the_change_stream_privilege_polls_and_logs_why(
    mongolock_driver: str, fault_server: FaultServer, without_change_streams: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The documented fallback, never a silent hang: the waiter's change stream is refused, so it
    # polls (retry_base, retry_cap) and takes the lock the holder's release handed to it.
    caplog.set_level(logging.DEBUG, logger="mongolock_async")
    holder_client = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-holder")
    try:
        holder = AsyncMongoLock(holder_client[TEST_DATABASE][fault_server.collection], "job", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncMongoLock(without_change_streams, "job", ttl=30.0, retry_base=0.05, retry_cap=0.2)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        assert await holder.release()
        assert await waiting, "the waiter never took the lock handed to it"
        assert await waiter.release()
    finally:
        await close_client(holder_client)
    refusals = [record for record in caplog.records if "change stream" in record.getMessage()]
    assert any("waiters poll" in record.getMessage() for record in refusals), refusals
    # Told once at WARNING, with what to do: an operator sees why every wait now polls.
    warnings = [record.getMessage() for record in refusals if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "changeStream action" in warnings[0], warnings
