"""Which MongoDB server tests and the demo use: ``MONGODB_URI``, else Docker, else embedded."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .._util.collection_types import AsyncClient
from .server import EmbeddedMongo

DEFAULT_MONGODB_IMAGE = "mongo:8.0"
"""The image of the testcontainers MongoDB: the newest release this project supports
(``MONGOLOCK_TEST_MONGODB_IMAGE`` picks another)."""
_REPLICA_SET = "rs0"
_MONGOD_PORT = 27017

ServerKind = Literal["uri", "testcontainers", "embedded"]


@dataclass(frozen=True, slots=True)
class ServerChoice:
    """The server in use: its URI, where it came from, and the embedded server if it is one."""

    uri: str
    kind: ServerKind
    embedded: EmbeddedMongo | None = None


def docker_engine_answers() -> bool:
    """Whether a Docker engine answers a ping (within two seconds)."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach an engine means "no engine"
        return False


@contextlib.contextmanager
def select_server(*, test_commands: bool = True) -> Iterator[ServerChoice]:
    """Yield a server: ``MONGODB_URI`` if set, else a testcontainers MongoDB if Docker answers,
    else an embedded SecantusDB (with test commands enabled unless told otherwise).

    Servers it started are stopped on exit.
    """
    kind = server_kind()
    if kind == "uri":
        yield ServerChoice(uri=os.environ["MONGODB_URI"], kind="uri")
        return
    if kind == "testcontainers":
        with mongodb_container() as container_uri:
            yield ServerChoice(uri=container_uri, kind="testcontainers")
        return
    with EmbeddedMongo(test_commands=test_commands) as server:
        yield ServerChoice(uri=server.uri, kind="embedded", embedded=server)


def server_kind() -> ServerKind:
    """The kind of server ``select_server`` picks here and now, found without starting one:
    ``"uri"`` if ``MONGODB_URI`` is set, else ``"testcontainers"`` if a Docker engine answers, else
    ``"embedded"``."""
    if os.environ.get("MONGODB_URI"):
        return "uri"
    return "testcontainers" if docker_engine_answers() else "embedded"


def describe_server(uri: str, *, timeout: float = 5.0) -> str:
    """What the server at ``uri`` says it is, in one line: its version (``buildInfo``) and topology
    (``hello``): a standalone server, a replica set (its name and members) or a sharded cluster (a
    mongos). ``hello`` needs nothing; a server may refuse ``buildInfo`` to a client that has not
    authenticated (then the version is shown as refused). Says why instead, if it does not answer
    within ``timeout`` seconds. The URI itself is never shown (it may carry a password)."""
    from pymongo import MongoClient
    from pymongo.errors import OperationFailure, PyMongoError

    milliseconds = int(timeout * 1000)
    client: MongoClient[dict[str, Any]]
    try:
        with MongoClient(uri, serverSelectionTimeoutMS=milliseconds, connectTimeoutMS=milliseconds) as client:
            hello = client.admin.command("hello")
            try:
                version = f"MongoDB {client.admin.command('buildInfo').get('version', '(no version in buildInfo)')}"
            except OperationFailure as refused:
                version = f"MongoDB of a version not shown (buildInfo refused: {refused.code})"
    except PyMongoError as error:
        return f"did not answer: {type(error).__name__}: {str(error)[:200]}"
    return f"{version}, {_topology(hello)}"


def _topology(hello: dict[str, Any]) -> str:
    """The topology a ``hello`` reply shows, told apart as the drivers' server discovery does: a
    mongos says ``isdbgrid``, a replica set member names its set."""
    if hello.get("msg") == "isdbgrid":
        return "a sharded cluster (through a mongos)"
    if hello.get("setName"):
        members = len(hello.get("hosts") or ()) + len(hello.get("passives") or ()) + len(hello.get("arbiters") or ())
        role = "primary" if hello.get("isWritablePrimary") else "not its primary"
        return f"a replica set ({hello['setName']!r}, {members} member{'s' * (members != 1)}; this one {role})"
    return "a standalone server"


def describe_planned_server(kind: ServerKind) -> str:
    """What ``select_server`` will start for ``kind`` (``"testcontainers"`` or ``"embedded"``), in
    one line, without starting it: the image or the embedded server's release, the version it
    reports, and its topology."""
    if kind == "testcontainers":
        image = mongodb_image()
        tag = image.rpartition(":")[2] if ":" in image else "latest"
        return (
            f"{image} (MongoDB {tag}, as the image's tag says), a single-node replica set ({_REPLICA_SET!r}) with "
            "the test commands"
        )
    reports = _embedded_reports()
    return (
        f"SecantusDB {_installed_version('secantusdb')} "
        + (f"(reporting MongoDB {reports})" if reports else "(the MongoDB version it reports unknown)")
        + ", a single-node replica set with the test commands"
    )


def _installed_version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "(not installed)"


def _embedded_reports() -> str | None:
    """The MongoDB version SecantusDB's ``buildInfo`` reports (``SERVER_VERSION`` in its
    ``secantus/commands.py``), read from its source rather than imported: the process that asks
    runs no server. None where it cannot be read."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("secantus.commands")
    except ImportError:
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        with open(spec.origin, encoding="utf-8") as source:
            found = re.search(r'^SERVER_VERSION = "([^"]+)"', source.read(), re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


def mongodb_image() -> str:
    """The image ``mongodb_container`` starts: ``MONGOLOCK_TEST_MONGODB_IMAGE``, else the newest
    supported release."""
    return os.environ.get("MONGOLOCK_TEST_MONGODB_IMAGE") or DEFAULT_MONGODB_IMAGE


def mongod_arguments() -> list[str]:
    """What the container's mongod runs with: a replica set (change streams and transactions need
    one; testcontainers' ``MongoDbContainer`` starts a standalone server) with the test commands
    (``configureFailPoint``) the fault tests use, and no access control."""
    return ["--replSet", _REPLICA_SET, "--bind_ip_all", "--setParameter", "enableTestCommands=1"]


@contextlib.contextmanager
def mongodb_container(startup_timeout: float = 120.0) -> Iterator[str]:
    """Start a single-node replica set of ``mongodb_image()`` in Docker (testcontainers), initiate
    it, wait for its primary and yield its URI; the container is removed on exit.

    The member is initiated as ``localhost:27017``, the address it has inside the container, so
    that mongod finds itself in the configuration; clients reach it through the mapped port with
    ``directConnection=true``, which keeps the driver from following the member's own address.
    """
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(mongodb_image()).with_command(mongod_arguments()).with_exposed_ports(_MONGOD_PORT)
    with container:
        host, port = container.get_container_host_ip(), container.get_exposed_port(_MONGOD_PORT)
        uri = f"mongodb://{host}:{port}/?directConnection=true"
        give_up_at = time.monotonic() + startup_timeout
        client: MongoClient[dict[str, Any]]
        with MongoClient(uri, serverSelectionTimeoutMS=2_000) as client:
            while True:
                try:
                    _initiate(client)
                    if client.admin.command("hello").get("isWritablePrimary"):
                        break
                except PyMongoError as error:
                    if time.monotonic() > give_up_at:
                        raise RuntimeError(f"the MongoDB container did not become primary: {error}") from error
                if time.monotonic() > give_up_at:
                    raise RuntimeError("the MongoDB container did not become primary")
                time.sleep(0.5)
        yield uri


def _initiate(client: AsyncClient) -> None:
    from pymongo.errors import OperationFailure

    members = [{"_id": 0, "host": f"localhost:{_MONGOD_PORT}"}]
    try:
        client.admin.command("replSetInitiate", {"_id": _REPLICA_SET, "members": members})
    except OperationFailure as error:
        if error.code != 23:  # AlreadyInitialized: a retry after the first attempt went through
            raise
