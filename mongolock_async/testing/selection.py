"""Which MongoDB server tests and the demo use: ``MONGODB_URI``, else Docker, else embedded."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .server import EmbeddedMongo

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
        from testcontainers.mongodb import MongoDbContainer

        with MongoDbContainer("mongo:7.0") as container:
            yield ServerChoice(uri=container.get_connection_url(), kind="testcontainers")
        return
    with EmbeddedMongo(test_commands=test_commands) as server:
        yield ServerChoice(uri=server.uri, kind="embedded", embedded=server)
