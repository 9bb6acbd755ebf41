"""``mongolock watch``: the screen a person sees on a terminal (a pseudo-terminal read through a
terminal emulator), and the lines a pipe gets."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyte
import pytest
from pymongo import AsyncMongoClient, MongoClient

from mongolock_async import AsyncMongoLock
from mongolock_async._cli.watch_view import event_line, printable
from mongolock_async.live import LockEvent
from mongolock_async.operations import Holder
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.run_settings import child_environment

COLUMNS, LINES = 120, 30


class Terminal:
    """A pseudo-terminal running ``mongolock watch``, and the screen it draws."""

    def __init__(self, arguments: list[str]) -> None:
        controller, terminal = os.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mongolock_async", "watch", *arguments],
            stdin=terminal, stdout=terminal, stderr=terminal,
            env=child_environment(TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(LINES)),
        )  # fmt: skip
        os.close(terminal)
        self.controller = controller
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""

    def read(self, seconds: float) -> None:
        ready, _, _ = select.select([self.controller], [], [], seconds)
        if ready:
            with contextlib.suppress(OSError):  # the child closed the terminal
                data = os.read(self.controller, 65536)
                self.raw += data
                self.stream.feed(data)

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, condition: Callable[[str], bool], within: float = 15.0) -> str:
        give_up_at = time.monotonic() + within
        while not condition(self.text):
            assert self.process.poll() is None, f"watch ended (exit {self.process.returncode}):\n{self.text}"
            assert time.monotonic() < give_up_at, f"not on the screen within {within} s:\n{self.text}"
            self.read(0.1)
        return self.text

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.controller)


@contextlib.contextmanager
def on_a_terminal(arguments: list[str]) -> Iterator[Terminal]:
    terminal = Terminal(arguments)
    try:
        yield terminal
    finally:
        terminal.close()


@pytest.fixture
def scratch_collection(mongolock_admin_client: MongoClient[dict[str, Any]]) -> Iterator[str]:
    """The name of a collection of the test database, dropped after the test."""
    name = f"watched_{uuid.uuid4().hex[:8]}"
    yield name
    mongolock_admin_client[TEST_DATABASE].drop_collection(name)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def hold(uri: str, collection: str, name: str, label: str, *, ttl: float = 60.0) -> AsyncMongoLock:
    """Take ``name`` and leave it held, as a process still running elsewhere would."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE][collection], name, ttl=ttl, label=label)
        assert await lock.acquire(blocking=False)
        lock._forget_lease()
        return lock
    finally:
        await client.close()


async def release_by_force(uri: str, collection: str, name: str) -> None:
    from mongolock_async.operations import force_release, inspect_lock

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        info = await inspect_lock(client[TEST_DATABASE][collection], name)
        assert info is not None and info.holders[0].owner is not None
        broken = await force_release(client[TEST_DATABASE][collection], name, holder=info.holders[0].owner)
        assert broken is not None
    finally:
        await client.close()


def test_the_screen_shows_holders_and_events_as_they_happen(mongolock_uri: str, scratch_collection: str) -> None:
    collection = scratch_collection
    run(hold(mongolock_uri, collection, "stock:tea", "shop-1"))
    where = ["--uri", mongolock_uri, "--db", TEST_DATABASE, "--collection", collection]
    with on_a_terminal(where) as terminal:
        screen = terminal.wait_for(lambda text: "stock:tea" in text and "shop-1" in text)
        assert "change stream" in screen.splitlines()[0]
        (row,) = [line for line in screen.splitlines() if line.startswith("stock:tea")]
        assert row.split()[1:3] == ["lock", "held"] and "█" in row and " s " in row + " ", row

        # Rich markup in a name is text on the screen, never styling.
        marked = "[bold red]x[/bold red]"
        run(hold(mongolock_uri, collection, marked, "[link=http://example.com]y[/link]"))
        screen = terminal.wait_for(lambda text: "acquired" in text and marked in text)
        (row,) = [line for line in screen.splitlines() if "lock" in line.split() and "stock:tea" not in line]
        assert row.startswith(marked) and "[link=http://example.com]" in row, row

        run(release_by_force(mongolock_uri, collection, "stock:tea"))
        screen = terminal.wait_for(lambda text: "forced" in text)
        (event,) = [line for line in screen.splitlines() if "forced" in line]
        assert "stock:tea" in event and "shop-1" in event and "broken by a forced release" in event
        (row,) = [line for line in screen.splitlines() if line.startswith("stock:tea")]
        assert "force-released" in row and "█" not in row, row

        terminal.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert terminal.process.wait(timeout=15) == 0
        terminal.read(0.5)
    assert b"\x1b[?1049l" in terminal.raw, "the terminal's own screen is back"
    assert b"Traceback" not in terminal.raw


@pytest.mark.timing(margin=1.2)  # the short lease's acquire, on a fresh client, answered within 1.35 s
def test_piped_it_prints_one_json_object_per_event(mongolock_uri: str, scratch_collection: str) -> None:
    collection = scratch_collection
    run(hold(mongolock_uri, collection, "report", "nightly"))
    watch = subprocess.Popen(
        [sys.executable, "-m", "mongolock_async", "watch", "--json", "--uri", mongolock_uri, "--db", TEST_DATABASE,
         "--collection", collection],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(),
    )  # fmt: skip
    assert watch.stdout is not None
    try:
        held = json.loads(watch.stdout.readline())
        assert (held["event"], held["name"], held["holder"]["label"]) == ("held", "report", "nightly")
        # Never released nor renewed. 1.5 s: its acquire, on a fresh client, must be answered before the
        # lease's local deadline (0.27 s of a 0.3 s TTL, which a loaded machine's server could miss).
        run(hold(mongolock_uri, collection, "short", "crashed", ttl=1.5))
        seen = [json.loads(watch.stdout.readline()) for _ in range(2)]
    finally:
        watch.send_signal(signal.SIGTERM)
        _, err = watch.communicate(timeout=15)
    assert [(line["event"], line["name"], line["holder"]["label"]) for line in seen] == [
        ("acquired", "short", "crashed"),
        ("expired", "short", "crashed"),
    ]
    assert seen[1]["at"] == seen[1]["holder"]["expires_at"], "expired at its expiry, on the server's clock"
    assert watch.returncode == 0 and err == "", err


def test_a_line_cannot_be_broken_or_styled_by_a_name() -> None:
    moment = time_now()
    holder = Holder("0" * 48, "vm", 1, "a\nb", 5, moment, moment, moment, 1000)
    event = LockEvent(moment, "acquired", "evil\x1b[2J\nname", "lock", holder, None, 5)
    line = event_line(event, as_json=False)
    assert "\n" not in line and "\x1b" not in line and "evil\\x1b[2J\\nname" in line
    assert printable("tab\there") == "tab\\there"
    assert json.loads(event_line(event, as_json=True))["name"] == "evil\x1b[2J\nname"


def time_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


async def test_narrow_screens_shorten_the_holder_never_a_token(pymongo_collection: Any) -> None:
    import io

    from rich.console import Console

    from mongolock_async._cli.watch_view import screen
    from mongolock_async.live import LockWatch

    held = [
        AsyncMongoLock(pymongo_collection, "orders:nightly-export-of-every-region", ttl=30, label="x" * 40),
        AsyncMongoLock(pymongo_collection, "stock:tea", ttl=30, label="shop-1"),
    ]
    for lock in held:
        assert await lock.acquire()
    try:
        async with LockWatch(pymongo_collection) as watch:
            update = await anext(aiter(watch))
            tokens = [str(info.fencing_token) for info in update.locks.values()]
            for width in (80, 100, 120, 160):
                console = Console(file=io.StringIO(), width=width, height=30, record=True)
                console.print(screen(update, [], watch, width, 30, held_only=False))
                text = console.export_text()
                assert all(len(line) <= width for line in text.splitlines()), text
                assert all(token in text for token in tokens), f"a token was cut at {width} columns:\n{text}"
                assert "stock:tea" in text and "█" in text, text
    finally:
        for lock in held:
            await lock.release()
