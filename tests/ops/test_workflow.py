"""What the real-MongoDB workflow's environment can break, checked here: the test run's settings
stay out of child processes, URIs are built with a parser, and the workflow's jobs are what
docs/testing.md says they are."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
import yaml
from _pytest.assertion.rewrite import AssertionRewritingHook
from pymongo.errors import OperationFailure
from pymongo.uri_parser import parse_uri

from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from mongolock_async.testing.selection import mongod_arguments
from tests.support.fail_points import FAULTS_ELSEWHERE, FaultServer, set_fail_point
from tests.support.private_servers import private_server_tests
from tests.support.processes import ROOT
from tests.support.run_settings import child_environment
from tests.support.uris import uri_with_options, uri_without_credentials

pytestmark = pytest.mark.environment
TESTS = ROOT / "tests"
_SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _spawns_a_process(call: ast.Call) -> bool:
    function = call.func
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
        return function.value.id == "subprocess" and function.attr in _SPAWNERS
    return False


def test_every_child_process_gets_a_clean_environment() -> None:
    # A child inherits MONGOLOCK_TEST_DRIVERS, MONGOLOCK_TEST_SHARDED and MONGODB_URI from the
    # workflow's jobs unless it is given an environment without them (tests/support/run_settings.py,
    # child_environment): a user's project then ran with one driver, and a docs example sharded
    # its collection on the embedded server.
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not _spawns_a_process(node):
                continue
            env = next((keyword.value for keyword in node.keywords if keyword.arg == "env"), None)
            if not (
                isinstance(env, ast.Call) and isinstance(env.func, ast.Name) and env.func.id == "child_environment"
            ):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not offenders, "child processes that inherit the test run's settings: " + ", ".join(offenders)


@pytest.mark.parametrize(
    "uri",
    [
        "mongodb://localhost:27017/",  # the sharded job's: no query string
        "mongodb://localhost:27017",  # nor a path
        "mongodb://localhost:27017/?replicaSet=rs0",
        "mongodb://app:p%40ss%2Fw@localhost:27017/mongolock_tests?authSource=admin&replicaSet=rs0",
        "mongodb://h1:1,h2:2/?replicaSet=rs",
    ],
)
def test_options_are_added_to_any_uri_as_options(uri: str) -> None:
    built = uri_with_options(uri, authMechanism="MONGODB-AWS", serverSelectionTimeoutMS="300")
    parsed = parse_uri(built, validate=False)
    assert parsed["options"]["authMechanism"] == "MONGODB-AWS", built
    assert parsed["options"]["serverSelectionTimeoutMS"] == "300", built
    original = parse_uri(uri, validate=False)
    assert parsed["database"] == original["database"], f"{built} names another database"
    assert parsed["nodelist"] == original["nodelist"] and parsed["password"] == original["password"]
    assert all(parsed["options"][key] == value for key, value in original["options"].items())


def test_credentials_are_taken_out_of_a_uri_with_their_options() -> None:
    uri = "mongodb://app:p%40ss@h1:1,h2:2/db?authSource=admin&replicaSet=rs0&authMechanism=SCRAM-SHA-256"
    parsed = parse_uri(uri_without_credentials(uri), validate=False)
    assert parsed["username"] is None and parsed["password"] is None
    assert parsed["nodelist"] == [("h1", 1), ("h2", 2)] and parsed["database"] == "db"
    assert dict(parsed["options"]) == {"replicaSet": "rs0"}


_RESTARTS = ("pause", "resume", "stop", "start", "restart", "kill")


def test_only_tests_that_stop_or_pause_the_server_start_their_own() -> None:
    # A test that only arms fail points runs on the server under test (fault_server), so that on
    # the workflow's MongoDB the ambiguous acquire, the lost release reply and the rest are proven
    # on mongod, not only on the embedded double. A test that takes private_server controls it, and
    # says why in its docstring ("Private server: ..."), which the run's header shows.
    offenders, unexplained = [], []
    for test in private_server_tests(ROOT):
        if not test.takes_fixture:
            continue
        path, name = test.test.split("::")
        source = (ROOT / path).read_text()
        node = next(
            node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == name
        )
        body = ast.get_source_segment(source, node) or ""
        # A test may hand its server to what restarts it (the stateful tests' World, server=...).
        hands_it_on = "stopped(private_server" in body or "server=private_server" in body
        if not (any(f"private_server.{method}(" in body for method in _RESTARTS) or hands_it_on):
            offenders.append(test.test)
        if not test.reason:
            unexplained.append(test.test)
    assert not offenders, "tests that start a server only for fail points (use fault_server): " + ", ".join(offenders)
    assert not unexplained, "tests whose docstring does not say why they need a private server: " + ", ".join(
        unexplained
    )
    assert any(test.takes_fixture for test in private_server_tests(ROOT)), "the scan found no private_server test"


def test_fault_tests_use_the_server_under_test_when_it_has_fail_points(
    fault_server: FaultServer, mongolock_uri: str, target_has_fail_points: bool
) -> None:
    assert fault_server.on_target is target_has_fail_points
    if target_has_fail_points:
        assert fault_server.uri == mongolock_uri


async def test_a_fail_point_is_scoped_to_one_client(mongolock_driver: str, fault_server: FaultServer) -> None:
    mine = fault_server.client(mongolock_driver)
    other = fault_server.client(mongolock_driver, app_name=f"{fault_server.app_name}-other")
    try:
        await set_fail_point(
            mine[TEST_DATABASE][fault_server.collection], "alwaysOn", failCommands=["find"], errorCode=2
        )
        assert await other[TEST_DATABASE][fault_server.collection].find_one({}) is None, "another client was hit"
        with pytest.raises(OperationFailure):
            await mine[TEST_DATABASE][fault_server.collection].find_one({})
        unscoped = make_client(mongolock_driver, fault_server.uri)
        try:
            with pytest.raises(AssertionError, match="scope the fail point"):
                await set_fail_point(
                    unscoped[TEST_DATABASE][fault_server.collection], "alwaysOn", failCommands=["find"]
                )
        finally:
            await close_client(unscoped)
    finally:
        await close_client(mine)
        await close_client(other)


@pytest.mark.parametrize("opted_out", [False, True], ids=["fails", "opted-out-by-name"])
def test_fault_tests_fail_where_the_server_under_test_has_no_fail_points(opted_out: bool) -> None:
    # A MongoDB started without the test commands, as a workflow job's would be if its compose file
    # lost the flag: the fault tests fail, saying how to start it, unless the run names the
    # fallback to a private embedded server (MONGOLOCK_TEST_FAULTS_ELSEWHERE=1).
    with EmbeddedMongo(test_commands=False) as server:
        settings = {"MONGODB_URI": server.uri, **({"MONGOLOCK_TEST_FAULTS_ELSEWHERE": "1"} if opted_out else {})}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
             "tests/ops/test_workflow.py::test_a_fail_point_is_scoped_to_one_client",
             "tests/ops/test_workflow.py::test_fault_tests_use_the_server_under_test_when_it_has_fail_points"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=child_environment(**settings),
        )  # fmt: skip
    # The header says what the run was given (kind, version, topology) and where its fault tests run.
    header = result.stdout[: result.stdout.find("collected ")]
    assert re.search(r"mongolock server: uri \(MONGODB_URI\): MongoDB \d+\.\d+\.\d+, a replica set \(", header), header
    if opted_out:
        assert result.returncode == 0, result.stdout[-3000:]
        assert "else on a private embedded server each (MONGOLOCK_TEST_FAULTS_ELSEWHERE=1)" in header, header
    else:
        assert "where it refuses configureFailPoint, they fail" in header, header
        assert result.returncode == 1 and "refuses configureFailPoint" in result.stdout, result.stdout[-3000:]
        assert "enableTestCommands=1" in result.stdout and "MONGOLOCK_TEST_FAULTS_ELSEWHERE=1" in result.stdout
        assert "passed" not in result.stdout.splitlines()[-1], result.stdout[-3000:]


def test_nox_spreads_the_tests_over_its_workers_as_make_test_does() -> None:
    # Tests of one xdist_group (the docs' site, built once) share a worker only under --dist
    # loadgroup: other distribution modes ignore the groups.
    make_test = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "-m pytest -n 8 --dist loadgroup" in make_test, make_test
    noxfile = (ROOT / "noxfile.py").read_text()
    runs = [line for line in noxfile.splitlines() if '"-m", "pytest"' in line]
    assert runs and all("*DISTRIBUTE" in line for line in runs), runs
    assert 'DISTRIBUTE = ("--dist", "loadgroup")' in noxfile


def test_the_helpers_asserts_check_under_python_o() -> None:
    # make test-optimized runs the suite under python -O, which strips every assert pytest has not
    # rewritten: the helpers' (tests/conftest.py registers them) must be rewritten too.
    helpers = [name for name in sys.modules if name.startswith(("tests.support.", "tests.workers."))]
    plain = [name for name in helpers if not isinstance(sys.modules[name].__loader__, AssertionRewritingHook)]
    assert helpers and not plain, f"helpers whose asserts python -O would strip: {plain}"


def test_the_workers_run_as_optimized_as_their_controller(request: pytest.FixtureRequest) -> None:
    # pytest-xdist starts its workers with the bare interpreter: under python -O, without
    # tests/conftest.py's pytest_xdist_setupnodes, the tests would run unoptimized.
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        pytest.skip("runs in an xdist worker")
    assert sys.flags.optimize == workerinput["controller_optimize"]


def test_every_workflow_server_has_the_test_commands_and_no_job_moves_the_fault_tests() -> None:
    # The workflow's fault tests must run on its MongoDB: every mongod and mongos its compose files
    # start, and the testcontainers MongoDB, has the test commands, and no job opts out by name.
    workflow = (ROOT / ".github" / "workflows" / "real-mongodb.yml").read_text()
    assert FAULTS_ELSEWHERE in workflow  # the header comment says no job sets it...
    jobs = yaml.safe_load(workflow)["jobs"]
    settings = [
        key
        for job in jobs.values()
        for env in (job.get("env") or {}, *(step.get("env") or {} for step in job["steps"]))
        for key in env
    ]
    assert FAULTS_ELSEWHERE not in settings, "a workflow job runs its fault tests off its MongoDB"  # ...and none does
    servers = []
    for compose in sorted((ROOT / ".ci" / "mongodb").glob("*.yml")):
        for name, service in yaml.safe_load(compose.read_text())["services"].items():
            command = service.get("command")
            line = " ".join(command) if isinstance(command, list) else str(command)
            if re.search(r"\bmongo[ds]\b", line):
                servers.append(name)
                assert "--setParameter enableTestCommands=1" in line, f"{compose.name}: {name} lacks the test commands"
    assert servers
    assert "enableTestCommands=1" in " ".join(mongod_arguments())
