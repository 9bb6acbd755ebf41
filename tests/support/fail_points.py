"""Fail points: where a test injects faults (``FaultServer``, the ``fault_server`` fixture's value)
and how it arms them (``set_fail_point``), scoped to the test's own clients."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongolock_async.testing.clients import make_client

_COMMAND_NOT_FOUND, _UNAUTHORIZED = 59, 13

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
# run given a server (MONGODB_URI, or testcontainers) fails its fault tests where that server
# refuses them, unless the run opts out by name (MONGOLOCK_TEST_FAULTS_ELSEWHERE=1).

_FAIL_POINT_TURNS = "mongolock-fail-point-turns.lock"

ADMINS: list[MongoClient[dict[str, Any]]] = []
"""The administrator's client of the current test's fault server (the ``fault_server`` fixture
pushes and pops it), which ``set_fail_point`` falls back to where the test's user may not arm."""


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
def fail_point_turn(shared: bool) -> Iterator[None]:
    """A turn at the server's one ``failCommand`` fail point: where this run's worker processes share
    the server (``shared``), one test at a time, by a file lock in the run's temporary directory."""
    if not shared:
        yield
        return
    with open(Path(tempfile.gettempdir()) / _FAIL_POINT_TURNS, "a") as turns:
        fcntl.flock(turns, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(turns, fcntl.LOCK_UN)


# Where the run was given a server (MONGODB_URI, or the testcontainers MongoDB), the fault tests
# must run there: on a private embedded server instead they would pass and prove nothing about that
# server, and the run would not say so. A job that means it (a server it cannot restart with the
# test commands) opts out by name, and the run's header says where its fault tests ran.
FAULTS_ELSEWHERE = "MONGOLOCK_TEST_FAULTS_ELSEWHERE"
NO_FAIL_POINTS_ON_TARGET = (
    "the server under test ({kind}) refuses configureFailPoint, so the fault tests cannot run on it: start it with "
    "the test commands (mongod --setParameter enableTestCommands=1), or set "
    f"{FAULTS_ELSEWHERE}=1 to run them on a private embedded server instead"
)


def faults_elsewhere() -> bool:
    """Whether the run lets its fault tests run on a private embedded server where the server under
    test refuses fail points (``MONGOLOCK_TEST_FAULTS_ELSEWHERE=1``)."""
    return os.environ.get(FAULTS_ELSEWHERE) == "1"


def _app_name(client: Any) -> str | None:
    application = client.options.pool_options.metadata.get("application") or {}
    name = application.get("name")
    return name if isinstance(name, str) else None


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
        if error.code == _UNAUTHORIZED and ADMINS:
            # mongod lets anyone configure a fail point (FaultInjectCmd requires no privilege); the
            # embedded server wants one, which the administrator of the fault server has.
            ADMINS[-1].admin.command(command)
            return
        if error.code not in (_COMMAND_NOT_FOUND, _UNAUTHORIZED):
            raise
        pytest.skip(f"this server has no failCommand fail point (start mongod with enableTestCommands=1): {error}")
