"""The suite's fixtures and hooks. The package's pytest plugin (registered by its entry point)
provides the ``mongolock_*`` fixtures (docs/testing.md), which the tests use by those names; the
fixtures here do something else. Helpers that are not fixtures live in tests/support/."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

# The helpers in tests/support and the workers' code in tests/workers that tests import check with
# `assert` as the tests do. pytest rewrites the asserts of test modules and conftest files into
# explicit checks, which `python -O` keeps (make test-optimized), but not those of modules they
# import, unless told before the import: otherwise -O strips them, and a helper's check (a fail
# point scoped to one client, a process that must have exited 0) would pass without checking.
pytest.register_assert_rewrite("tests.support", "tests.workers")

from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo, ServerChoice
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client, shard_blocking
from mongolock_async.testing.pytest_plugin import DRIVERS
from mongolock_async.testing.selection import describe_planned_server, describe_server, server_kind
from tests.support.commands import CommandCounter
from tests.support.fail_points import (
    ADMINS,
    NO_FAIL_POINTS_ON_TARGET,
    FaultServer,
    fail_point_turn,
    fail_points_answer,
    faults_elsewhere,
)
from tests.support.private_servers import own_configuration_tests, private_server_tests
from tests.support.processes import ROOT
from tests.support.run_settings import SHARDED

# A test that failed while the machine stalled runs again (see there).
pytest_plugins = ["tests.support.stall_reruns"]


@pytest.hookimpl(tryfirst=True)  # before the fixtures' own parametrization reads the markers
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.one_driver`` (pyproject.toml): the test runs with the first driver of the run
    only, not once per driver. For tests above the requests, where the drivers never differ
    (argument checks, a job's or an election's rules); the requests, waiting, cancellation, outages
    and the heartbeat, where they do differ (Motor runs each operation in a thread), run with each."""
    if metafunc.definition.get_closest_marker("one_driver") and "mongolock_driver" in metafunc.fixturenames:
        metafunc.definition.add_marker(pytest.mark.parametrize("mongolock_driver", DRIVERS[:1]))


# -- the run's header: what it runs on, and what it does not run there ----------------------------


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The server the tests use (its kind, version and topology), where the fault tests arm their
    fail points, and the tests that start servers of their own (tests/support/private_servers.py):
    a workflow job's log says what did not run on its MongoDB."""
    if hasattr(config, "workerinput"):
        return []
    kind = server_kind()
    if kind == "uri":
        server = f"uri (MONGODB_URI): {describe_server(os.environ['MONGODB_URI'])}"
    else:
        server = f"{kind}: {describe_planned_server(kind)}, one per pytest process (each xdist worker its own)"
    if kind == "embedded":
        faults = "on the server under test (the suite's embedded servers accept configureFailPoint)"
    elif faults_elsewhere():
        faults = (
            "on the server under test if it accepts configureFailPoint, else on a private embedded server each "
            "(MONGOLOCK_TEST_FAULTS_ELSEWHERE=1)"
        )
    else:
        faults = (
            "on the server under test; where it refuses configureFailPoint, they fail "
            "(MONGOLOCK_TEST_FAULTS_ELSEWHERE=1 would run them on a private embedded server)"
        )
    lines = [f"mongolock server: {server}", f"mongolock fault tests: {faults}"]
    if sys.flags.optimize:
        lines.append(
            f"mongolock python -O{'O' * (sys.flags.optimize - 1)}: pytest and its xdist workers run optimized (the "
            "processes the tests start do not)"
        )
    lines.append("mongolock private servers (embedded servers the tests start, and why, from their docstrings):")
    for test in private_server_tests(ROOT):
        lines.append(f"  {test.test}: {test.reason or 'its docstring does not say why (Private server: ...)'}")
    others = own_configuration_tests(ROOT)
    lines.append(
        f"mongolock servers of another configuration (access control, TLS, standalone, no test commands, a shifted "
        f"clock; the embedded server's and the selection's own tests): {sum(others.values())} test functions in "
        + ", ".join(f"{path.removeprefix('tests/')} ({count})" for path, count in others.items())
    )
    return lines


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Under ``python -O``, the workers too: pytest-xdist starts each with the bare interpreter
    (execnet's ``popen_args``), which would run the tests unoptimized."""
    if not sys.flags.optimize:
        return
    for spec in specs:
        if spec.popen and not spec.python:
            spec.python = f"{shlex.quote(sys.executable)} -{'O' * sys.flags.optimize}"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each worker how optimized its controller runs (tests/ops/test_workflow.py checks it)."""
    node.workerinput["controller_optimize"] = sys.flags.optimize


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
    mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> AsyncIterator[Any]:
    """A fresh lock collection on a PyMongo client, for tests whose lock users are other processes
    (they run PyMongo, whichever driver this process would use): once, not once per driver."""
    async with _counted("pymongo", mongolock_uri, mongolock_admin_client, CommandCounter(), sharded=True) as collection:
        yield collection


@pytest.fixture
async def counted_collection(
    mongolock_driver: str,
    mongolock_uri: str,
    mongolock_admin_client: MongoClient[dict[str, Any]],
    command_counter: CommandCounter,
) -> AsyncIterator[Any]:
    """A fresh collection on a client whose commands ``command_counter`` records (sharded, as
    every fresh lock collection, with ``MONGOLOCK_TEST_SHARDED=1``)."""
    counted = _counted(mongolock_driver, mongolock_uri, mongolock_admin_client, command_counter, sharded=True)
    async with counted as collection:
        yield collection


@pytest.fixture
async def unsharded_counted_collection(
    mongolock_driver: str,
    mongolock_uri: str,
    mongolock_admin_client: MongoClient[dict[str, Any]],
    command_counter: CommandCounter,
) -> AsyncIterator[Any]:
    """``counted_collection``, never sharded: for a unique index other than ``_id``'s, which
    MongoDB refuses on a collection sharded on ``{_id: "hashed"}`` (a unique index must start with
    ``_id`` or the shard key: ``ShardKeyPattern::isUniqueIndexCompatible`` in
    src/mongo/s/shard_key_pattern.cpp; createIndexes fails with CannotCreateIndex)."""
    counted = _counted(mongolock_driver, mongolock_uri, mongolock_admin_client, command_counter, sharded=False)
    async with counted as collection:
        yield collection


@pytest.fixture
def refused_uri() -> Iterator[str]:
    """The URI of an address where nothing listens for the whole test, so that every connection is
    refused: a port held bound and never listened on. Bound without ``SO_REUSEADDR``, it cannot be
    bound by anyone else meanwhile (Linux's ``inet_bind_conflict``: sharing a port takes the option
    on both sockets). A stopped server's port would not do: the OS may give it to another test's
    server, and the test would then talk to that."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"mongodb://127.0.0.1:{held.getsockname()[1]}/?directConnection=true"


@pytest.fixture
def private_server() -> Iterator[EmbeddedMongo]:
    """An embedded server of the test's own, with test commands: for tests that stop, restart,
    crash or pause (SIGSTOP) the server, which a shared one must never be. Fail points alone are
    ``fault_server``'s."""
    with EmbeddedMongo(test_commands=True) as server:
        yield server


# -- fail points (tests/support/fail_points.py) -----------------------------------------------------


@pytest.fixture(scope="session")
def target_has_fail_points(mongolock_server: ServerChoice) -> bool:
    # Asked as the administrator (MONGOLOCK_TEST_ADMIN_URI, if set): the embedded server wants a
    # privilege for configureFailPoint, where mongod wants none.
    uri = os.environ.get("MONGOLOCK_TEST_ADMIN_URI") or mongolock_server.uri
    with fail_point_turn(mongolock_server.kind == "uri"):
        answered = fail_points_answer(uri)
    # A server the run was given is the one its fault tests are about: never left silently.
    if not answered and mongolock_server.kind != "embedded" and not faults_elsewhere():
        pytest.fail(NO_FAIL_POINTS_ON_TARGET.format(kind=mongolock_server.kind))
    return answered


@pytest.fixture
def fault_server(
    mongolock_server: ServerChoice,
    mongolock_admin_client: MongoClient[dict[str, Any]],
    target_has_fail_points: bool,
) -> Iterator[FaultServer]:
    """A server to arm fail points on: the server under test. Where that server refuses them, the
    test fails, unless ``MONGOLOCK_TEST_FAULTS_ELSEWHERE=1`` lets it run on an embedded server of
    its own (the suite's own embedded servers always accept them). A fresh collection name, dropped
    after the test (sharded on the server under test with ``MONGOLOCK_TEST_SHARDED=1``)."""
    app_name, collection = f"fault-{uuid.uuid4().hex[:10]}", f"faults_{uuid.uuid4().hex[:12]}"
    if not target_has_fail_points:
        own: MongoClient[dict[str, Any]]
        with EmbeddedMongo(test_commands=True) as server, MongoClient(server.uri) as own:
            ADMINS.append(own)
            try:
                yield FaultServer(server.uri, app_name, collection, on_target=False, admin=own)
            finally:
                ADMINS.remove(own)
        return
    admin = mongolock_admin_client
    with fail_point_turn(mongolock_server.kind == "uri"):
        if SHARDED:
            shard_blocking(admin, TEST_DATABASE, collection)
        ADMINS.append(admin)
        try:
            yield FaultServer(mongolock_server.uri, app_name, collection, on_target=True, admin=admin)
        finally:
            ADMINS.remove(admin)
            admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
            admin[TEST_DATABASE].drop_collection(collection)


@pytest.fixture
async def fault_collection(mongolock_driver: str, fault_server: FaultServer) -> AsyncIterator[Any]:
    """``fault_server``'s collection, on a client of ``mongolock_driver`` with the test's appName."""
    client = fault_server.client(mongolock_driver)
    try:
        yield client[TEST_DATABASE][fault_server.collection]
    finally:
        await close_client(client)


# -- a sharded job's environment without a mongos --------------------------------------------------

# The fixtures that shard their collection under MONGOLOCK_TEST_SHARDED=1.
_SHARDED_FIXTURES = {"mongolock_collection", "counted_collection", "fault_server"}


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
