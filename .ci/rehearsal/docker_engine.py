"""A stand-in for the Docker engine, for the workflow's testcontainers job: the suite finds an
engine, asks it for a MongoDB container, and gets a stand-in (``tests/support/standins.py``) configured by
the container's own command, its port published on a port of this machine, as Docker would.

It speaks the part of the Engine API that docker-py and testcontainers use (ping, version, create,
start, inspect, logs, stop, remove) over a Unix socket, and runs two images: ``mongo`` (the
image's entrypoint runs ``mongod`` with the arguments given, as docker-entrypoint.sh does when
they start with an option) and testcontainers' reaper, Ryuk (it acknowledges each label filter
sent to it and removes the matching containers once the last of its connections has been closed
for its reconnection timeout, as Ryuk does). Any other image is refused.
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from rehearsal.topology import container_id, release_of, standin_for
from tests.support.standins import Forwarder, StandIn

API_VERSION = "1.44"
_RYUK_TIMEOUT_S = 10.0


@dataclass
class Container:
    """One container: its stand-in (a MongoDB) or its reaper, and its published ports."""

    id: str
    name: str
    image: str
    command: list[str]
    labels: dict[str, str]
    exposed: list[int]
    logs: list[str] = field(default_factory=list)
    standin: StandIn | None = None
    reaper: Reaper | None = None
    forwarders: dict[int, Forwarder] = field(default_factory=dict)
    running: bool = False
    started_at: str = ""

    def stop(self) -> None:
        for forwarder in self.forwarders.values():
            forwarder.close()
        self.forwarders.clear()
        if self.standin is not None:
            self.standin.close()
        if self.reaper is not None:
            self.reaper.close()
        self.running = False


class Engine:
    """The containers, and the server that answers the Engine API on ``socket_path``."""

    def __init__(self, socket_path: Path, log: Callable[[str], None]) -> None:
        self.socket_path = socket_path
        self.log = log
        self.containers: dict[str, Container] = {}
        self._lock = threading.Lock()
        self._server: _UnixServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Engine:
        self.socket_path.unlink(missing_ok=True)
        self._server = _UnixServer(str(self.socket_path), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="docker engine", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for container in list(self.containers.values()):
            container.stop()
        self.containers.clear()
        self.socket_path.unlink(missing_ok=True)

    # -- the API's operations -------------------------------------------------------------------

    def create(self, name: str | None, body: Mapping[str, Any]) -> Container:
        image = str(body.get("Image", ""))
        command = [str(word) for word in body.get("Cmd") or []]
        exposed = [int(port.partition("/")[0]) for port in body.get("ExposedPorts") or {}]
        container = Container(container_id() + container_id(), name or f"rehearsal_{container_id()}", image,
                              command, dict(body.get("Labels") or {}), exposed)  # fmt: skip
        repository = image.rpartition(":")[0] or image
        if repository == "mongo":
            argv = command if command and not command[0].startswith("-") else ["mongod", *command]
            container.standin = standin_for(argv, host_name=container.id[:12], names=(), version=release_of(image),
                                            path_of=_no_volumes)  # fmt: skip
        elif repository.endswith("testcontainers/ryuk"):
            container.reaper = Reaper(self)
        else:
            raise LookupError(f"the rehearsal's Docker engine runs the mongo and testcontainers/ryuk images only, "
                              f"not {image!r}")  # fmt: skip
        with self._lock:
            self.containers[container.id] = container
        return container

    def start_container(self, container: Container) -> None:
        if container.standin is not None:
            container.standin.start()
            target = container.standin.port
            port = container.standin.identity.port
            container.logs.append(f'{{"msg":"Waiting for connections","attr":{{"port":{port}}}}}')
        else:
            assert container.reaper is not None
            target = container.reaper.start()
            container.logs.append("Started!")
        assert target is not None
        for port in container.exposed:
            container.forwarders[port] = Forwarder(("127.0.0.1", target)).start()
        container.running = True
        container.started_at = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        published = ", ".join(f"{port} -> 127.0.0.1:{each.port}" for port, each in container.forwarders.items())
        self.log(f"container {container.id[:12]} ({container.image} {' '.join(container.command)}): ports {published}")

    def remove(self, container: Container) -> None:
        container.stop()
        with self._lock:
            self.containers.pop(container.id, None)

    def find(self, reference: str) -> Container | None:
        with self._lock:
            for container in self.containers.values():
                if reference in (container.id, container.name, container.name.lstrip("/")) or (
                    len(reference) >= 12 and container.id.startswith(reference)
                ):
                    return container
        return None

    def remove_labelled(self, filters: list[tuple[str, str]]) -> None:
        with self._lock:
            doomed = [
                container
                for container in self.containers.values()
                if container.reaper is None and any(container.labels.get(key) == value for key, value in filters)
            ]
        for container in doomed:
            self.log(f"the reaper removes container {container.id[:12]}: its test session ended")
            self.remove(container)


def _no_volumes(inside: str) -> Path:
    raise ValueError(f"the testcontainers MongoDB mounts no volume ({inside})")


def inspect(container: Container) -> dict[str, Any]:
    ports = {
        f"{port}/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(forwarder.port)}]
        for port, forwarder in container.forwarders.items()
    }
    return {
        "Id": container.id,
        "Name": "/" + container.name.lstrip("/"),
        "Image": container.image,
        "Created": container.started_at,
        "State": {
            "Status": "running" if container.running else "created",
            "Running": container.running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": 0,
            "ExitCode": 0,
            "Error": "",
            "StartedAt": container.started_at,
            "FinishedAt": "0001-01-01T00:00:00Z",
        },
        "Config": {
            "Hostname": container.id[:12],
            "Image": container.image,
            "Cmd": container.command,
            "Labels": container.labels,
            "Tty": False,
            "ExposedPorts": {f"{port}/tcp": {} for port in container.exposed},
        },
        "HostConfig": {"NetworkMode": "bridge"},
        "NetworkSettings": {
            "Ports": ports,
            "IPAddress": "172.17.0.2",
            "Gateway": "172.17.0.1",
            "Networks": {"bridge": {"IPAddress": "172.17.0.2", "Gateway": "172.17.0.1"}},
        },
    }


class Reaper:
    """Ryuk: acknowledges label filters (``label=KEY=VALUE`` lines); once its last connection has
    been closed for ``_RYUK_TIMEOUT_S``, removes every container a filter names."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.filters: list[tuple[str, str]] = []
        self._connections = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    def start(self) -> int:
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, name="ryuk", daemon=True).start()
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as lines:
            for line in lines:
                key, _, value = line.decode().strip().removeprefix("label=").partition("=")
                with self._lock:
                    self.filters.append((key, value))
                connection.sendall(b"ACK\n")
        with self._lock:
            self._connections -= 1
            last = self._connections == 0
        if last and not self._closed.wait(_RYUK_TIMEOUT_S):
            with self._lock:
                if self._connections == 0:
                    self.engine.remove_labelled(self.filters)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-reply (docker-py closing its session at exit) is no error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "docker-client"

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            path = re.sub(r"^/v[\d.]+", "", url.path)
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            try:
                self._answer(method, path, query, body)
            except LookupError as error:
                self._json(404 if "no such" in str(error) else 500, {"message": str(error)})
            except Exception as error:  # an engine answers 500 with a message, never a dropped connection
                self._json(500, {"message": f"{type(error).__name__}: {error}"})

        def _answer(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
            if path == "/_ping":
                self._reply(200, b"OK", "text/plain")
            elif path == "/version":
                self._json(200, {"ApiVersion": API_VERSION, "MinAPIVersion": "1.24", "Version": "rehearsal",
                                 "Os": "linux", "Arch": "amd64"})  # fmt: skip
            elif path == "/info":
                self._json(200, {"ServerVersion": "rehearsal", "OperatingSystem": "the rehearsal's stand-in"})
            elif re.fullmatch(r"/images/.+/json", path):
                self._json(200, {"Id": "sha256:" + "0" * 64, "RepoTags": [path[len("/images/") : -len("/json")]]})
            elif path == "/containers/create" and method == "POST":
                container = engine.create(query.get("name"), body)
                self._json(201, {"Id": container.id, "Warnings": []})
            elif path == "/containers/json":
                wanted = json.loads(query.get("filters") or "{}").get("id")
                listed = [
                    c for c in list(engine.containers.values()) if not wanted or any(c.id.startswith(w) for w in wanted)
                ]
                self._json(200, [{**inspect(c), "Names": ["/" + c.name], "Labels": c.labels,
                                  "State": "running" if c.running else "created"} for c in listed])  # fmt: skip
            else:
                self._container_operation(method, path, query)

        def _container_operation(self, method: str, path: str, query: dict[str, str]) -> None:
            match = re.fullmatch(r"/containers/([^/]+)(/\w+)?", path)
            container = engine.find(match.group(1)) if match else None
            if match is None:
                raise LookupError(f"the rehearsal's Docker engine does not answer {method} {path}")
            if container is None:
                raise LookupError(f"no such container: {match.group(1)}")
            operation = match.group(2) or ""
            if operation == "/start":
                engine.start_container(container)
                self._reply(204, b"", "text/plain")
            elif operation == "/json":
                self._json(200, inspect(container))
            elif operation == "/logs":
                lines = "".join(line + "\n" for line in container.logs).encode()
                frame = struct.pack(">BxxxL", 1, len(lines)) + lines if lines else b""
                self._reply(200, frame, "application/vnd.docker.raw-stream")
            elif operation in ("/stop", "/kill", "/wait"):
                if operation != "/wait":
                    container.stop()
                self._json(200, {"StatusCode": 0}) if operation == "/wait" else self._reply(204, b"", "text/plain")
            elif operation == "" and method == "DELETE":
                engine.remove(container)
                self._reply(204, b"", "text/plain")
            else:
                raise LookupError(f"the rehearsal's Docker engine does not answer {method} {path}")

        def _json(self, status: int, value: Any) -> None:
            self._reply(status, json.dumps(value).encode(), "application/json")

        def _reply(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Api-Version", API_VERSION)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
