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
    uri = os.environ.get("MONGODB_URI")
    if uri:
        yield ServerChoice(uri=uri, kind="uri")
        return
    if docker_engine_answers():
        with mongodb_container() as container_uri:
            yield ServerChoice(uri=container_uri, kind="testcontainers")
        return
    with EmbeddedMongo(test_commands=test_commands) as server:
        yield ServerChoice(uri=server.uri, kind="embedded", embedded=server)


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
