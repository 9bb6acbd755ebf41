"""The pictures of docs/live.md: the dashboard in headless chromium at 1280 pixels wide, and
``mongolock watch``'s screen as SVG, of a collection where a few processes contend for a lock, a
semaphore, a read-write lock and an election.

    make screenshots        # or: .venv/bin/python docs/screenshots.py [--seconds 40]

Starts an embedded server (SecantusDB) and four worker processes (this script with ``--worker``),
lets them run for ``--seconds`` so that the timeline has some history, then writes
docs/images/dashboard.png and docs/images/watch.svg. Needs the dev extra and Debian's chromium
(Playwright drives it; it never downloads a browser). ``make docs`` does not run it: the docs
build stays offline and fast, and the pictures are committed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection, AsyncMongoLock, AsyncMongoRWLock, AsyncMongoSemaphore
from mongolock_async.live import LockEvent, LockWatch

IMAGES = Path(__file__).parent / "images"
DATABASE, COLLECTION = "shop", "locks"
WORKERS = 4
WIDTH, HEIGHT = 1280, 860


# -- the workers: each process holds, waits and hands off --------------------------------------


async def work(uri: str, index: int) -> None:
    """One worker process's tasks, forever: each contends for one primitive."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[DATABASE][COLLECTION]
    label = f"worker-{index}"
    rng = random.Random(index)

    async def export() -> None:  # one holder, the other processes queue: hand-offs
        lock = AsyncMongoLock(collection, "orders:nightly-export", ttl=15, label=label)
        while True:
            async with lock:
                await asyncio.sleep(rng.uniform(3, 6))
            await asyncio.sleep(rng.uniform(0.2, 1.0))

    async def render() -> None:  # two permits for four processes
        semaphore = AsyncMongoSemaphore(collection, "pdf-render", limit=2, ttl=15, label=label)
        while True:
            async with semaphore:
                await asyncio.sleep(rng.uniform(2, 5))
            await asyncio.sleep(rng.uniform(0.5, 2.0))

    async def catalog() -> None:  # three readers, one writer now and then
        rwlock = AsyncMongoRWLock(collection, "catalog", ttl=15, label=label)
        while True:
            if index == 0:
                await asyncio.sleep(rng.uniform(6, 9))
                async with rwlock.write():
                    await asyncio.sleep(1.5)
            else:
                async with rwlock.read():
                    await asyncio.sleep(rng.uniform(2, 4))
                await asyncio.sleep(rng.uniform(0.2, 1.0))

    async def scheduler() -> None:  # a leader that steps down now and then, handing over
        election = AsyncMongoElection(collection, "scheduler", ttl=10, label=label)
        while True:
            await election.campaign()
            await asyncio.sleep(rng.uniform(8, 12))
            await election.resign()
            await asyncio.sleep(1.0)

    async def stock() -> None:  # short critical sections on a few names
        while True:
            name = f"stock:sku-{rng.choice([1042, 2210, 3307])}"
            async with AsyncMongoLock(collection, name, ttl=10, label=label):
                await asyncio.sleep(rng.uniform(0.05, 0.3))
            await asyncio.sleep(rng.uniform(1, 4))

    async def warmup() -> None:  # a lease left to expire, as a holder that died would
        kept = []
        while True:
            lock = AsyncMongoLock(collection, "cache:warmup", ttl=6, label=label)
            if await lock.acquire(blocking=False):
                kept.append(lock)  # never released: it expires on the server
            await asyncio.sleep(rng.uniform(10, 16))

    tasks = [export(), render(), catalog(), scheduler(), stock()]
    if index == 1:
        tasks.append(warmup())
    await asyncio.gather(*tasks)


# -- the pictures -------------------------------------------------------------------------------


async def pictures(uri: str, seconds: float) -> None:
    import uvicorn
    from playwright.async_api import async_playwright
    from rich.console import Console

    from mongolock_async._cli.watch_view import EVENTS_SHOWN, screen
    from mongolock_async.dashboard import Dashboard

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[DATABASE][COLLECTION]
    opened = AsyncMongoLock(collection, "opened", ttl=1)
    assert await opened.acquire() and await opened.release()
    await collection.delete_one({"_id": "opened"})
    command = [sys.executable, __file__, "--uri", uri, "--worker"]
    workers = [subprocess.Popen([*command, str(index)]) for index in range(WORKERS)]  # noqa: ASYNC220 - no wait
    dashboard = Dashboard(collection, title="shop locks")
    server = uvicorn.Server(uvicorn.Config(dashboard, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve())
    try:
        async with LockWatch(collection) as watch:
            events: deque[LockEvent] = deque(maxlen=EVENTS_SHOWN)

            async def follow() -> None:
                async for update in watch:
                    events.extend(update.events)
                    latest[:] = [update]

            latest: list[Any] = []
            following = asyncio.ensure_future(follow())
            while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
                await asyncio.sleep(0.05)
            port = server.servers[0].sockets[0].getsockname()[1]
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=_chromium(), headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                page = await browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                await page.goto(f"http://127.0.0.1:{port}/")  # opened now: the timeline starts here
                print(f"letting the workers run for {seconds:g} s", flush=True)
                await asyncio.sleep(seconds)
                await page.wait_for_function("document.querySelectorAll('#locks tbody tr.held').length >= 4")
                await asyncio.sleep(0.5)  # a bar's fill follows each quarter second
                IMAGES.mkdir(exist_ok=True)
                await page.screenshot(path=str(IMAGES / "dashboard.png"), full_page=False)
                await browser.close()

            console = Console(
                file=io.StringIO(), record=True, width=118, height=30, force_terminal=True, color_system="truecolor"
            )
            console.print(screen(latest[-1], events, watch, console.width, console.height, held_only=False))
            # rich's SVG names a font on a CDN as well as the local one: the docs load nothing from elsewhere.
            svg = console.export_svg(title="mongolock watch")
            (IMAGES / "watch.svg").write_text(re.sub(r',\s*url\("https://[^"]*"\) format\("[^"]*"\)', "", svg))
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
    finally:
        server.should_exit = True
        dashboard.close_pages()
        await serving
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=30)
        await client.close()
    for path in (IMAGES / "dashboard.png", IMAGES / "watch.svg"):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("the screenshots need Debian's chromium: apt-get install chromium")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the workers run first (default 40)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # with --uri: one worker process
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker is not None:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # leases left behind end with the server
        logging.getLogger("mongolock_async").setLevel(logging.ERROR)  # the warm-up's leases expire on purpose
        asyncio.run(work(arguments.uri, arguments.worker))
        return
    from mongolock_async.testing import EmbeddedMongo

    with EmbeddedMongo() as server:
        asyncio.run(pictures(server.uri, arguments.seconds))


if __name__ == "__main__":
    main()
