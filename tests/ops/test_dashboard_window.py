"""The dashboard at scale: a page shows a window of the locks (a page of names, filtered by what a
name contains or starts with and by state) and the server sends that window and its changes, never
the whole collection; ``mongolock list`` pages and streams."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from mongolock_async import AsyncMongoLock
from mongolock_async.dashboard import Dashboard
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.event_streams import next_message
from tests.support.run_settings import child_environment

LOCKS = 250


async def seed(collection: Any, count: int = LOCKS) -> AsyncMongoLock:
    """``count`` lock documents as the library writes them (one held in three, the rest released),
    named ``a:0000`` to ``b:...`` (half each), inserted at once; and one lock held by a handle the
    caller keeps (``a:live``)."""
    live = AsyncMongoLock(collection, "a:live", ttl=120, label="worker")
    assert await live.acquire()
    template = await collection.find_one({"_id": "a:live"})
    assert template is not None
    now = datetime.now(UTC)
    documents = []
    for index in range(count):
        document = {**template, "_id": f"{'ab'[index * 2 // count]}:{index:04d}"}
        if index % 3:
            document.update(owner=None, releasedAt=now)
        else:
            document.update(owner=secrets.token_hex(24), expiresAt=now + timedelta(hours=1))
        documents.append(document)
    await collection.insert_many(documents)
    return live


async def test_a_page_gets_its_window_and_only_its_changes(pymongo_collection: Any) -> None:
    live = await seed(pymongo_collection)
    dashboard = Dashboard(pymongo_collection)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=dashboard), base_url="http://127.0.0.1"
        ) as client:

            async def state(query: str = "") -> dict[str, Any]:
                answer = await client.get("/state.json" + query)
                assert answer.status_code == 200, answer.text
                return dict(answer.json())

            first = await state()
            second = await state(f"?after={first['names'][-1]}")
            back = await state(f"?before={second['names'][0]}")
            held_b = await state("?prefix=b:&state=held&limit=10")
            contains = await state("?contains=:012&limit=5")
            refused = await client.get("/state.json?limit=100000")
    finally:
        await dashboard.aclose()
    total = LOCKS + 1
    assert first["total"] == first["matching"] == total and len(first["names"]) == len(first["locks"]) == 100
    assert first["names"] == sorted(first["names"]) and first["names"][0] == "a:0000"
    assert first["more_after"] and not first["more_before"]
    assert second["names"][0] > first["names"][-1] and len(second["names"]) == 100 and second["more_before"]
    assert back["names"] == first["names"], "a page back is the page before"
    assert all(name.startswith("b:") for name in held_b["names"]) and len(held_b["names"]) == 10
    assert all(lock["held"] for lock in held_b["locks"]) and held_b["matching"] == 42
    assert contains["names"] == ["a:0120", "a:0121", "a:0122", "a:0123", "a:0124"] and contains["matching"] == 10
    assert refused.status_code == 400 and "limit" in refused.json()["error"]
    assert await live.release()


async def test_an_update_reaches_only_the_pages_whose_window_it_touches(pymongo_collection: Any) -> None:
    live = await seed(pymongo_collection)
    dashboard = Dashboard(pymongo_collection)
    try:
        async with TestServer(dashboard.aiohttp_app()) as server, ClientSession() as session:
            pages = {
                window: await session.get(server.make_url("/events" + window))
                for window in ("?prefix=a:", "?prefix=b:", "?contains=live")
            }
            snapshots = {window: await asyncio.wait_for(next_message(page), 30) for window, page in pages.items()}
            await pymongo_collection.update_one({"_id": "a:0001"}, {"$set": {"releasedAt": datetime.now(UTC)}})
            assert await live.release()
            told = {
                window: await asyncio.wait_for(next_message(pages[window]), 30)
                for window in ("?prefix=a:", "?contains=live")
            }
            quiet = asyncio.ensure_future(next_message(pages["?prefix=b:"]))
            await asyncio.sleep(1.0)
            assert not quiet.done(), "a page whose window nothing touched is told nothing"
            quiet.cancel()
            for page in pages.values():
                page.close()
    finally:
        await dashboard.aclose()
    assert all(snapshot["type"] == "snapshot" for snapshot in snapshots.values())
    assert len(snapshots["?prefix=b:"]["names"]) == 100 and snapshots["?contains=live"]["names"] == ["a:live"]
    sent = {window: [lock["name"] for lock in message["locks"]] for window, message in told.items()}
    assert sent["?contains=live"] == ["a:live"], told
    assert set(sent["?prefix=a:"]) <= {"a:0001", "a:live"} and sent["?prefix=a:"], told
    size = len(json.dumps(told["?contains=live"]))
    assert size < 4000, f"an update carries its window's change, not the collection ({size} bytes)"


def listed(arguments: list[str], where: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mongolock_async", "list", *arguments, *where],
        capture_output=True, text=True, env=child_environment(), timeout=120,
    )  # fmt: skip


def test_list_pages_with_after_and_limit_and_streams_json(mongolock_uri: str) -> None:
    from pymongo import MongoClient

    name = f"listed_{uuid.uuid4().hex[:8]}"
    with MongoClient(mongolock_uri) as client:
        collection = client[TEST_DATABASE][name]
        collection.insert_many([{"_id": f"n:{index:03d}", "owner": None, "fence": index + 1} for index in range(30)])
        where = ["--uri", mongolock_uri, "--db", TEST_DATABASE, "--collection", name]
        try:
            runs = {
                arguments: listed(arguments.split(), where)
                for arguments in ("--json --limit 10", "--json --limit 10 --after n:009", "--limit 5", "--json")
            }
        finally:
            client[TEST_DATABASE].drop_collection(name)
    for result in runs.values():
        assert result.returncode == 0, result.stderr
    first = json.loads(runs["--json --limit 10"].stdout)
    second = json.loads(runs["--json --limit 10 --after n:009"].stdout)
    assert [entry["name"] for entry in first] == [f"n:{index:03d}" for index in range(10)]
    assert [entry["name"] for entry in second] == [f"n:{index:03d}" for index in range(10, 20)]
    assert len(json.loads(runs["--json"].stdout)) == 30
    table = runs["--limit 5"]
    rows = [line.split()[0] for line in table.stdout.splitlines()[1:] if line.startswith("n:")]
    assert rows == [f"n:{index:03d}" for index in range(5)]
    assert "more: --after n:004" in table.stderr, table.stderr


@pytest.mark.parametrize("bad", [["--limit", "0"], ["--after", ""]], ids=["limit", "after"])
def test_list_refuses_a_bad_page(mongolock_uri: str, bad: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mongolock_async", "list", *bad, "--uri", mongolock_uri],
        capture_output=True, text=True, env=child_environment(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
