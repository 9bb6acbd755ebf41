"""What the live views cost the deployment: requests and change streams per viewer while locks churn.

    .venv/bin/python benchmarks/view_cost.py [--uri URI] [--seconds 20] [--rate 10]

Viewers are ``LockWatch``es, each on a client of its own (what ``mongolock watch`` runs), and
dashboards (one ``Dashboard`` served by uvicorn with several pages reading its event stream, as
browsers do). A writer takes and releases ten names, ``--rate`` times a second for ``--seconds``
(uncontended: its locks open no change stream of their own), then nothing happens for
``--idle`` seconds. Counted two ways:

- by each viewer's client (PyMongo command monitoring): every command it sent, and how many
  distinct cursors its ``getMore``s read (a change stream is one cursor);
- by the server (``serverStatus``): open cursors in the middle of the churn, and the increase of
  its ``opcounters`` over a run with no viewer (which leaves the writer's own and the drivers'
  monitoring), per viewer.

The embedded server answers a waiting ``getMore`` early, with an empty batch, whenever anything is
written (MongoDB waits for an event of the stream or ``maxAwaitTimeMS``): on it, a viewer's
``getMore``s follow the writes, on MongoDB the event batches; either way one cursor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from _common import environment, mongodb  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient, monitoring

from mongolock_async import AsyncMongoLock
from mongolock_async.dashboard import Dashboard
from mongolock_async.live import LockWatch

NAMES = 10


class Commands(monitoring.CommandListener):
    """The commands one client sent (by name) and the cursors its getMores read, from ``start`` on."""

    def __init__(self) -> None:
        self.counting = False
        self.names: Counter[str] = Counter()
        self.cursors: set[int] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.counting:
            self.names[event.command_name] += 1
            if event.command_name == "getMore":
                self.cursors.add(int(event.command["getMore"]))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def start(self) -> None:
        self.names.clear()
        self.cursors.clear()
        self.counting = True


async def server_status(client: AsyncMongoClient[dict[str, Any]]) -> tuple[Counter[str], int]:
    status = await client.admin.command("serverStatus")
    cursors = status.get("metrics", {}).get("cursor", {}).get("open", {}).get("total", -1)
    return Counter({key: int(value) for key, value in status["opcounters"].items()}), int(cursors)


async def churn(collection: Any, seconds: float, rate: float) -> int:
    """Take and release the names in turn, ``rate`` times a second; the number of cycles."""
    locks = [AsyncMongoLock(collection, f"churn-{index}", ttl=10) for index in range(NAMES)]
    cycles, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        lock = locks[cycles % NAMES]
        assert await lock.acquire()
        assert await lock.release()
        cycles += 1
        await asyncio.sleep(max(0.0, started + cycles / rate - time.monotonic()))
    return cycles


@contextlib.asynccontextmanager
async def watch_viewers(uri: str, collection: str, count: int) -> AsyncIterator[list[tuple[Commands, Counter[str]]]]:
    """``count`` LockWatches, each on a client of its own, each counting the events it is told."""
    viewers: list[tuple[Commands, Counter[str]]] = []
    async with contextlib.AsyncExitStack() as stack:
        tasks = []
        for _ in range(count):
            commands, told = Commands(), Counter[str]()
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[commands])
            stack.push_async_callback(client.close)
            watch = await stack.enter_async_context(LockWatch(client.bench[collection]))

            async def follow(watch: LockWatch = watch, told: Counter[str] = told) -> None:
                async for update in watch:
                    told.update(event.event for event in update.events)

            tasks.append(asyncio.ensure_future(follow()))
            viewers.append((commands, told))
        await asyncio.sleep(1.0)  # every stream open and past its first getMore
        try:
            yield viewers
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def dashboard_viewer(
    uri: str, collection: str, pages: int
) -> AsyncIterator[list[tuple[Commands, Counter[str]]]]:
    """One dashboard (a client of its own) served by uvicorn, with ``pages`` pages reading its events."""
    import uvicorn
    from aiohttp import ClientSession, ClientTimeout

    commands = Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[commands])
    dashboard = Dashboard(client.bench[collection])
    server = uvicorn.Server(uvicorn.Config(dashboard, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve())
    told: list[Counter[str]] = [Counter() for _ in range(pages)]
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]

    async def page(session: ClientSession, seen: Counter[str]) -> None:
        async with session.get(f"http://127.0.0.1:{port}/events") as response:
            async for line in response.content:
                if line.startswith(b"data: "):
                    message = json.loads(line[6:])
                    seen.update(event["event"] for event in message.get("events", ()) if message["type"] == "update")

    session = ClientSession(timeout=ClientTimeout(total=None))
    readers = [asyncio.ensure_future(page(session, seen)) for seen in told]
    await asyncio.sleep(1.5)
    try:
        # The pages share the dashboard's one client: its counts, with the first page's events.
        yield [(commands, told[0])] + [(Commands(), seen) for seen in told[1:]]
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await session.close()
        server.should_exit = True
        dashboard.close_pages()
        await serving
        await client.close()
        for seen in told[1:]:
            assert seen == told[0], "every page is told the same events"


async def run(uri: str, kind: str, count: int, seconds: float, rate: float, idle: float) -> dict[str, Any]:
    admin: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    name = f"view_cost_{kind}_{count}_{time.monotonic_ns()}"
    collection = admin.bench[name]
    warm = AsyncMongoLock(collection, "churn-0", ttl=10)  # the collection exists before anyone watches
    assert await warm.acquire() and await warm.release()
    viewers_of = {"none": watch_viewers, "watch": watch_viewers, "dashboard": dashboard_viewer}[kind]
    try:
        async with viewers_of(uri, name, count) as viewers:
            for commands, _ in viewers:
                commands.start()
            before, _ = await server_status(admin)
            churning = asyncio.ensure_future(churn(collection, seconds, rate))
            await asyncio.sleep(seconds / 2)
            _, open_cursors = await server_status(admin)
            cycles = await churning
            await asyncio.sleep(1.0)  # the last events reach the viewers
            after, _ = await server_status(admin)
            during = [Counter(commands.names) for commands, _ in viewers]
            cursors = [len(commands.cursors) for commands, _ in viewers]
            for commands, _ in viewers:
                commands.start()
            await asyncio.sleep(idle)
            quiet = [Counter(commands.names) for commands, _ in viewers]
            told = [dict(seen) for _, seen in viewers]
    finally:
        await collection.drop()
        await admin.close()
    return {
        "kind": kind,
        "viewers": count,
        "cycles": cycles,
        "open_cursors": open_cursors,
        "server": dict(after - before),
        "during": [dict(counts) for counts in during],
        "cursors": cursors,
        "idle": [dict(counts) for counts in quiet],
        "told": told,
    }


def report(result: dict[str, Any], baseline: dict[str, Any] | None, seconds: float, idle: float) -> str:
    kind, count = result["kind"], result["viewers"]
    label = "no viewer" if kind == "none" else f"{count} x watch" if kind == "watch" else f"dashboard, {count} pages"
    line = f"{label:<22} | {result['cycles']} cycles | open cursors mid-churn {result['open_cursors']:>2}"
    if kind == "none":
        return line + f" | server opcounters {result['server']}"
    clients = result["during"] if kind == "watch" else result["during"][:1]
    streams = result["cursors"] if kind == "watch" else result["cursors"][:1]
    per_client = Counter[str]()
    for counts in clients:
        per_client.update(counts)
    per = {name: round(total / len(clients), 1) for name, total in sorted(per_client.items())}
    idle_getmores = sum(counts.get("getMore", 0) for counts in result["idle"][: len(clients)]) / len(clients)
    told = result["told"][0]
    line += (
        f" | per viewing client during churn {per} | cursors read {sorted(set(streams))}"
        f" | idle getMore/s {idle_getmores / idle:.2f}"
        f" | told released {told.get('released', 0)} acquired {told.get('acquired', 0)}"
    )
    if baseline is not None:
        extra = Counter(result["server"])
        extra.subtract(baseline["server"])
        per_viewer = {key: round(value / len(clients), 1) for key, value in sorted(extra.items()) if value}
        line += f" | server opcounters over no viewer, per viewing client {per_viewer}"
    return line


async def measure(arguments: argparse.Namespace) -> dict[str, Any]:
    with mongodb(arguments.uri) as uri:
        print(environment(arguments.uri), flush=True)
        print(f"churn: {NAMES} names, {arguments.rate:g} acquire+release cycles/s for {arguments.seconds:g} s, "
              f"then {arguments.idle:g} s idle", flush=True)  # fmt: skip
        baseline = await run(uri, "none", 0, arguments.seconds, arguments.rate, arguments.idle)
        print(report(baseline, None, arguments.seconds, arguments.idle), flush=True)
        results = []
        for kind, count in [("watch", 1), ("watch", 4), ("watch", 16), ("dashboard", 1), ("dashboard", 16)]:
            result = await run(uri, kind, count, arguments.seconds, arguments.rate, arguments.idle)
            results.append(result)
            print(report(result, baseline, arguments.seconds, arguments.idle), flush=True)
        return {"baseline": baseline, "runs": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", help="a MongoDB replica set (default: a fresh embedded server)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the locks churn (default 20)")
    parser.add_argument("--rate", type=float, default=10.0, help="acquire+release cycles per second (default 10)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of no writes after (default 10)")
    parser.add_argument("--json", help="also write the figures to this file")
    arguments = parser.parse_args()
    figures = asyncio.run(measure(arguments))
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(figures, indent=1) + "\n")
