"""The MongoDB a workflow job starts in Docker, stood in for by embedded servers that look the same
to its clients: each container of a compose file (or of the Docker engine stand-in) becomes a
``StandIn`` configured by the container's own mongod or mongos command line, and each published port
a ``Forwarder`` to it, as Docker's port mapping.

Only what the workflow's compose files and the testcontainers MongoDB use is understood; any other
option is refused by name, so a new option in a compose file fails the rehearsal until it is
taught here rather than being silently ignored.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mongolock_async.testing import EmbeddedTLS
from tests.support.standins import MONGOD_PORT, Forwarder, Identity, StandIn

# mongod's default port by role (--configsvr and --shardsvr imply 27019 and 27018: docs,
# "Default MongoDB Port").
_DEFAULT_PORTS = {"--configsvr": 27019, "--shardsvr": 27018}
# Options that change nothing a client sees of a stand-in: where it listens inside its container
# (the stand-in listens on loopback, reached through its forwarders), its role in a cluster, the
# config servers of a mongos, and a shard's no-op writes for change streams (the embedded server
# answers change streams without them).
_IGNORED_FLAGS = {"--bind_ip_all", "--configsvr", "--shardsvr"}
_IGNORED_WITH_VALUE = {"--bind_ip", "--configdb"}
_IGNORED_PARAMETERS = {"periodicNoopIntervalSecs"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def container_id() -> str:
    """A host name as Docker gives a container: the first 12 hex digits of its id."""
    return secrets.token_hex(6)


def release_of(image: str) -> str | None:
    """The MongoDB release an image tag names (``mongo:8.0`` -> ``8.0.0``), if it names one."""
    tag = image.rpartition(":")[2]
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", tag):
        return None
    return tag if tag.count(".") == 2 else f"{tag}.0"


@dataclass
class Server:
    """One mongod or mongos of a job, started: its stand-in, its forwarders and its host name."""

    name: str
    standin: StandIn
    forwarders: list[Forwarder] = field(default_factory=list)

    def close(self) -> None:
        for forwarder in self.forwarders:
            forwarder.close()
        self.standin.close()


def standin_for(
    argv: list[str], *, host_name: str, names: tuple[str, ...], version: str | None, path_of: Callable[[str], Path]
) -> StandIn:
    """A stand-in for the server ``argv`` (``mongod ...`` or ``mongos ...``) starts, in a container
    named ``host_name`` (and ``names`` on its network) running MongoDB ``version``. ``path_of``
    maps a path inside the container to this machine's (its volumes)."""
    program, *options = argv
    if program not in ("mongod", "mongos"):
        raise ValueError(f"the rehearsal stands in for mongod and mongos only, not {program!r}")
    replica_set: str | None = None
    port: int | None = None
    test_commands = authenticates = False
    tls: dict[str, str] = {}
    role_port = MONGOD_PORT
    words = iter(options)
    for option in words:
        if option in _IGNORED_FLAGS:
            role_port = _DEFAULT_PORTS.get(option, role_port)
        elif option in _IGNORED_WITH_VALUE:
            next(words)
        elif option == "--replSet":
            replica_set = next(words)
        elif option == "--port":
            port = int(next(words))
        elif option in ("--keyFile", "--auth"):
            authenticates = True  # a keyfile turns authorization on (security.keyFile implies it)
            if option == "--keyFile":
                next(words)
        elif option == "--setParameter":
            parameter, _, value = next(words).partition("=")
            if parameter == "enableTestCommands":
                test_commands = value in ("1", "true")
            elif parameter not in _IGNORED_PARAMETERS:
                raise ValueError(f"the rehearsal's stand-in does not know the server parameter {parameter!r}")
        elif option in ("--tlsMode", "--tlsCertificateKeyFile", "--tlsCAFile"):
            tls[option] = next(words)
        elif option == "--tlsAllowConnectionsWithoutCertificates":
            tls[option] = ""
        else:
            raise ValueError(f"the rehearsal's stand-in does not know the {program} option {option!r}")
    if program == "mongos":
        replica_set = None
    identity = Identity(
        replica_set, port or role_port, host_name=host_name, names=names, version=version,
        localhost_exception=authenticates,
    )  # fmt: skip
    return StandIn(identity, test_commands=test_commands, tls=_tls(tls, path_of))


def _tls(options: Mapping[str, str], path_of: Callable[[str], Path]) -> EmbeddedTLS | None:
    """The embedded server's TLS for mongod's ``--tlsMode requireTLS`` with a certificate-and-key
    file and a CA file (the embedded server takes the certificate and the key apart). With a CA
    file, mongod asks every client for a certificate unless
    ``--tlsAllowConnectionsWithoutCertificates`` (net.tls.allowConnectionsWithoutCertificates)."""
    if not options:
        return None
    required = {"--tlsMode", "--tlsCertificateKeyFile", "--tlsCAFile"}
    if options.get("--tlsMode") != "requireTLS" or not required <= set(options):
        raise ValueError(f"the rehearsal's stand-in serves TLS as --tlsMode requireTLS with a key file and CA only: "
                         f"{dict(options)}")  # fmt: skip
    blocks = _pem_blocks(path_of(options["--tlsCertificateKeyFile"]).read_text())
    certificate = [block for block in blocks if "CERTIFICATE" in block.splitlines()[0]]
    key = [block for block in blocks if "PRIVATE KEY" in block.splitlines()[0]]
    if not certificate or not key:
        raise ValueError(f"{options['--tlsCertificateKeyFile']} holds no certificate and key")
    directory = Path(tempfile.mkdtemp(prefix="rehearsal-tls-"))
    (directory / "certificate.pem").write_text("".join(certificate))
    (directory / "key.pem").write_text("".join(key))
    ca = path_of(options["--tlsCAFile"])
    client_ca = None if "--tlsAllowConnectionsWithoutCertificates" in options else ca
    return EmbeddedTLS(directory / "certificate.pem", directory / "key.pem", ca, client_ca=client_ca)


def _pem_blocks(pem: str) -> list[str]:
    return [match.group(0) for match in re.finditer(r"-----BEGIN [A-Z ]+-----.*?-----END [A-Z ]+-----\n?", pem,
                                                     re.DOTALL)]  # fmt: skip


def server_command(service: Mapping[str, Any]) -> list[str]:
    """The mongod or mongos command line a compose service runs: its ``command`` (a list), or the
    part of a shell command (``entrypoint: [bash, -c]``) from the ``mongod``/``mongos`` it execs."""
    command = service.get("command") or []
    words = shlex.split(" ".join(command)) if service.get("entrypoint") else [str(word) for word in command]
    for index, word in enumerate(words):
        if word in ("mongod", "mongos"):
            return words[index:]
    raise ValueError(f"no mongod or mongos in the service's command: {command}")


def start_compose(compose_file: Path, env: Mapping[str, str], log: Callable[[str], None]) -> list[Server]:
    """Start a stand-in for every service of ``compose_file`` (its ``${VAR:-default}`` from
    ``env``), each reached where the compose file publishes it: its ``ports`` on 127.0.0.1, or with
    ``network_mode: host`` its own ``--port``."""
    document = yaml.safe_load(_substitute(compose_file.read_text(), env))
    servers: list[Server] = []
    try:
        for name, service in document["services"].items():
            servers.append(_start_service(name, service, compose_file.parent, log))
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def _start_service(name: str, service: Mapping[str, Any], base: Path, log: Callable[[str], None]) -> Server:
    volumes = [str(volume).split(":") for volume in service.get("volumes") or []]

    def path_of(inside: str) -> Path:
        for source, target, *_ in volumes:
            if inside == target or inside.startswith(target.rstrip("/") + "/"):
                return (base / source).resolve() / os.path.relpath(inside, target)
        raise ValueError(f"{name}: {inside} is not in a volume of this machine")

    version = release_of(str(service.get("image", "")))
    standin = standin_for(server_command(service), host_name=container_id(), names=(name,), version=version,
                          path_of=path_of)  # fmt: skip
    server = Server(name, standin)
    try:
        standin.start()
        assert standin.port is not None
        if service.get("network_mode") == "host":
            published = [(standin.identity.port, standin.identity.port)]
        else:
            published = [_published(str(port)) for port in service.get("ports") or []]
        for host_port, container_port in published:
            if container_port != standin.identity.port:
                raise ValueError(f"{name} publishes {container_port}, where nothing listens (it listens on "
                                 f"{standin.identity.port})")  # fmt: skip
            server.forwarders.append(Forwarder(("127.0.0.1", standin.port), ("127.0.0.1", host_port)).start())
        shown = ", ".join(f"127.0.0.1:{host}" for host, _ in published) or "no published port"
        log(f"{name}: {' '.join(server_command(service))} (MongoDB {version or '?'}, host "
            f"{standin.identity.host_name}) -> an embedded server, reached at {shown}")  # fmt: skip
    except BaseException:
        server.close()
        raise
    return server


def _published(port: str) -> tuple[int, int]:
    """``HOST:CONTAINER`` of a compose ``ports`` entry."""
    host, _, container = port.rpartition(":")
    return int(host or container), int(container)


def _substitute(text: str, env: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda match: env.get(match.group(1)) or match.group(2) or "", text)
