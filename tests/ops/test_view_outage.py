"""A view cut off from MongoDB (a network cut between the viewer and the server, while the
holders still reach it): it says "disconnected since ...", keeps the last state it knew as stale
rather than expired, judges no lease expired for want of news, reports what really changed once
it is back, and tells the dashboard's viewers a cause that names no host."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock
from mongolock_async.dashboard import Dashboard
from mongolock_async.live import LockWatch, ViewUpdate
from mongolock_async.testing import EmbeddedMongo

OUTAGE = 5.0  # seconds: more than twice the TTL below, so every lease would have expired unrenewed
TTL = 2.0


class CuttableProxy:
    """A TCP proxy to a server that can be cut (every connection closed, new ones refused) and
    restored on the same port: the network between a viewer and MongoDB."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@contextlib.asynccontextmanager
async def viewer_and_holder(server: EmbeddedMongo) -> AsyncIterator[tuple[CuttableProxy, Any, Any]]:
    """A proxy to ``server``, the lock collection as a viewer reaches it (through the proxy) and as
    the holders do (directly)."""
    port = int(server.uri.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = CuttableProxy(port)
    await proxy.start()
    viewer: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        f"mongodb://127.0.0.1:{proxy.port}/?directConnection=true", serverSelectionTimeoutMS=1500,
        connectTimeoutMS=1000, serverMonitoringMode="poll", heartbeatFrequencyMS=500,
    )  # fmt: skip
    holder: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
    try:
        yield proxy, viewer.mongolock.locks, holder.mongolock.locks
    finally:
        await viewer.close()
        await holder.close()


async def cut_for_a_while(proxy: CuttableProxy, locks: Any) -> AsyncMongoLock:
    """Cut the viewer off for ``OUTAGE`` seconds while "ledger" is renewed by its holder and
    "crashed" expires for real (its holder died before the cut); return the held lock's handle."""
    # Renewed every 0.25 s, not every TTL / 3: each renewal has 1.5 s for its round trip.
    ledger = AsyncMongoLock(locks, "ledger", ttl=TTL, heartbeat=0.25, label="keeper")
    assert await ledger.acquire()
    crashed = AsyncMongoLock(locks, "crashed", ttl=TTL, label="died")
    assert await crashed.acquire()
    crashed._forget_lease()
    await asyncio.sleep(0.3)
    await proxy.cut()
    await asyncio.sleep(OUTAGE)
    assert not ledger.lost.is_set(), "the holder kept its lease throughout"
    await proxy.start()
    return ledger


@pytest.mark.timing(margin=1.5)  # the holder's 2 s lease renewed every 0.25 s through the cut
async def test_a_view_cut_off_from_mongodb_keeps_the_last_state_stale_and_invents_no_expiry() -> None:
    updates: list[tuple[ViewUpdate, BaseException | None]] = []
    with EmbeddedMongo() as server:
        async with viewer_and_holder(server) as (proxy, viewed, locks):
            async with LockWatch(viewed, max_await=0.5) as watch:

                async def follow() -> None:
                    async for update in watch:
                        updates.append((update, watch.last_error))

                following = asyncio.create_task(follow())
                try:
                    ledger = await cut_for_a_while(proxy, locks)
                    def back() -> bool:
                        return bool(
                            updates and updates[-1][0].disconnected_since is None
                            and any(u.disconnected_since for u, _ in updates)
                            and any(e.event == "expired" and e.name == "crashed" for u, _ in updates for e in u.events)
                        )

                    async with asyncio.timeout(30):
                        while not back():  # noqa: ASYNC110 - the updates are the follower's
                            await asyncio.sleep(0.1)
                finally:
                    following.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await following
                assert await ledger.release()
    cut = [(update, error) for update, error in updates if update.disconnected_since is not None]
    assert cut, "the view said it was cut off"
    update, error = cut[-1]
    assert error is not None, "the operator gets the driver's error"
    assert update.note is not None and "MongoDB" in update.note, update.note
    assert str(proxy.port) not in update.note and "127.0.0.1" not in update.note and "Topology" not in update.note
    assert all(u.locks["ledger"].status == "held" for u, _ in cut), "the last known state, not expired"
    events = [(event.event, event.name) for update, _ in updates for event in update.events]
    assert ("expired", "ledger") not in events and ("lost", "ledger") not in events, events
    crashed = [(event.event, event.at) for u, _ in updates for event in u.events if event.name == "crashed"]
    assert [event for event, _ in crashed] == ["acquired", "expired"], "a real expiry is still told, once back"
    assert isinstance(crashed[1][1], datetime) and crashed[1][1] > crashed[0][1]
    last = updates[-1][0]
    assert last.locks["ledger"].held and last.locks["ledger"].holders[0].label == "keeper"


@pytest.mark.timing(margin=1.5)  # the holder's 2 s lease renewed every 0.25 s through the cut
async def test_the_dashboard_says_disconnected_keeps_its_timeline_and_redacts_the_cause() -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    messages: list[dict[str, Any]] = []
    with EmbeddedMongo() as server:
        async with viewer_and_holder(server) as (proxy, viewed, locks):
            dashboard = Dashboard(viewed)
            try:
                async with TestServer(dashboard.aiohttp_app()) as web, ClientSession() as session:
                    events = await session.get(web.make_url("/events"))

                    async def read() -> None:
                        while line := (await events.content.readline()).decode():
                            if line.startswith("data: "):
                                messages.append(json.loads(line[len("data: ") :]))

                    reading = asyncio.create_task(read())
                    try:
                        ledger = await cut_for_a_while(proxy, locks)
                        def back() -> bool:
                            cut = any(message.get("disconnected_since") for message in messages)
                            return cut and messages[-1].get("disconnected_since") is None

                        async with asyncio.timeout(30):
                            while not back():  # noqa: ASYNC110 - the messages are the reader's
                                await asyncio.sleep(0.1)
                            await asyncio.sleep(1.0)
                        state = await (await session.get(web.make_url("/state.json"))).json()
                    finally:
                        reading.cancel()
                        events.close()
                    assert await ledger.release()
            finally:
                await dashboard.aclose()
    told = json.dumps(messages)
    assert str(proxy.port) not in told and "Topology" not in told, "no host or topology reaches a viewer"
    cut = [message for message in messages if message.get("disconnected_since")]
    assert cut and all(message["note"] and "MongoDB" in message["note"] for message in cut), cut
    assert not [event for message in messages for event in message.get("events", [])
                if event["name"] == "ledger" and event["event"] in ("expired", "lost")]  # fmt: skip
    segments = state["timeline"]["ledger"]["segments"]
    assert len(segments) == 1 and segments[0]["end"] is None, segments
    assert state["disconnected_since"] is None
