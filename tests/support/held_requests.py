"""What the tests of late requests share (tests/faults/test_late_requests.py, the model's replays):
two processes' clients of a fault server, requests held at the server by a fail point, and the
check a user makes once the last holder has released: a fresh handle takes the lock at once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from mongolock_async.testing.clients import TEST_DATABASE, close_client
from tests.support.fail_points import FaultServer, set_fail_point


@contextlib.asynccontextmanager
async def two_processes(fault_server: FaultServer, driver: str) -> AsyncIterator[tuple[Any, Any]]:
    """``fault_server``'s collection as two processes see it: (ours, theirs), each on a client of
    its own (queues, places and change streams are per client). A fail point armed on ours holds
    only our requests (theirs has an appName of its own); it is disarmed at the end."""
    ours = fault_server.client(driver)
    theirs = fault_server.client(driver, app_name=f"{fault_server.app_name}-2")
    collection = ours[TEST_DATABASE][fault_server.collection]
    try:
        yield collection, theirs[TEST_DATABASE][fault_server.collection]
    finally:
        await set_fail_point(collection, "off")
        await close_client(ours)
        await close_client(theirs)


async def hold_requests(collection: Any, times: int, held_for: float) -> None:
    """Hold the next ``times`` requests of ``collection``'s client that acquire or release
    (findAndModify) at the server for ``held_for`` seconds each: each lands that long after it was sent."""
    await set_fail_point(
        collection, {"times": times}, failCommands=["findAndModify"], blockConnection=True,
        blockTimeMS=int(held_for * 1000),
    )  # fmt: skip


async def held_by_nobody(collection: Any, names: Iterable[str], fresh: Callable[[str], Any]) -> dict[str, Any]:
    """The names of ``names`` that a fresh handle (``fresh(name)``, on ``collection``) cannot take at
    once, each with its document (owner, holders, queue, withdrawn tokens); a name it takes is
    released again. Once the last holder has released, this must be empty."""
    refused = {}
    for name in names:
        lock = fresh(name)
        if await lock.acquire(blocking=False):
            await lock.release()
        else:
            fields = {"owner": 1, "holders": 1, "queue": 1, "withdrawn": 1}
            refused[name] = await collection.find_one({"_id": name}, fields)
    return refused
