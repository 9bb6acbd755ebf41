"""Stand-ins for the MongoDB deployments the real-MongoDB workflow runs in Docker, as their clients
see them: embedded servers that advertise what those servers advertise, reached through port
forwarders the way a Docker port mapping reaches them.

A mongod in a container advertises the name its replica set configuration gives it (the workflow
initiates its members as ``localhost:27017`` or ``shard1:27018``), whatever port the client reaches
it through; a mongos lists itself in ``config.mongos`` as ``<its host name>:<its port>``
(``constructInstanceIdString``, src/mongo/s/sharding_uptime_reporter.cpp), and in a container its
host name is the container's id, which no one outside resolves. ``StandIn`` gives an embedded server
such an identity (its ``hello``, ``serverStatus`` and ``replSetInitiate``; for a mongos, ``addShard``,
``listShards`` and its ``config.mongos`` entry) and ``Forwarder`` a port of the client's choosing.

What a stand-in answers for a command MongoDB has and SecantusDB lacks is the least the workflow's
own steps need (``.ci/mongodb/initiate.py``): ``replSetInitiate`` checks that the configuration names
this member as it advertises itself, and ``addShard`` records its shard without reaching it.
Everything else is the embedded server's, quirks included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo

MONGOD_PORT = 27017
"""MongoDB's default port: ``serverStatus`` reports a server on it by host name alone
(``prettyHostName``, src/mongo/util/net/socket_utils.cpp)."""
MONGOS_PING_INTERVAL = 10.0
"""A mongos refreshes its ``config.mongos`` entry this often (``kUptimeReportInterval``,
src/mongo/s/sharding_uptime_reporter.cpp)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What a stand-in says it is: a mongod or mongos as its command line and container make it.

    - ``replica_set``: its ``--replSet`` (None: a mongos).
    - ``port``: its ``--port``, the port it believes it listens on, whatever port reaches it.
    - ``host_name``: its machine's host name (a container's id): ``serverStatus``'s ``host``, and
      with ``names``, the names ``replSetInitiate`` recognises as this server's own (a member is this
      server when its port is ``port`` and its host is one of them, ``localhost`` or ``127.0.0.1``;
      mongod asks each host whether it is itself, ``isSelf``, src/mongo/db/repl/isself.cpp).
    - ``advertised``, ``other_members``: already initiated as that member of a set listing those
      others too (the tests' shortcut for a set ``replSetInitiate`` has configured).
    - ``version``: the MongoDB release it reports (``buildInfo``); None: SecantusDB's own.
    - ``localhost_exception``: with authentication, let a client that has not authenticated
      initiate the set and create the first user while the server has none, as mongod does for a
      connection from localhost (narrowed to creating the first user: SERVER-12621,
      jstests/auth/localhostAuthBypass.js; the manual's keyfile deployment also initiates the set
      through it).
    """

    replica_set: str | None
    port: int = MONGOD_PORT
    host_name: str = "localhost"
    names: tuple[str, ...] = ()
    advertised: str | None = None
    other_members: tuple[str, ...] = ()
    version: str | None = None
    localhost_exception: bool = False

    @property
    def mongos(self) -> bool:
        return self.replica_set is None

    @property
    def instance_id(self) -> str:
        """How a mongos lists itself in ``config.mongos``: ``<host name>:<port>``."""
        return f"{self.host_name}:{self.port}"


# Runs in the server's process, before SecantusDB's command line: replaces the handlers of the
# commands that say what the server is (secantus.commands._HANDLERS, looked up per command), and
# wraps the dispatcher for the localhost exception (secantus.server imports it by name).
_IDENTITY_PATCH = """
import json as _json
import os as _os
import bson as _bson
import secantus.commands as _commands
import secantus.server as _server

_IDENTITY = _json.loads({identity!r})
_CONFIG_FILE = "standin-replica-set.json"
_SET_FIELDS = ("setName", "setVersion", "hosts", "passives", "arbiters", "secondary", "primary", "me",
               "electionId", "lastWrite")
_shards = []


def _config():
    if _IDENTITY["advertised"] is not None:
        return {{"me": _IDENTITY["advertised"], "hosts": [_IDENTITY["advertised"], *_IDENTITY["other_members"]]}}
    if _os.path.exists(_CONFIG_FILE):
        with open(_CONFIG_FILE) as stored:
            return _json.load(stored)
    return None


def _error(code, name, message):
    return {{"ok": 0.0, "errmsg": message, "code": code, "codeName": name}}


def _own(host):
    name, _, port = host.rpartition(":")
    own_names = {{"localhost", "127.0.0.1", _IDENTITY["host_name"], *_IDENTITY["names"]}}
    return port == str(_IDENTITY["port"]) and name.lower() in own_names


_hello = _commands._HANDLERS["hello"]


def _standin_hello(doc, ctx):
    reply = _hello(doc, ctx)
    if not reply.get("ok"):
        return reply
    for field in _SET_FIELDS:
        reply.pop(field, None)
    config = _config()
    if _IDENTITY["replica_set"] is None:
        reply["msg"] = "isdbgrid"
    elif config is None:
        # mongod before replSetInitiate: a member of no set yet, writable by no one.
        reply.update(isWritablePrimary=False, ismaster=False, secondary=False, isreplicaset=True,
                     info="Does not have a valid replica set config")
    else:
        reply.update(setName=_IDENTITY["replica_set"], setVersion=1, hosts=config["hosts"], me=config["me"],
                     primary=config["me"], secondary=False, electionId=_bson.ObjectId("7fffffff0000000000000001"))
    return reply


_server_status = _commands._HANDLERS["serverStatus"]


def _standin_server_status(doc, ctx):
    reply = _server_status(doc, ctx)
    port = _IDENTITY["port"]
    reply["host"] = _IDENTITY["host_name"] if port == {default_port} else f"{{_IDENTITY['host_name']}}:{{port}}"
    reply["process"] = "mongos" if _IDENTITY["replica_set"] is None else "mongod"
    if _IDENTITY["version"] is not None:
        reply["version"] = _IDENTITY["version"]
    return reply


_build_info = _commands._HANDLERS["buildInfo"]


def _standin_build_info(doc, ctx):
    reply = _build_info(doc, ctx)
    if _IDENTITY["version"] is not None:
        reply["version"] = _IDENTITY["version"]
        reply["versionArray"] = [int(part) for part in _IDENTITY["version"].split(".")] + [0]
    return reply


def _repl_set_initiate(doc, ctx):
    if _IDENTITY["replica_set"] is None:
        return _error(59, "CommandNotFound", "no such command: 'replSetInitiate'")
    if _config() is not None:
        return _error(23, "AlreadyInitialized", "already initialized")
    config = doc.get("replSetInitiate") or {{}}
    if config.get("_id") != _IDENTITY["replica_set"]:
        return _error(93, "InvalidReplicaSetConfig",
                      f"Attempting to initiate a replica set with name {{config.get('_id')}}, but command line "
                      f"reports {{_IDENTITY['replica_set']}}; rejecting")
    hosts = [str(member.get("host")) for member in config.get("members") or []]
    own = [host for host in hosts if _own(host)]
    if len(own) != 1:
        return _error(74, "NodeNotFound",
                      f"No host described in new configuration with {{{{version: 1, term: 0}}}} for replica set "
                      f"{{config.get('_id')}} maps to this node" if not own else f"{{own}} all map to this node")
    with open(_CONFIG_FILE, "w") as out:
        _json.dump({{"me": own[0], "hosts": hosts}}, out)
    return {{"ok": 1.0}}


def _add_shard(doc, ctx):
    if _IDENTITY["replica_set"] is not None:
        return _error(59, "CommandNotFound", "no such command: 'addShard'")
    spec = doc.get("addShard")
    name = spec.partition("/")[0]
    if all(shard["_id"] != name for shard in _shards):
        _shards.append({{"_id": name, "host": spec, "state": 1}})
    return {{"shardAdded": name, "ok": 1.0}}


def _list_shards(doc, ctx):
    if _IDENTITY["replica_set"] is not None:
        return _error(59, "CommandNotFound", "no such command: 'listShards'")
    return {{"shards": list(_shards), "ok": 1.0}}


for _name in ("hello", "isMaster", "ismaster"):
    _commands._HANDLERS[_name] = _standin_hello
_commands._HANDLERS["serverStatus"] = _standin_server_status
for _name in ("buildInfo", "buildinfo"):
    _commands._HANDLERS[_name] = _standin_build_info
_commands._HANDLERS["replSetInitiate"] = _repl_set_initiate
_commands._HANDLERS["addShard"] = _add_shard
_commands._HANDLERS["listShards"] = _list_shards
# mongod lets any user kill its own cursors (killCursors, "Kill Own Cursors", SERVER-36829); the
# embedded server asks for the killCursors action.
_commands._NO_PRIVILEGE_COMMANDS = _commands._NO_PRIVILEGE_COMMANDS | {{"killCursors"}}

_LOCALHOST_EXCEPTION = frozenset(("replSetInitiate", "createUser"))
_dispatch = _server.dispatch
_users_exist = []


def _standin_dispatch(doc, ctx):
    if _IDENTITY["localhost_exception"] and ctx.require_auth and not _users_exist:
        authenticated = ctx.connection_auth is not None and ctx.connection_auth.is_authenticated
        if not authenticated and _commands.command_name(doc) in _LOCALHOST_EXCEPTION:
            if ctx.storage.list_users("admin"):
                _users_exist.append(True)
            else:
                ctx.require_auth = False
    return _dispatch(doc, ctx)


_server.dispatch = _standin_dispatch
"""


class StandIn(EmbeddedMongo):
    """An embedded server (see ``EmbeddedMongo``'s options) that says it is ``identity``; a
    mongos's ``config.mongos`` entry is refreshed as a mongos refreshes its own."""

    def __init__(self, identity: Identity, **options: Any) -> None:
        super().__init__(**options)
        self.identity = identity
        self._pinging = threading.Event()
        self._pinger: threading.Thread | None = None

    def _launch(self, *, auth: bool, tls: bool) -> None:
        # With the localhost exception the server enforces authentication from its first start and
        # has no user: the workflow's initiate.py creates the first one through the exception.
        super()._launch(auth=auth or self.identity.localhost_exception, tls=tls)

    def _launch_code(self, *, tls: bool) -> str:
        patch = _IDENTITY_PATCH.format(identity=json.dumps(asdict(self.identity)), default_port=MONGOD_PORT)
        return patch + super()._launch_code(tls=tls)

    def start(self) -> str:
        uri = super().start()
        if self.identity.mongos and self._pinger is None:
            self._pinging.clear()
            self._pinger = threading.Thread(target=self._ping_config, name="stand-in mongos ping", daemon=True)
            self._pinger.start()
        return uri

    def close(self) -> None:
        if self._pinger is not None:
            self._pinging.set()
            self._pinger.join()
            self._pinger = None
        super().close()

    def _ping_config(self) -> None:
        started = time.monotonic()
        client: MongoClient[dict[str, Any]]
        with MongoClient(self.uri, serverSelectionTimeoutMS=5_000) as client:
            while True:
                with contextlib.suppress(Exception):  # best effort, as mongos's own report
                    client["config"]["mongos"].update_one(
                        {"_id": self.identity.instance_id},
                        {"$set": {
                            "ping": datetime.now(UTC),
                            "up": int(time.monotonic() - started),
                            "waiting": True,
                            "mongoVersion": self.identity.version or "8.0.0",
                            "advisoryHostFQDNs": [],
                        }},
                        upsert=True,
                    )  # fmt: skip
                if self._pinging.wait(MONGOS_PING_INTERVAL):
                    return


class Forwarder:
    """Forward every TCP connection to ``listen`` (host, port; port 0: one the OS picks) to
    ``target``, byte for byte, as a Docker port mapping does. Runs its own event loop in a thread."""

    def __init__(self, target: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.target = target
        self.listen = listen
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="forwarder", daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def start(self) -> Forwarder:
        self._thread.start()
        started: Future[asyncio.Server] = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self._server = started.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
            self._server = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._accepted, *self.listen, reuse_address=True)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for connection in list(self._connections):
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                target_reader, target_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return  # nothing listens there: the client sees its connection closed
            try:
                await asyncio.gather(_pump(reader, target_writer), _pump(target_reader, writer))
            except asyncio.CancelledError:
                pass  # the forwarder closes: so does every connection through it
            finally:
                target_writer.close()
        finally:
            writer.close()
            self._connections.discard(task)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    with contextlib.suppress(OSError):
        sink.write_eof()
