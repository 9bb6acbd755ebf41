from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pymongo import monitoring
from pymongo.errors import OperationFailure

from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client, shard

_COMMAND_NOT_FOUND, _UNAUTHORIZED = 59, 13

# The package's pytest plugin (registered by its entry point) provides the mongolock_* fixtures;
# the suite calls them by the shorter names below.


@pytest.fixture(scope="session")
def mongodb_uri(mongolock_uri: str) -> str:
    return mongolock_uri


@pytest.fixture
def driver(mongolock_driver: str) -> str:
    return mongolock_driver


@pytest.fixture
def lock_collection(mongolock_collection: Any) -> Any:
    return mongolock_collection


class CommandCounter(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Records every command a client starts (command monitoring), how many change-stream
    ``getMore``s returned events, and the connections the pool opened and closed (CMAP)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.commands: list[dict[str, Any]] = []
        self.events_delivered = 0
        """``getMore`` replies that carried at least one change event (the embedded server also
        answers idle ones early with empty batches whenever anything is written; MongoDB waits)."""
        self.connections_created = 0
        self.connections_closed = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)
        self.commands.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore" and event.reply.get("cursor", {}).get("nextBatch"):
            self.events_delivered += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def count(self, *names: str) -> int:
        return sum(1 for name in self.names if name in names)

    def clear(self) -> None:
        self.names.clear()
        self.commands.clear()
        self.events_delivered = self.connections_created = self.connections_closed = 0

    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None:
        self.connections_created += 1

    def connection_closed(self, event: monitoring.ConnectionClosedEvent) -> None:
        self.connections_closed += 1

    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None:
        pass

    def pool_ready(self, event: monitoring.PoolReadyEvent) -> None:
        pass

    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None:
        pass

    def pool_closed(self, event: monitoring.PoolClosedEvent) -> None:
        pass

    def connection_ready(self, event: monitoring.ConnectionReadyEvent) -> None:
        pass

    def connection_check_out_started(self, event: monitoring.ConnectionCheckOutStartedEvent) -> None:
        pass

    def connection_check_out_failed(self, event: monitoring.ConnectionCheckOutFailedEvent) -> None:
        pass

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None:
        pass

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        pass


@pytest.fixture
def command_counter() -> CommandCounter:
    return CommandCounter()


@contextlib.asynccontextmanager
async def _counted(driver: str, uri: str, counter: CommandCounter, *, sharded: bool) -> AsyncIterator[Any]:
    client = make_client(driver, uri, event_listeners=[counter])
    collection = client[TEST_DATABASE][f"locks_{uuid.uuid4().hex[:12]}"]
    if sharded and os.environ.get("MONGOLOCK_TEST_SHARDED") == "1":
        await shard(collection)
        counter.clear()
    try:
        yield collection
    finally:
        await collection.drop()
        await close_client(client)


@pytest.fixture
async def counted_collection(driver: str, mongodb_uri: str, command_counter: CommandCounter) -> AsyncIterator[Any]:
    """A fresh collection on a client whose commands ``command_counter`` records (sharded, as
    every fresh lock collection, with ``MONGOLOCK_TEST_SHARDED=1``)."""
    async with _counted(driver, mongodb_uri, command_counter, sharded=True) as collection:
        yield collection


@pytest.fixture
async def unsharded_counted_collection(
    driver: str, mongodb_uri: str, command_counter: CommandCounter
) -> AsyncIterator[Any]:
    """``counted_collection``, never sharded: for a unique index other than ``_id``'s, which
    MongoDB refuses on a collection sharded on ``{_id: "hashed"}`` (a unique index must start with
    ``_id`` or the shard key: ``ShardKeyPattern::isUniqueIndexCompatible`` in
    src/mongo/s/shard_key_pattern.cpp; createIndexes fails with CannotCreateIndex)."""
    async with _counted(driver, mongodb_uri, command_counter, sharded=False) as collection:
        yield collection


@pytest.fixture
def private_server() -> Iterator[EmbeddedMongo]:
    """An embedded server of the test's own, with test commands, for restarts, pauses and fail points."""
    with EmbeddedMongo(test_commands=True) as server:
        yield server


@pytest.fixture
async def private_collection(driver: str, private_server: EmbeddedMongo) -> AsyncIterator[Any]:
    """A collection on ``private_server`` reached with ``driver``; short timeouts so outages show quickly."""
    client = make_client(driver, private_server.uri)
    try:
        yield client[TEST_DATABASE]["locks"]
    finally:
        if private_server.running:
            await close_client(client)


# What configures this test run, read by the package's pytest plugin and this file: the server
# (MONGODB_URI, MONGOLOCK_TEST_ADMIN_URI), the drivers, sharding, what the workflow expects. A child
# process (a user's project, a docs example, a worker, the command) must not inherit them: the
# plugin in a child pytest would restrict its drivers or shard its collections on a server that
# cannot, and a child that needs a server is given its URI.
_RUN_SETTINGS = ("MONGODB_URI", "MONGOLOCK_")


def child_environment(**variables: str) -> dict[str, str]:
    """The environment for a child process: this process's, without the test run's own settings
    (``MONGODB_URI``, ``MONGOLOCK_*``), plus ``variables``."""
    inherited = {key: value for key, value in os.environ.items() if not key.startswith(_RUN_SETTINGS)}
    return {**inherited, **variables}


def uri_with_options(uri: str, **options: str) -> str:
    """``uri`` with ``options`` set in its query string, parsed rather than appended to: a URI
    without a query string (``mongodb://host/``) would otherwise turn ``&option=...`` into the
    name of its default database."""
    scheme, _, rest = uri.partition("://")
    hosts, _, tail = rest.partition("/")  # the host list ends at the first "/" (MongoDB's URI format)
    database, _, query = tail.partition("?")
    pairs = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    pairs.update(options)
    encoded = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote, safe=":,")
    return f"{scheme}://{hosts}/{database}?{encoded}"


async def set_fail_point(collection: Any, mode: Any, **data: Any) -> None:
    """Arm (or with mode "off" disarm) the server's ``failCommand`` fail point; skip the test on a
    server without it (a MongoDB started without ``enableTestCommands``)."""
    command: dict[str, Any] = {"configureFailPoint": "failCommand", "mode": mode}
    if data:
        command["data"] = data
    try:
        await collection.database.client.admin.command(command)
    except OperationFailure as error:
        if error.code not in (_COMMAND_NOT_FOUND, _UNAUTHORIZED):
            raise
        pytest.skip(f"this server has no failCommand fail point (start mongod with enableTestCommands=1): {error}")


@contextlib.asynccontextmanager
async def transaction(client: Any) -> AsyncIterator[Any]:
    """A session in a transaction, committed at the end of the block, aborted on an error (either driver)."""
    session = client.start_session()
    if asyncio.iscoroutine(session) or asyncio.isfuture(session):  # Motor's start_session is awaited
        session = await session
    async with session:
        started = session.start_transaction()
        if asyncio.iscoroutine(started):  # PyMongo's async start_transaction is awaited
            started = await started
        async with started:
            yield session


# -- nothing left behind ----------------------------------------------------------------------------

_EMBEDDED_DIRS = "mongolock-embedded-*"
_run_temporary: list[Path] = []


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers, so they inherit TMPDIR
def pytest_sessionstart(session: pytest.Session) -> None:
    """Give the run its own temporary directory, so that servers of another run on the machine
    (a benchmark, a second checkout) are not mistaken for this run's leftovers."""
    if hasattr(session.config, "workerinput"):
        return
    temporary = Path(tempfile.mkdtemp(prefix="mongolock-tests-"))
    _run_temporary.append(temporary)
    os.environ["TMPDIR"] = str(temporary)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if it left an embedded server's data directory in the temporary directory."""
    if not _run_temporary:
        return
    temporary = _run_temporary.pop()
    give_up_at = time.monotonic() + 5.0  # reapers remove a directory half a second after its process ended
    left = sorted(temporary.glob(_EMBEDDED_DIRS))
    while left and time.monotonic() < give_up_at:
        time.sleep(0.2)
        left = sorted(temporary.glob(_EMBEDDED_DIRS))
    if left:
        print(f"\nthe test run left {len(left)} embedded server directories behind: {[str(d) for d in left]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(temporary, ignore_errors=True)


def run_workers(worker: Path, arguments: list[str], processes: int) -> list[list[str]]:
    """Run ``processes`` copies of the ``worker`` script with ``arguments`` at once (from the
    repository's root) and return each one's output lines; a worker that fails fails the test with
    its stderr."""
    started = [
        subprocess.Popen(
            [sys.executable, str(worker), *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=worker.parent.parent,
            env=child_environment(),
        )
        for _ in range(processes)
    ]
    outputs = []
    for process in started:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs.append(out.splitlines())
    return outputs


def most_at_once(sections: Sequence[Sequence[Any]]) -> int:
    """The largest number of sections (each starting with its enter and exit times) running at one
    moment: a sweep over entries and exits, an exit before an entry at the same moment."""
    events = sorted([(section[0], 1) for section in sections] + [(section[1], -1) for section in sections])
    inside = peak = 0
    for _, step in events:
        inside += step
        peak = max(peak, inside)
    return peak
