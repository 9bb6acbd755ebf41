"""The views at 1,000, 10,000 and 100,000 locks, each against reading the same documents with the
raw driver.

    .venv/bin/python benchmarks/view_scale.py [--sizes 1000 10000 100000]

For each size, a fresh embedded server gets that many lock documents, shaped as the library writes
them (one held in three, the others released), with ``insert_many``: the embedded server's
``findAndModify`` scans the collection, so seeding 100,000 locks through the library would take
hours. Then, each figure next to its raw counterpart:

- ``mongolock list --json`` (its output to /dev/null): wall time and peak memory (the process's
  ``ru_maxrss``), against a raw-driver script that reads the same documents (``find().sort(_id)``,
  a batch at a time) and writes each as JSON;
- the dashboard (``mongolock dashboard``, a process of its own): the first page's bytes (the
  default window of ``/state.json``) against all the documents as JSON (what a page got when it was
  sent the whole collection); the time to first paint in Debian's chromium (from navigation start to
  the first row drawn) of the first page (its view opens: it reads every document) and of a second
  page (the view open), against the raw driver's read of every document; the bytes a page gets for
  a write inside its window and for one outside it, against the change event a raw change stream
  delivers for the same write; and the dashboard process's memory (VmRSS once its pages are open)
  against a raw script holding every document (``find().to_list()``).

Writes benchmarks/charts/view_scale.json; ``plots.py`` draws view_scale.svg from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from _common import environment  # benchmarks/ is on sys.path when this runs as a script
from pymongo import AsyncMongoClient, MongoClient

from mongolock_async.testing import EmbeddedMongo

CHARTS = Path(__file__).parent / "charts"
DATABASE, COLLECTION = "scale", "locks"
# A raw reader of the same documents: streamed as JSON (as `list --json` streams), or held whole.
RAW_READ = """
import json, os, sys, time
from pymongo import MongoClient
collection = MongoClient(sys.argv[1])[sys.argv[2]][sys.argv[3]]
started, written = time.perf_counter(), 0
with open(os.devnull, "w") as out:
    if sys.argv[4] == "stream":
        for document in collection.find().sort("_id", 1).batch_size(1000):
            text = json.dumps(document, default=str)
            written += len(text.encode()) + 1
            out.write(text + "\\n")
    else:
        held = collection.find().to_list()
        written = len(held)
print(json.dumps({"seconds": time.perf_counter() - started, "bytes": written}))
"""


def seed(uri: str, count: int) -> None:
    """``count`` lock documents as the library writes them, named ``order:0000000`` on."""
    now = datetime.now(UTC)
    with MongoClient(uri) as client:
        collection = client[DATABASE][COLLECTION]
        batch = []
        for index in range(count):
            held = index % 3 == 0
            batch.append({
                "_id": f"order:{index:07d}",
                "owner": secrets.token_hex(24) if held else None,
                "expiresAt": now + timedelta(hours=1) if held else now,
                "fence": 1_796_000_000_000_000 + index,
                "ttlMs": 30_000,
                "holder": {"host": "worker-host", "pid": 4000 + index % 50, "label": f"worker-{index % 50}"},
                "acquiredAt": now,
                "renewedAt": now,
                **({} if held else {"releasedAt": now}),
                "queue": [],
            })  # fmt: skip
            if len(batch) == 5000:
                collection.insert_many(batch)
                batch = []
        if batch:
            collection.insert_many(batch)


def measured(command: list[str]) -> tuple[float, float, str]:
    """Run ``command``: its wall time (s), its peak memory (MB) and what it printed. The peak is the
    child's ``VmHWM`` after its ``exec``, sampled every 10 ms until it ends: ``ru_maxrss`` would
    count the pages of this process that the child had before its ``exec``."""
    with tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True)
        peak = 0.0
        while process.poll() is None:
            peak = max(peak, _high_water(process.pid))
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"{command[:4]} failed: {process.stderr.read() if process.stderr else ''}")
        out.seek(0)
        return seconds, peak, out.read()


def _high_water(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it has just ended
        return 0.0
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else 0.0


def list_figures(uri: str) -> dict[str, Any]:
    where = ["--uri", uri, "--db", DATABASE, "--collection", COLLECTION]
    seconds, memory, _ = measured([sys.executable, "-m", "mongolock_async", "list", "--json", *where])
    raw_seconds, raw_memory, out = measured([sys.executable, "-c", RAW_READ, uri, DATABASE, COLLECTION, "stream"])
    _, held_memory, _ = measured([sys.executable, "-c", RAW_READ, uri, DATABASE, COLLECTION, "hold"])
    raw = json.loads(out)
    return {
        "list_json_s": seconds, "list_json_mb": memory,
        "raw_stream_s": raw_seconds, "raw_stream_mb": raw_memory, "raw_json_bytes": raw["bytes"],
        "raw_hold_mb": held_memory,
    }  # fmt: skip


async def first_paint(browser: Any, url: str) -> float:
    """Milliseconds from a page's navigation start to its first row drawn."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        await page.goto(url, wait_until="commit")
        await page.wait_for_selector("#locks tbody tr", timeout=900_000)
        return float(await page.evaluate("performance.now()"))
    finally:
        await context.close()


async def update_bytes(uri: str, url: str) -> dict[str, Any]:
    """The bytes a page (the default window) gets for a write in its window and for one outside it,
    and the change event a raw change stream gets for the same write."""
    from aiohttp import ClientSession

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    collection = client[DATABASE][COLLECTION]
    figures: dict[str, Any] = {}
    try:
        async with ClientSession() as session, session.get(url + "events") as events:
            snapshot = await _message(events)
            names = json.loads(snapshot)["names"]
            last = (await collection.find({}, {"_id": 1}).sort("_id", -1).limit(1).to_list(1))[0]["_id"]
            async with await collection.watch(full_document="updateLookup") as stream:
                for where, name in (("inside", names[1]), ("outside", last)):
                    await collection.update_one({"_id": name}, {"$set": {"holder.label": f"bench-{where}"}})
                    event = await stream.next()
                    figures[f"raw_event_bytes_{where}"] = len(json.dumps(event, default=str).encode())
                    try:
                        message = await asyncio.wait_for(_message(events), 5.0)
                    except TimeoutError:
                        message = ""
                    figures[f"update_bytes_{where}"] = len(message.encode())
    finally:
        await client.close()
    return figures


async def _message(events: Any) -> str:
    while True:
        line = (await events.content.readline()).decode()
        if line.startswith("data: "):
            return line[len("data: ") :].rstrip("\n")


def memory_of(pid: int) -> float:
    """A process's resident memory now, MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


async def dashboard_figures(uri: str) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    server = subprocess.Popen(  # noqa: ASYNC220 - started once; its first line is read below
        [sys.executable, "-m", "mongolock_async", "dashboard", "--port", "0", "--uri", uri, "--db", DATABASE,
         "--collection", COLLECTION],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        match = re.search(r"at (http://\S+/) ", server.stdout.readline())
        assert match, "the dashboard did not start"
        url = match.group(1)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        async with async_playwright() as playwright:
            flags = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
            browser = await playwright.chromium.launch(executable_path=chromium, headless=True, args=flags)
            try:
                cold = await first_paint(browser, url)  # the view opens: it reads every document
                warm = await first_paint(browser, url)
            finally:
                await browser.close()
        async with httpx.AsyncClient(timeout=600) as http:
            first_page = len((await http.get(url + "state.json")).content)
        figures = {"first_paint_cold_ms": cold, "first_paint_warm_ms": warm, "first_page_bytes": first_page}
        figures.update(await update_bytes(uri, url))
        figures["dashboard_mb"] = memory_of(server.pid)
        return figures
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    arguments = parser.parse_args()
    print(environment(None, "views at scale"))
    runs = []
    for size in arguments.sizes:
        with EmbeddedMongo() as server:
            started = time.perf_counter()
            seed(server.uri, size)
            seeded = time.perf_counter() - started
            figures = {"locks": size, "seed_s": seeded, **list_figures(server.uri)}
            figures.update(asyncio.run(dashboard_figures(server.uri)))
        runs.append(figures)
        print(
            f"{size:>7,} locks | list --json {figures['list_json_s']:6.2f} s {figures['list_json_mb']:5.0f} MB | raw "
            f"read {figures['raw_stream_s']:6.2f} s {figures['raw_stream_mb']:5.0f} MB (held whole "
            f"{figures['raw_hold_mb']:5.0f} MB) | first page {figures['first_page_bytes']:>7,} B against "
            f"{figures['raw_json_bytes']:>11,} B of documents | first paint {figures['first_paint_cold_ms']:8.0f} ms "
            f"cold, {figures['first_paint_warm_ms']:6.0f} ms warm | update {figures['update_bytes_inside']:>5,} B in "
            f"view, {figures['update_bytes_outside']} B out (raw event {figures['raw_event_bytes_inside']:,} B) | "
            f"dashboard {figures['dashboard_mb']:5.0f} MB",
            flush=True,
        )
    CHARTS.mkdir(exist_ok=True)
    (CHARTS / "view_scale.json").write_text(json.dumps({"environment": environment(None), "runs": runs}, indent=2))
    print(f"wrote {CHARTS / 'view_scale.json'}")


if __name__ == "__main__":
    main()
