from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient, monitoring
from pymongo.errors import OperationFailure

from mongolock_async.testing import EmbeddedMongo, ServerChoice
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client, shard_blocking
from mongolock_async.testing.pytest_plugin import DRIVERS
from tests import fault_admins

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
def one_driver() -> str:
    """The first driver the run tests with. A module whose tests sit above the requests, where the
    drivers never differ (argument checks, a job's or an election's rules), imports it as its
    ``mongolock_driver`` and runs once; the requests, waiting, cancellation, outages and the
    heartbeat, where they do differ (Motor runs each operation in a thread), run with each."""
    return DRIVERS[0]


@pytest.fixture
def lock_collection(mongolock_collection: Any) -> Any:
    return mongolock_collection


class CommandCounter(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Records every command a client starts (command monitoring), how many change-stream
    ``getMore``s returned events, and the connections the pool opened and closed (CMAP)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.answered: list[str] = []
        """The names of the commands that got a reply (or failed), in order."""
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
        self.answered.append(event.command_name)
        if event.command_name == "getMore" and event.reply.get("cursor", {}).get("nextBatch"):
            self.events_delivered += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.answered.append(event.command_name)

    async def settled(self) -> None:
        """Wait until a change stream is open (its first getMore sent) and every attempt
        (findAndModify) sent meanwhile has its answer: the waiters look once more as the stream
        opens, and a count taken before that look ends would include it."""
        while self.count("getMore") == 0:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the look is sent as the stream's first getMore is
        while self.count("findAndModify") > self.answered.count("findAndModify"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    async def queued(self, sent_before: int) -> None:
        """Wait until a new waiter's place is stored: an attempt after the first ``sent_before``
        was sent, then ``settled``."""
        while self.count("findAndModify") <= sent_before:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.01)
        await self.settled()

    def count(self, *names: str) -> int:
        return sum(1 for name in self.names if name in names)

    def clear(self) -> None:
        self.names.clear()
        self.answered.clear()
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
async def _counted(
    driver: str, uri: str, admin: MongoClient[dict[str, Any]], counter: CommandCounter, *, sharded: bool
) -> AsyncIterator[Any]:
    client = make_client(driver, uri, event_listeners=[counter])
    name = f"locks_{uuid.uuid4().hex[:12]}"
    if sharded and SHARDED:
        shard_blocking(admin, TEST_DATABASE, name)
    try:
        yield client[TEST_DATABASE][name]
    finally:
        admin[TEST_DATABASE].drop_collection(name)
        await close_client(client)


@pytest.fixture
async def pymongo_collection(
    mongodb_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> AsyncIterator[Any]:
    """A fresh lock collection on a PyMongo client, for tests whose lock users are other processes
    (they run PyMongo, whichever driver this process would use): once, not once per driver."""
    async with _counted("pymongo", mongodb_uri, mongolock_admin_client, CommandCounter(), sharded=True) as collection:
        yield collection


@pytest.fixture
async def counted_collection(
    driver: str, mongodb_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]], command_counter: CommandCounter
) -> AsyncIterator[Any]:
    """A fresh collection on a client whose commands ``command_counter`` records (sharded, as
    every fresh lock collection, with ``MONGOLOCK_TEST_SHARDED=1``)."""
    async with _counted(driver, mongodb_uri, mongolock_admin_client, command_counter, sharded=True) as collection:
        yield collection


@pytest.fixture
async def unsharded_counted_collection(
    driver: str, mongodb_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]], command_counter: CommandCounter
) -> AsyncIterator[Any]:
    """``counted_collection``, never sharded: for a unique index other than ``_id``'s, which
    MongoDB refuses on a collection sharded on ``{_id: "hashed"}`` (a unique index must start with
    ``_id`` or the shard key: ``ShardKeyPattern::isUniqueIndexCompatible`` in
    src/mongo/s/shard_key_pattern.cpp; createIndexes fails with CannotCreateIndex)."""
    async with _counted(driver, mongodb_uri, mongolock_admin_client, command_counter, sharded=False) as collection:
        yield collection


@pytest.fixture
def private_server() -> Iterator[EmbeddedMongo]:
    """An embedded server of the test's own, with test commands: for tests that stop, restart,
    crash or pause (SIGSTOP) the server, which a shared one must never be. Fail points alone are
    ``fault_server``'s."""
    with EmbeddedMongo(test_commands=True) as server:
        yield server


# -- fail points -----------------------------------------------------------------------------------
#
# Fault tests run on the server under test when it accepts configureFailPoint (the workflow starts
# every MongoDB with enableTestCommands=1), else on an embedded server of their own. Each test's
# fail points are scoped to an appName of its own: mongod fails a command only for a client whose
# metadata names that application (CommandHelpers::shouldActivateFailCommandFailPoint,
# src/mongo/db/commands.cpp; the embedded server does the same). But a server has one failCommand
# fail point (MONGO_FAIL_POINT_DEFINE(failCommand), same file), which each configureFailPoint
# replaces: where the server is shared by this run's worker processes (MONGODB_URI), fault tests
# take turns, holding a file lock in the run's temporary directory. configureFailPoint needs no
# privilege (FaultInjectCmd in src/mongo/db/commands/fail_point_cmd.cpp: "No auth needed because it
# only works when enabled via command line"), so the access-controlled job's user can arm them. A
# run that says it tests a real MongoDB (MONGOLOCK_TEST_EXPECT_SERVER) fails where it refuses them.

SHARDED = os.environ.get("MONGOLOCK_TEST_SHARDED") == "1"
_FAIL_POINT_TURNS = "mongolock-fail-point-turns.lock"


@dataclass(frozen=True)
class FaultServer:
    """Where a test injects faults: the server's URI, a fresh collection name and an appName of the
    test's own (a client made by ``client`` carries it, and ``set_fail_point`` scopes to it)."""

    uri: str
    app_name: str
    collection: str
    on_target: bool
    """Whether this is the server under test (else an embedded server of the test's own)."""
    admin: MongoClient[dict[str, Any]]
    """A blocking client of this server allowed to drop, rename and shard (the test's user may not be)."""

    def client(self, driver: str, *, app_name: str | None = None, **options: Any) -> Any:
        return make_client(driver, self.uri, appName=app_name or self.app_name, **options)


def fail_points_answer(uri: str) -> bool:
    """Whether the server at ``uri`` accepts configureFailPoint (mongod/mongos started with
    enableTestCommands=1; the embedded server with --enable-test-commands)."""
    client: MongoClient[dict[str, Any]]
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        try:
            client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        except OperationFailure as error:
            if error.code in (_COMMAND_NOT_FOUND, _UNAUTHORIZED):
                return False
            raise
    return True


@contextlib.contextmanager
def _fail_point_turn(shared: bool) -> Iterator[None]:
    if not shared:
        yield
        return
    with open(Path(tempfile.gettempdir()) / _FAIL_POINT_TURNS, "a") as turns:
        fcntl.flock(turns, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(turns, fcntl.LOCK_UN)


# Where the run says it tests a real MongoDB (the workflow's jobs), the fault tests must run there:
# on a private embedded server instead they would pass and prove nothing about MongoDB.
_REAL_SERVERS = ("uri", "testcontainers")
NO_FAIL_POINTS_ON_TARGET = (
    "the server under test refuses configureFailPoint, and MONGOLOCK_TEST_EXPECT_SERVER={expected} says it is the "
    "MongoDB this run tests: start it with the test commands (mongod --setParameter enableTestCommands=1)"
)


def fail_points_expected_on_target() -> str | None:
    """``MONGOLOCK_TEST_EXPECT_SERVER`` where it names a real MongoDB, whose fault tests must run on it."""
    expected = os.environ.get("MONGOLOCK_TEST_EXPECT_SERVER")
    return expected if expected in _REAL_SERVERS else None


@pytest.fixture(scope="session")
def target_has_fail_points(mongolock_server: ServerChoice) -> bool:
    # Asked as the administrator (MONGOLOCK_TEST_ADMIN_URI, if set): the embedded server wants a
    # privilege for configureFailPoint, where mongod wants none.
    uri = os.environ.get("MONGOLOCK_TEST_ADMIN_URI") or mongolock_server.uri
    with _fail_point_turn(mongolock_server.kind == "uri"):
        answered = fail_points_answer(uri)
    expected = fail_points_expected_on_target()
    if not answered and expected:
        pytest.fail(NO_FAIL_POINTS_ON_TARGET.format(expected=expected))
    return answered


# The administrator's client of the current test's fault server (see ``set_fail_point``).
_fail_point_admins = fault_admins.in_use


@pytest.fixture
def fault_server(
    mongolock_server: ServerChoice,
    mongolock_admin_client: MongoClient[dict[str, Any]],
    target_has_fail_points: bool,
) -> Iterator[FaultServer]:
    """A server to arm fail points on: the server under test if it accepts them, else an embedded
    server of the test's own. A fresh collection name, dropped after the test (sharded on the
    server under test with ``MONGOLOCK_TEST_SHARDED=1``)."""
    app_name, collection = f"fault-{uuid.uuid4().hex[:10]}", f"faults_{uuid.uuid4().hex[:12]}"
    if not target_has_fail_points:
        own: MongoClient[dict[str, Any]]
        with EmbeddedMongo(test_commands=True) as server, MongoClient(server.uri) as own:
            _fail_point_admins.append(own)
            try:
                yield FaultServer(server.uri, app_name, collection, on_target=False, admin=own)
            finally:
                _fail_point_admins.remove(own)
        return
    admin = mongolock_admin_client
    with _fail_point_turn(mongolock_server.kind == "uri"):
        if SHARDED:
            shard_blocking(admin, TEST_DATABASE, collection)
        _fail_point_admins.append(admin)
        try:
            yield FaultServer(mongolock_server.uri, app_name, collection, on_target=True, admin=admin)
        finally:
            _fail_point_admins.remove(admin)
            admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
            admin[TEST_DATABASE].drop_collection(collection)


@pytest.fixture
async def fault_collection(driver: str, fault_server: FaultServer) -> AsyncIterator[Any]:
    """``fault_server``'s collection, on a client of ``driver`` with the test's appName."""
    client = fault_server.client(driver)
    try:
        yield client[TEST_DATABASE][fault_server.collection]
    finally:
        await close_client(client)


def _app_name(client: Any) -> str | None:
    application = client.options.pool_options.metadata.get("application") or {}
    name = application.get("name")
    return name if isinstance(name, str) else None


# What configures this test run, read by the package's pytest plugin and this file: the server
# (MONGODB_URI, MONGOLOCK_TEST_ADMIN_URI), the drivers, sharding, what the workflow expects. A child
# process (a user's project, a docs example, a worker, the command) must not inherit them: the
# plugin in a child pytest would restrict its drivers or shard its collections on a server that
# cannot, and a child that needs a server is given its URI.
_RUN_SETTINGS = ("MONGODB_URI", "MONGOLOCK_", "PYTEST_ADDOPTS")


def child_environment(**variables: str) -> dict[str, str]:
    """The environment for a child process: this process's, without the test run's own settings
    (``MONGODB_URI``, ``MONGOLOCK_*``, and ``PYTEST_ADDOPTS``, which would select a user project's
    tests), plus ``variables``."""
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


def uri_without_credentials(uri: str) -> str:
    """``uri`` without its user, password and the options that go with them (authSource,
    authMechanism): the same servers, reached without authenticating."""
    scheme, _, rest = uri.partition("://")
    authority, _, tail = rest.partition("/")
    database, _, query = tail.partition("?")
    pairs = {
        key: value
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
        if key not in ("authSource", "authMechanism", "authMechanismProperties")
    }
    encoded = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote, safe=":,")
    return f"{scheme}://{authority.rpartition('@')[2]}/{database}" + (f"?{encoded}" if encoded else "")


async def set_fail_point(collection: Any, mode: Any, **data: Any) -> None:
    """Arm (or with mode "off" disarm) the server's ``failCommand`` fail point for the commands of
    one application: ``appName`` if given, else that of ``collection``'s client (a test's fail point
    must never reach another test's clients on a shared server). Skips the test on a server without
    it (a MongoDB started without ``enableTestCommands``)."""
    command: dict[str, Any] = {"configureFailPoint": "failCommand", "mode": mode}
    if mode != "off":
        data.setdefault("appName", _app_name(collection.database.client))
        assert data["appName"], "scope the fail point: a client with an appName (fault_server.client), or appName="
        command["data"] = data
    try:
        await collection.database.client.admin.command(command)
    except OperationFailure as error:
        if error.code == _UNAUTHORIZED and _fail_point_admins:
            # mongod lets anyone configure a fail point (FaultInjectCmd requires no privilege); the
            # embedded server wants one, which the administrator of the fault server has.
            _fail_point_admins[-1].admin.command(command)
            return
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


# -- a sharded job's environment without a mongos --------------------------------------------------

# The fixtures that shard their collection under MONGOLOCK_TEST_SHARDED=1.
_SHARDED_FIXTURES = {"mongolock_collection", "lock_collection", "counted_collection", "fault_server"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With MONGOLOCK_TEST_WITHOUT_MONGOS=1 (.ci/rehearse.py runs the sharded job against a stand-in
    mongos, an embedded server, which cannot shard), leave out the tests that need a sharded
    collection."""
    if not (SHARDED and os.environ.get("MONGOLOCK_TEST_WITHOUT_MONGOS") == "1"):
        return
    kept, left_out = [], []
    for item in items:
        needs = _SHARDED_FIXTURES & set(getattr(item, "fixturenames", ()))
        (left_out if needs else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


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
