"""What the real-MongoDB workflow's environment can break, checked here: the test run's settings
stay out of child processes, URIs are built with a parser, and the workflow's jobs are what
docs/testing.md says they are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pymongo.uri_parser import parse_uri

from tests.conftest import uri_with_options

TESTS = Path(__file__).parent
_SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _spawns_a_process(call: ast.Call) -> bool:
    function = call.func
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
        return function.value.id == "subprocess" and function.attr in _SPAWNERS
    return False


def test_every_child_process_gets_a_clean_environment() -> None:
    # A child inherits MONGOLOCK_TEST_DRIVERS, MONGOLOCK_TEST_SHARDED and MONGODB_URI from the
    # workflow's jobs unless it is given an environment without them (tests/conftest.py,
    # child_environment): a user's project then ran with one driver, and a docs example sharded
    # its collection on the embedded server.
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not _spawns_a_process(node):
                continue
            env = next((keyword.value for keyword in node.keywords if keyword.arg == "env"), None)
            if not (
                isinstance(env, ast.Call) and isinstance(env.func, ast.Name) and env.func.id == "child_environment"
            ):
                offenders.append(f"{path.name}:{node.lineno}")
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
