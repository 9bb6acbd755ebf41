"""Other applications' text (lock names, labels, hosts, job errors) reaches operators inertly: every
human-facing rendering of the command shows controls, C1 controls, escape sequences and bidi
overrides escaped, rich never reads a cell as markup, JSON keeps the text exact without sending
those characters raw; and one odd job document is shown as such, never stopping a view."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoJob, AsyncMongoLock
from mongolock_async._util.inert import json_text, printable, shell_word
from mongolock_async.dashboard import Dashboard
from mongolock_async.live import LockWatch
from mongolock_async.operations import inspect_lock, list_locks
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.run_settings import child_environment
from tests.support.terminal import on_a_terminal

# A name that clears the screen and retitles the terminal, a label with a C1 CSI (red text on a
# terminal that reads C1) and a bidi override (shows "exe.txt"), and a host with a blink sequence.
NAME = "orders\x1b[2J\x1b]0;title\x07"
LABEL = "\x9b31mred\u202etxt.exe"
HOST = "host\x1b[5m"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def mongolock(*arguments: str, stdin: Any = None, **environment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mongolock_async", *arguments],
        capture_output=True, text=True, env=child_environment(**environment), stdin=stdin, timeout=120,
    )  # fmt: skip


def assert_inert(output: str) -> None:
    """Every line is printable: no control, C1 control or bidi override reached the terminal."""
    for line in output.splitlines():
        assert line.isprintable(), repr(line)


@contextlib.asynccontextmanager
async def collection_of(uri: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A fresh lock collection and the command's options naming it."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    name = f"inert_{uuid.uuid4().hex[:8]}"
    try:
        yield client[TEST_DATABASE][name], ["--uri", uri, "--db", TEST_DATABASE, "--collection", name]
    finally:
        await client[TEST_DATABASE].drop_collection(name)
        await client.close()


async def hold_evil_lock(collection: Any) -> AsyncMongoLock:
    lock = AsyncMongoLock(collection, NAME, ttl=120, label=LABEL)
    assert await lock.acquire(blocking=False)
    await collection.update_one({"_id": NAME}, {"$set": {"holder.host": HOST}})
    return lock


def test_printable_escapes_what_is_not_printable_and_nothing_else() -> None:
    assert printable(NAME) == "orders\\x1b[2J\\x1b]0;title\\x07"
    assert printable(LABEL) == "\\x9b31mred\\u202etxt.exe"
    assert printable("tab\there\nzero\u200bwidth\U000e0001 caf\u00e9 \u4e2d") == (
        "tab\\there\\nzero\\u200bwidth\\U000e0001 caf\u00e9 \u4e2d"
    )
    assert printable(printable(NAME)) == printable(NAME), "idempotent: each output may apply it again"
    value = {"name": NAME, "label": LABEL, "beyond": "\U000e0001"}
    for indent in (None, 2):
        text = json_text(value, indent=indent)
        assert json.loads(text) == value and not any(raw in text for raw in RAW), text
    assert shell_word("plain-name") == "plain-name" and shell_word("it's") == "'it'\"'\"'s'"
    assert shell_word(NAME).isprintable() and shell_word(NAME).startswith("$'")


async def test_list_inspect_and_json_show_names_labels_and_hosts_inertly(mongolock_uri: str) -> None:
    async with collection_of(mongolock_uri) as (collection, where):
        lock = await hold_evil_lock(collection)
        table = mongolock("list", *where)
        detail = mongolock("inspect", NAME, *where)
        listed = mongolock("list", "--json", *where)
        inspected = mongolock("inspect", NAME, "--json", *where)
        assert await lock.release()
    for result in (table, detail, listed, inspected):
        assert result.returncode == 0, result.stderr
    for human in (table.stdout, detail.stdout):
        assert_inert(human)
        assert printable(NAME) in human
    assert printable(LABEL) in detail.stdout and printable(HOST) in detail.stdout
    (row,) = [line for line in table.stdout.splitlines() if line.startswith("orders")]
    assert row.split()[:2] == [printable(NAME), "held"], row
    for machine in (listed.stdout, inspected.stdout):
        assert not any(raw in machine for raw in RAW), "JSON sends them escaped"
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == NAME and entry["holder"]["label"] == LABEL and entry["holder"]["host"] == HOST
    assert json.loads(inspected.stdout)["name"] == NAME, "the text is exact"


async def test_the_confirmation_of_a_forced_release_cannot_be_redrawn_by_a_label(mongolock_uri: str) -> None:
    async with collection_of(mongolock_uri) as (collection, where):
        lock = await hold_evil_lock(collection)
        controller, terminal = os.openpty()
        try:
            os.write(controller, b"n\n")
            result = mongolock("release", NAME, "--force", *where, stdin=terminal)
        finally:
            os.close(controller)
            os.close(terminal)
        assert await lock.release(), "declined: nothing was broken"
    assert result.returncode == 1 and "About to break the lease of" in result.stdout, result.stdout + result.stderr
    assert_inert(result.stdout)
    assert printable(LABEL) in result.stdout and printable(NAME) in result.stdout


MARKUP = ["tenant[acme]:sync", "ops[/]x", "[link=https://evil.example]click[/link]", "[bold red]loud[/]"]


async def test_rich_reads_cells_as_text_never_as_markup(mongolock_uri: str) -> None:
    async with collection_of(mongolock_uri) as (collection, where):
        locks = [AsyncMongoLock(collection, name, ttl=120, label=f"by {name}") for name in MARKUP]
        for lock in locks:
            assert await lock.acquire(blocking=False)
        evil = await hold_evil_lock(collection)
        raw = on_a_terminal(["list", *where])
        for lock in [*locks, evil]:
            assert await lock.release()
    text = raw.decode()
    assert "Traceback" not in text and "MarkupError" not in text
    assert "\x1b]8;" not in text, "no hidden hyperlink (OSC 8)"
    assert "─" in text, "rich drew the table"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich's own colours
    for name in MARKUP:
        assert name in shown, name
    assert printable(NAME) in shown and "\x1b[2J" not in text and "\x9b" not in text and "\u202e" not in text


async def test_watch_lines_and_json_are_inert_and_exact(mongolock_uri: str) -> None:
    async with collection_of(mongolock_uri) as (collection, where):
        lock = await hold_evil_lock(collection)
        lines = {}
        for mode in ("--plain", "--json"):
            watch = subprocess.Popen(  # noqa: ASYNC220 - read in a thread below
                [sys.executable, "-m", "mongolock_async", "watch", mode, *where],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(),
            )  # fmt: skip
            assert watch.stdout is not None
            lines[mode] = await asyncio.wait_for(asyncio.to_thread(watch.stdout.readline), 30)
            watch.send_signal(signal.SIGINT)
            await asyncio.to_thread(watch.communicate, timeout=15)
        assert await lock.release()
    assert_inert(lines["--plain"].rstrip("\n"))
    assert printable(NAME) in lines["--plain"] and printable(LABEL) in lines["--plain"]
    assert not any(raw in lines["--json"] for raw in RAW)
    held = json.loads(lines["--json"])
    assert held["name"] == NAME and held["holder"]["label"] == LABEL and held["holder"]["host"] == HOST


# -- one odd job document ----------------------------------------------------------------------------


async def odd_jobs(collection: Any) -> AsyncMongoLock:
    """A lock in use (its handle, which the caller keeps), a job whose ``job.every`` was corrupted,
    and a job whose ``min_interval`` is 3e11 s, whose next run is after the year 9999 (the library
    refuses to store more than a year and a day since issue 36: a record written by another writer,
    or an older version, can still hold it)."""
    fine = AsyncMongoLock(collection, "fine", ttl=120, label="worker")
    assert await fine.acquire(blocking=False)
    distant = AsyncMongoJob(collection, "distant", min_interval=60, ttl=10)
    assert (await distant.run(asyncio.sleep, 0)).ran
    await collection.update_one({"_id": "distant"}, {"$set": {"job.minInterval": int(3e11 * 1000)}})
    corrupt = AsyncMongoJob(collection, "corrupt", every=60, ttl=10)
    assert (await corrupt.run(asyncio.sleep, 0)).ran
    await collection.update_one({"_id": "corrupt"}, {"$set": {"job.every": 2**62}})
    return fine


async def test_an_odd_job_document_is_shown_as_such_and_hides_nothing(mongolock_uri: str) -> None:
    async with collection_of(mongolock_uri) as (collection, where):
        fine = await odd_jobs(collection)
        infos = {info.name: info for info in await list_locks(collection)}
        inspected = await inspect_lock(collection, "distant")
        async with LockWatch(collection) as watch:
            watched = dict(watch.locks)
        dashboard = Dashboard(collection)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=dashboard), base_url="http://127.0.0.1"
            ) as client:
                state = (await client.get("/state.json")).json()
        finally:
            await dashboard.aclose()
        table = mongolock("list", *where)
        listed = mongolock("list", "--json", *where)
        detail = mongolock("inspect", "corrupt", *where)
        assert await fine.release()
    for seen in (infos, watched):
        assert seen["fine"].status == "held"
        assert seen["corrupt"].status == seen["distant"].status == "unreadable"
        assert seen["corrupt"].error is not None and "'job'" in str(seen["corrupt"].error)
    assert inspected is not None and inspected.status == "unreadable" and "OverflowError" in str(inspected.error)
    assert state["type"] == "snapshot", state
    assert {lock["name"]: lock["status"] for lock in state["locks"]} == {
        "fine": "held", "corrupt": "unreadable", "distant": "unreadable"
    }  # fmt: skip
    for result in (table, listed, detail):
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[1:]}
    assert rows == {"corrupt": "unreadable", "distant": "unreadable", "fine": "held"}, table.stdout
    assert {entry["name"]: entry["state"] for entry in json.loads(listed.stdout)}["fine"] == "held"
    assert "state     unreadable" in detail.stdout and "job" in detail.stdout
