"""``mongolock check``: measure a deployment against the library's contract, then remove what it wrote.

The sections run in this order: the server's facts; privileges tried without writing; the
collection, read before anything is written; the checks that write (durability, the Stable API,
wake-ups), only if the scratch documents can be removed again; the clocks; ``--perf``. Every write
is to a lock name under one scratch prefix, and the scratch documents are removed in a ``finally``
that also runs when the check is interrupted (Ctrl-C, SIGTERM: the main task is cancelled, the
clean-up runs, and the exit code is 130 or 143; a second signal stops the clean-up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import pymongo
from pymongo import AsyncMongoClient
from pymongo.asynchronous.uri_parser import parse_uri
from pymongo.errors import ConfigurationError, ConnectionFailure, OperationFailure, PyMongoError
from pymongo.server_api import ServerApi
from pymongo.topology_description import TOPOLOGY_TYPE
from pymongo.write_concern import WriteConcern

from ..._runtime.lease import default_safety_margin
from ..._util.collection_types import AsyncClient
from ..._util.diagnosis import cause_of
from ..._util.shield import RequestTimeout
from ..._version import __version__
from ...errors import LockTimeoutError, ServerUnreachableError
from ...store import LockStore, replication
from ...store.probe import DeploymentProbe, is_refusal, new_scratch_prefix
from ..commandline import (
    EXIT_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UserError,
    client_options,
    connect,
    explain,
    redact_uri,
)
from ..report_view import print_json, utf8_stdout
from .deployment import (
    judge_arbiters,
    judge_collection_options,
    judge_failover,
    judge_journaling,
    judge_members,
    judge_oplog,
    judge_support,
)
from .perf import HAND_OFF_BOUND, PerfOptions, hand_off_latencies, holder_of_check, measure
from .verdicts import (
    ACCEPTED,
    FAIL,
    NOT_TRIED,
    PASS,
    REFUSED,
    WAKE_UP_WARN_S,
    WARN,
    Check,
    ClockReading,
    as_payload,
    as_text,
    clock_reading,
    exit_code,
    judge_clocks,
    judge_documents,
    judge_earlier_scratch,
    judge_indexes,
    judge_majority_writes,
    judge_privileges,
    judge_version,
    ms,
    paragraph,
    percentile,
    skipped,
    summary,
)

CLOCK_SAMPLES = 5
"""Reads of each server's clock; the one with the shortest round trip counts."""
MONGOS_ACTIVE_S = 60
"""A mongos that pinged ``config.mongos`` in the last minute is up (as ``sh.status()`` counts them)."""
_REQUIRES_API_VERSION = 498870  # "The apiVersion parameter is required" (requireApiVersion)
_API_STRICT_ERROR = 323
_NOT_FOR_ONE_HOST = ("replicaset", "directconnection", "loadbalanced", "srvservicename", "srvmaxhosts")
_CLEAN_UP_BOUND = 20.0
LOST_SERVER_BOUND = 2.0
"""Seconds the clean-up (tried once) and the closing of the clients get together once MongoDB
was found unreachable: the driver's deadline (``pymongo.timeout``) for all their requests. The
server was waited for a whole server selection timeout already; waiting as long again for each
request would only delay the report."""
_NOT_SUPPORTED = (59, 26, 115)  # CommandNotFound, NamespaceNotFound, CommandNotSupported
EXIT_CHECK_FAILED = 2
"""``mongolock check``'s exit code when a check failed (or the check could not go on)."""
WRITE_BOUND = 30.0
"""Seconds a write of the durability check may take before it is reported as not committed."""


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What ``mongolock check`` checks, and where."""

    uri: str
    database: str
    collection: str
    ttl: float = 30.0
    """The smallest TTL the user's locks use, seconds."""
    safety_margin: float | None = None
    """The locks' safety margin (default: the library's, 10 % of the TTL, at most 1 s)."""
    read_only: bool = False
    writes: int = 20
    scan_limit: int = 10_000
    perf: PerfOptions | None = None

    @property
    def margin(self) -> float:
        return default_safety_margin(self.ttl) if self.safety_margin is None else self.safety_margin


def options_from(arguments: argparse.Namespace) -> CheckOptions:
    """The options of ``mongolock check``, checked before any I/O (a ``UserError`` names the bad one)."""

    def positive(name: str, value: float, *, integer: bool = False, at_most: float | None = None) -> None:
        if not math.isfinite(value) or value <= 0 or (integer and value != int(value)):
            kind = "whole number" if integer else "number"
            raise UserError(f"--{name} must be a positive {kind}, got {value:g}", EXIT_USAGE)
        if at_most is not None and value > at_most:
            raise UserError(f"--{name} must be at most {at_most:g}, got {value:g}", EXIT_USAGE)

    positive("ttl", arguments.ttl, at_most=366 * 86_400)
    if arguments.safety_margin is not None and not 0 <= arguments.safety_margin < arguments.ttl:
        raise UserError("--safety-margin must be at least 0 and smaller than --ttl", EXIT_USAGE)
    positive("writes", arguments.writes, integer=True, at_most=10_000)
    positive("scan-limit", arguments.scan_limit, integer=True)
    perf = None
    if arguments.perf:
        if arguments.read_only:
            raise UserError("--perf writes scratch locks: it cannot run with --read-only", EXIT_USAGE)
        positive("perf-cycles", arguments.perf_cycles, integer=True, at_most=100_000)
        positive("perf-hand-offs", arguments.perf_hand_offs, integer=True, at_most=10_000)
        positive("perf-seconds", arguments.perf_seconds, at_most=3600)
        positive("perf-leases", arguments.perf_leases, integer=True, at_most=100_000)
        positive("perf-duration", arguments.perf_duration, at_most=3600)
        perf = PerfOptions(
            cycles=arguments.perf_cycles,
            hand_offs=arguments.perf_hand_offs,
            seconds=arguments.perf_seconds,
            leases=arguments.perf_leases,
            load_seconds=arguments.perf_duration,
        )
    if not arguments.uri:
        raise UserError("no MongoDB URI: pass --uri or set MONGODB_URI", EXIT_USAGE)
    return CheckOptions(
        uri=arguments.uri,
        database=arguments.db,
        collection=arguments.collection,
        ttl=arguments.ttl,
        safety_margin=arguments.safety_margin,
        read_only=arguments.read_only,
        writes=arguments.writes,
        scan_limit=arguments.scan_limit,
        perf=perf,
    )


class Progress:
    """What the check is doing, on one line of stderr that each step overwrites: only on a
    terminal, so that output redirected to a file or read by CI stays clean."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._shown = False

    def step(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\x1b[K{text[:100]} ...")
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False


@dataclass
class Scratch:
    """The check's scratch documents: their prefix, whether any may have been written, and what the
    clean-up removed and left."""

    prefix: str = field(default_factory=new_scratch_prefix)
    written: bool = False
    removed: int = 0
    left: int | None = None
    clean_up_error: str | None = None
    """Why the clean-up failed (None: it did not, or did not run)."""
    clean_up_unreachable: bool = False
    """Whether it failed for want of a server (the command then exits 3)."""

    def as_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "written": self.written, "removed": self.removed, "left": self.left or 0,
                "clean_up_error": self.clean_up_error}  # fmt: skip


@dataclass
class _Facts:
    """What earlier sections learnt that later ones need."""

    hello: dict[str, Any] = field(default_factory=dict)
    kind: str = "standalone"
    api_required: bool = False
    change_streams: bool = False
    transactions: bool = False
    collection_exists: bool | None = None
    auth: dict[str, Any] = field(default_factory=dict)
    attempts: dict[str, tuple[str, str]] = field(default_factory=dict)
    can_write: bool = False
    why_not_write: str = ""


@dataclass
class CheckRun:
    """A finished check: every check made, and what the JSON output says about the run."""

    checks: list[Check]
    header: dict[str, Any]


async def run_checks(options: CheckOptions, scratch: Scratch, progress: Progress | None = None) -> CheckRun:
    """Every check on ``options``' deployment. ``scratch`` records what was written and removed,
    also when the run is interrupted. Unreachable servers and rejected credentials raise a
    ``UserError`` with the command's exit code for them."""
    progress = progress or Progress(enabled=False)
    started_at, started = datetime.now(UTC), time.monotonic()
    checks: list[Check] = []
    facts = _Facts()
    client = connect(options.uri)
    clients = [client]
    probe: DeploymentProbe | None = None
    unreachable = False
    try:
        try:
            progress.step("connecting")
            client, facts.api_required = await _reachable(client, options.uri, clients)
            probe = DeploymentProbe(client, options.database, options.collection)
            await _server(probe, client, facts, checks, progress)
            await _read_privileges(probe, facts, progress)
            progress.step("reading the collection")
            await _guarded(checks, "collection", "documents", _collection(probe, options, facts, scratch))
            progress.step("reading the replica set's health")
            await _guarded(checks, "replication", "members", _depth(probe, client, options, facts))
            if options.read_only:
                for action in ("remove", "insert", "update", "createIndex", "collMod"):
                    facts.attempts[action] = (NOT_TRIED, "--read-only sends no write")
                facts.why_not_write = "--read-only"
            else:
                facts.can_write, facts.why_not_write = await _may_write(probe, facts, scratch)
            if facts.can_write:
                scratch.written = True
                await _writes(probe, options, facts, checks, scratch, clients, progress)
            else:
                for section, name in (("durability", "majority write"), ("server", "wake-ups")):
                    checks.append(skipped(section, name, facts.why_not_write))
            await _guarded(checks, "server", "stable API", _stable_api(options, facts, scratch, clients))
            checks.extend(judge_privileges(facts.attempts, facts.auth, options.database, options.collection))
            progress.step("reading the clocks")
            await _guarded(checks, "clocks", "agreement", _clocks(probe, client, options, facts, clients))
            if options.perf is not None:
                if facts.can_write:
                    other = connect(options.uri, **_api(facts))
                    clients.append(other)
                    await _guarded(
                        checks, "perf", "measurements",
                        measure(probe, other, scratch.prefix, options.ttl, options.perf, progress.step,
                                change_streams=facts.change_streams),
                    )  # fmt: skip
                else:
                    checks.append(skipped("perf", "measurements", facts.why_not_write))
        except (PyMongoError, ServerUnreachableError) as error:
            # Unreachable (3) and rejected credentials (6) keep the command's exit codes; anything
            # else that stopped the whole check is a failure of it (2). A lock that could not reach
            # the server (--perf's) says so with the driver's error as its cause.
            driver_error = error if isinstance(error, PyMongoError) else error.__cause__
            if not isinstance(driver_error, PyMongoError):
                unreachable = True
                raise UserError(f"cannot reach MongoDB: {error}", EXIT_UNREACHABLE) from None
            explained = await explain(driver_error, options.uri, client)
            unreachable = explained.exit_code == EXIT_UNREACHABLE
            if explained.exit_code == EXIT_FAILED:
                explained.exit_code = EXIT_CHECK_FAILED
            raise explained from None
    finally:
        progress.step("removing the scratch documents")
        try:
            await _clean_up_and_close(probe if scratch.written else None, scratch, clients, server_lost=unreachable)
        finally:
            progress.clear()
    header = {
        "uri": redact_uri(options.uri),
        "database": options.database,
        "collection": options.collection,
        "ttl_s": options.ttl,
        "safety_margin_s": options.margin,
        "read_only": options.read_only,
        "perf": options.perf is not None,
        "started_at": started_at.isoformat().replace("+00:00", "Z"),
        "duration_s": round(time.monotonic() - started, 3),
        "scratch": scratch.as_dict(),
        "versions": {"mongolock_async": __version__, "pymongo": version("pymongo")},
    }
    if scratch.clean_up_error is not None:
        checks.append(_clean_up_failure(scratch, options))
    return CheckRun(checks, header)


async def _depth(probe: DeploymentProbe, client: AsyncClient, options: CheckOptions, facts: _Facts) -> list[Check]:
    """The checks at the depth of ``rs.status()``: the release's support, the collection's options,
    and on a replica set its members, lag, oplog window, failover gap, arbiters and journaling.
    What this user may not read (they need ``clusterMonitor``) or this server does not support is
    reported as not run, and why."""
    entry, why_not_options = await _readable(replication.collection_options(probe.database, options.collection))
    checks = [
        judge_support(await probe.build_info(), datetime.now(UTC).date()),
        skipped("collection", "options", f"listCollections: {why_not_options}")
        if why_not_options
        else judge_collection_options(entry),
    ]
    if facts.kind != "replica set":
        where = "through mongos: run the check with each shard's replica set URI" if facts.kind == "sharded" else (
            "no replica set here")  # fmt: skip
        return [*checks, skipped("replication", "members", f"{where} ({facts.kind})")]
    checks.append(judge_arbiters(facts.hello))
    status, why_not_status = await _readable(replication.replica_set_status(client))
    config, why_not_config = await _readable(replication.replica_set_config(client))
    if status is None:
        checks.append(skipped("replication", "members", f"replSetGetStatus: {why_not_status}"))
    else:
        checks.extend(judge_members(status, config, options.ttl))
        checks.append(judge_failover(config, status, options.ttl, options.margin, why_not_config or ""))
    checks.append(
        judge_journaling(config)
        if config is not None
        else skipped("replication", "journaling", f"replSetGetConfig: {why_not_config}")
    )
    span, why_not_oplog = await _readable(replication.oplog_span(client))
    oplog = skipped("replication", "oplog window", f"local.oplog.rs: {why_not_oplog}") if why_not_oplog else None
    checks.append(oplog or judge_oplog(span))
    return checks


async def _readable(work: Awaitable[Any]) -> tuple[Any, str | None]:
    """What ``work`` read, or None and why it could not: refused to this user, or not a command this
    server has. Any other failure is raised."""
    try:
        return await work, None
    except OperationFailure as error:
        if is_refusal(error):
            return None, f"refused to this user ({_reason(error)}; clusterMonitor grants it)"
        if error.code in _NOT_SUPPORTED:
            return None, f"not supported by this server ({_reason(error)})"
        raise


async def _guarded(checks: list[Check], section: str, name: str, work: Awaitable[list[Check] | Check | None]) -> None:
    """Add what ``work`` checked; a command MongoDB refused becomes a failed check of its own
    (the rest of the check goes on); losing the server ends the check."""
    try:
        result = await work
    except (ConnectionFailure, ConfigurationError):
        raise
    except (PyMongoError, RequestTimeout, TimeoutError, RuntimeError) as error:
        if isinstance(error, LockTimeoutError) and isinstance(error.__cause__, PyMongoError) and error.unreachable:
            # Not a slow lock: MongoDB could not be reached (--perf's locks), which ends the check
            # with the driver's error, as any other request of it that could not reach the server.
            raise error.__cause__ from None
        message = str((getattr(error, "details", None) or {}).get("errmsg") or error) or type(error).__name__
        checks.append(
            Check(
                section=section,
                name=name,
                verdict=FAIL,
                measured=f"could not be measured: {message}",
                fix="see the error; rerun with the fix",
            )
        )
        return
    if isinstance(result, Check):
        checks.append(result)
    elif result:
        checks.extend(result)


def _api(facts: _Facts) -> dict[str, Any]:
    """Client options for this deployment: the Stable API where the server requires it."""
    return {"server_api": ServerApi("1")} if facts.api_required else {}


async def _reachable(client: AsyncClient, uri: str, clients: list[Any]) -> tuple[Any, bool]:
    """The client once a ``ping`` went through, and whether the server requires the Stable API
    (``requireApiVersion``: it refuses commands without ``apiVersion`` with code 498870,
    mongodb/mongo src/mongo/db/initialize_api_parameters.cpp); then a client that declares V1."""
    try:
        await client.admin.command("ping")
        return client, False
    except OperationFailure as error:
        if error.code != _REQUIRES_API_VERSION:
            raise
    declared = connect(uri, server_api=ServerApi("1"))
    clients.append(declared)
    await declared.admin.command("ping")
    return declared, True


# -- the server ------------------------------------------------------------------------------------


async def _server(
    probe: DeploymentProbe, client: AsyncClient, facts: _Facts, checks: list[Check], progress: Progress
) -> None:
    progress.step("asking the server what it is")
    facts.hello = hello = await probe.hello()
    build = await probe.build_info()
    fcv = await probe.feature_compatibility()
    checks.append(judge_version(build, fcv, hello.get("maxWireVersion")))
    facts.kind, shown = _topology(hello, client)
    if facts.kind == "standalone":
        checks.append(
            Check(
                section="server",
                name="topology",
                verdict=WARN,
                measured=shown,
                fix=(
                    "run a replica set (one member is enough): without one there are no change streams (waiters poll "
                    "with backoff) and no transactions (guard_transaction)"
                ),
                figures={"kind": facts.kind},
            )
        )
    else:
        checks.append(Check(
            section="server",
            name="topology",
            verdict=PASS,
            measured=shown,
            fix=None,
            figures={"kind": facts.kind},
        ))
    facts.auth = await probe.authentication()

    try:
        await probe.try_change_stream()
        facts.change_streams = True
        facts.attempts["changeStream"] = (ACCEPTED, "")
        checks.append(Check(
            section="server",
            name="change streams",
            verdict=PASS,
            measured="a change stream on the lock collection opens",
            fix=None,
            figures={"works": True},
        ))  # fmt: skip
    except OperationFailure as error:
        reason = _reason(error)
        if is_refusal(error):
            facts.attempts["changeStream"] = (REFUSED, reason)
            fix = "grant changeStream on the lock collection (see Privileges)"
        else:
            facts.attempts["changeStream"] = (NOT_TRIED, f"change streams do not work here: {reason}")
            fix = "change streams need a replica set or a sharded cluster: waiters poll with backoff meanwhile"
        checks.append(Check(
            section="server",
            name="change streams",
            verdict=WARN,
            measured=f"not available: {reason}",
            fix=fix,
            figures={"works": False},
        ))

    try:
        await probe.read_in_transaction()
        facts.transactions = True
        checks.append(Check(
            section="server",
            name="transactions",
            verdict=PASS,
            measured="a transaction on the lock collection commits",
            fix=None,
            figures={"works": True},
        ))  # fmt: skip
    except OperationFailure as error:
        checks.append(
            Check(
                section="server",
                name="transactions",
                verdict=WARN,
                measured=f"not available: {_reason(error)}",
                fix=(
                    "guard_transaction (tying writes to a lease) needs a replica set or a sharded cluster; the locks "
                    "themselves work without"
                ),
                figures={"works": False},
            )
        )


def _topology(hello: dict[str, Any], client: AsyncClient) -> tuple[str, str]:
    if client.topology_description.topology_type == TOPOLOGY_TYPE.LoadBalanced:
        return "load balanced", "mongos behind a load balancer"
    if hello.get("msg") == "isdbgrid":
        known = sorted(f"{host}:{port}" for host, port in client.topology_description.server_descriptions())
        return "sharded", f"sharded cluster, through mongos {', '.join(known)}"
    if hello.get("setName"):
        hosts = list(hello.get("hosts") or [])
        others = len(hello.get("passives") or []) + len(hello.get("arbiters") or [])
        extra = f" and {others} that cannot become primary" if others else ""
        return "replica set", (
            f"replica set {hello['setName']!r}: {len(hosts)} member{'s' if len(hosts) != 1 else ''} that can "
            f"become primary{extra}; primary {hello.get('primary')}"
        )
    return "standalone", "a standalone server"


def _reason(error: BaseException) -> str:
    details = getattr(error, "details", None) or {}
    return str(details.get("errmsg") or cause_of(error))


# -- privileges ------------------------------------------------------------------------------------


async def _read_privileges(probe: DeploymentProbe, facts: _Facts, progress: Progress) -> None:
    """The actions a read can show: find, listCollections, listIndexes (changeStream was tried
    with the change streams)."""
    progress.step("trying what this user may read")

    async def attempt(action: str, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            result = await work()
        except OperationFailure as error:
            facts.attempts[action] = (REFUSED if is_refusal(error) else NOT_TRIED, _reason(error))
            return None
        facts.attempts[action] = (ACCEPTED, "")
        return result

    await attempt("find", probe.try_find)
    facts.collection_exists = await attempt("listCollections", probe.try_list_collections)


async def _may_write(probe: DeploymentProbe, facts: _Facts, scratch: Scratch) -> tuple[bool, str]:
    """Try the writes a lock needs without leaving anything written, and whether the check may
    write scratch documents: only if it can remove them again."""
    for action in ("remove", "insert", "update"):
        try:
            if facts.transactions:
                if action == "insert" and facts.collection_exists is not True:
                    # An insert in a transaction could create the collection; the check's own writes
                    # (the library's acquire, an upsert) show this action instead.
                    facts.attempts[action] = (NOT_TRIED, "the collection may not exist yet")
                    continue
                await probe.try_in_aborted_transaction(action, scratch.prefix + "tried")
            elif action == "remove":
                await probe.try_remove_nothing(scratch.prefix)
            elif action == "update":
                await probe.try_update_nothing(scratch.prefix + "tried")
            else:
                facts.attempts[action] = (NOT_TRIED, "no transactions here to try it in")
                continue
        except OperationFailure as error:
            facts.attempts[action] = (REFUSED if is_refusal(error) else NOT_TRIED, _reason(error))
            continue
        facts.attempts[action] = (ACCEPTED, "")
    if facts.collection_exists:
        try:
            await probe.try_create_index()
            facts.attempts["createIndex"] = (ACCEPTED, "")
        except OperationFailure as error:
            facts.attempts["createIndex"] = (REFUSED if is_refusal(error) else NOT_TRIED, _reason(error))
    else:
        facts.attempts["createIndex"] = (NOT_TRIED, "the collection may not exist yet")
    facts.attempts.setdefault(
        "collMod",
        (NOT_TRIED, "not tried: even an empty collMod takes the collection's exclusive lock"),
    )
    removal = facts.attempts["remove"]
    if removal[0] != ACCEPTED:
        return False, f"this user cannot remove the check's scratch documents afterwards ({removal[1]})"
    refused = [action for action in ("insert", "update") if facts.attempts[action][0] == REFUSED]
    if refused:
        return False, f"this user may not take locks ({' and '.join(refused)} refused; see Privileges)"
    return True, ""


# -- the collection --------------------------------------------------------------------------------


async def _collection(probe: DeploymentProbe, options: CheckOptions, facts: _Facts, scratch: Scratch) -> list[Check]:
    checks: list[Check] = []
    try:
        indexes = await probe.try_list_indexes()
        facts.attempts["listIndexes"] = (ACCEPTED, "")
        checks.append(judge_indexes(indexes))
    except OperationFailure as error:
        facts.attempts["listIndexes"] = (REFUSED if is_refusal(error) else NOT_TRIED, _reason(error))
        checks.append(judge_indexes(None, _reason(error)))
    scanned = await probe.scan(limit=options.scan_limit, own_prefix=scratch.prefix)
    if facts.collection_exists is None and scanned.total:
        facts.collection_exists = True  # listCollections was refused, but it has documents
    documents = judge_documents(
        scanned.total, scanned.documents, len(scanned.documents) >= scanned.total, options.database,
        options.collection,
    )  # fmt: skip
    if facts.collection_exists is False:
        first = documents[0]
        first.measured = f"{options.database}.{options.collection} does not exist yet (the first lock creates it)"
        if not options.read_only:
            first.measured += "; this check's writes create it, and it stays, empty"
    checks.extend(documents)
    earlier = judge_earlier_scratch(scanned.earlier_scratch, options.database, options.collection)
    if earlier is not None:
        checks.append(earlier)
    return checks


# -- the checks that write -------------------------------------------------------------------------


async def _writes(
    probe: DeploymentProbe,
    options: CheckOptions,
    facts: _Facts,
    checks: list[Check],
    scratch: Scratch,
    clients: list[Any],
    progress: Progress,
) -> None:
    progress.step(f"timing {options.writes} majority writes")
    await _guarded(checks, "durability", "majority write", _durability(probe, options, facts, scratch))
    progress.step("handing a lock to another connection")
    other = connect(options.uri, **_api(facts))
    clients.append(other)
    await _guarded(checks, "server", "wake-ups", _wake_ups(probe, other, options, facts, scratch))


async def _durability(probe: DeploymentProbe, options: CheckOptions, facts: _Facts, scratch: Scratch) -> Check:
    """The library's own acquire and release, each a ``findAndModify``, timed with its majority
    write concern and, taking turns, with ``w: 1`` (what replication adds)."""
    name = scratch.prefix + "durability"
    ttl_ms = round(options.ttl * 1000)
    holder = holder_of_check()
    w1 = LockStore(probe.lock_collection, WriteConcern(w=1))
    majority: list[float] = []
    single: list[float] = []
    try:
        while len(majority) < options.writes:
            for store, samples in ((probe.store, majority), (w1, single)):
                owner = secrets.token_hex(16)
                started = time.perf_counter()
                state = await store.try_acquire(name, owner, ttl_ms, holder, bound=WRITE_BOUND)
                samples.append(time.perf_counter() - started)
                started = time.perf_counter()
                await store.release(name, owner, bound=WRITE_BOUND)
                samples.append(time.perf_counter() - started)
                if state.owner != owner:
                    raise RuntimeError(f"the scratch lock {name!r} was not taken by its only user")
    except OperationFailure as error:
        if not is_refusal(error):
            return judge_majority_writes([], [], options.ttl, _reason(error))
        for action in ("insert", "update"):
            if facts.attempts.get(action, (NOT_TRIED, ""))[0] != ACCEPTED:
                facts.attempts[action] = (REFUSED, f"the library's acquire: {_reason(error)}")
        return skipped("durability", "majority write", f"the library's acquire was refused: {_reason(error)}")
    except RequestTimeout:
        return judge_majority_writes([], [], options.ttl, f"no acknowledgement within {WRITE_BOUND:g} s")
    for action in ("insert", "update"):
        if facts.attempts.get(action, (NOT_TRIED, ""))[0] != REFUSED:
            facts.attempts[action] = (ACCEPTED, "")
    return judge_majority_writes(majority[: options.writes], single, options.ttl)


async def _wake_ups(
    probe: DeploymentProbe, other: Any, options: CheckOptions, facts: _Facts, scratch: Scratch
) -> Check:
    """Three hand-offs of a scratch lock between this client and another (its own connections,
    its own change stream), timed from the release to the waiter's grant."""
    try:
        latencies = await hand_off_latencies(probe, other, scratch.prefix + "wake-up", options.ttl, 3)
    except TimeoutError as error:
        return Check(
            section="server",
            name="wake-ups",
            verdict=FAIL,
            measured=str(error) or f"a waiter was not woken within {HAND_OFF_BOUND:g} s of a release",
            fix=(
                "change events do not reach waiting processes: check the change-stream privileges and that the "
                "deployment delivers change events (see Deploying, Sharding the lock collection)"
            ),
        )
    worst = max(latencies)
    how = "through the change stream" if facts.change_streams else "by polling (no change streams)"
    figures = {"hand_offs": len(latencies), "p50_ms": percentile(latencies, 50) * 1000, "max_ms": worst * 1000}
    shown = (
        f"a release woke a waiter on another connection {how}: p50 {ms(percentile(latencies, 50))}, at most "
        f"{ms(worst)} over {len(latencies)} hand-offs"
    )
    if worst > WAKE_UP_WARN_S:
        fix = (
            "on a sharded cluster, lower periodicNoopIntervalSecs on each shard's mongod (docs: Deploying, Sharding "
            "the lock collection)"
            if facts.kind == "sharded"
            else "waiters learn of releases late: run a replica set, and check the change stream's delivery"
        )
        return Check(section="server", name="wake-ups", verdict=WARN, measured=shown, fix=fix, figures=figures)
    return Check(section="server", name="wake-ups", verdict=PASS, measured=shown, fix=None, figures=figures)


async def _stable_api(options: CheckOptions, facts: _Facts, scratch: Scratch, clients: list[Any]) -> Check:
    """The library's requests through a client that declares the Stable API's V1 strictly: an
    acquire and a release of a scratch lock, or (without writes) a read of lock state."""
    strict: AsyncMongoClient[dict[str, Any]] = connect(options.uri, server_api=ServerApi("1", strict=True))
    clients.append(strict)
    store = LockStore(strict[options.database][options.collection], WriteConcern(w="majority"))
    required = (
        'required by this deployment (requireApiVersion): your clients must pass server_api=ServerApi("1")'
        if facts.api_required
        else "not required by this deployment"
    )
    try:
        if facts.can_write:
            owner = secrets.token_hex(16)
            name = scratch.prefix + "stable-api"
            await store.try_acquire(name, owner, round(options.ttl * 1000), holder_of_check(), bound=30)
            await store.release(name, owner, bound=30)
            what = "acquire and release"
        else:
            await store.report([scratch.prefix + "stable-api"])
            what = "read of lock state"
    except OperationFailure as error:
        if is_refusal(error):
            return skipped("server", "stable API", f"this user was refused ({_reason(error)}; see Privileges)")
        if error.code != _API_STRICT_ERROR:
            raise
        return Check(
            section="server",
            name="stable API",
            verdict=FAIL,
            measured=(
                f"{required}; a strict API V1 client's {'acquire' if facts.can_write else 'read'} was refused: "
                f"{_reason(error)}"
            ),
            fix="use ServerApi(\"1\", strict=False), or upgrade MongoDB 5.0 to a release with SERVER-60899",
            figures={"required": facts.api_required, "strict_v1": False},
        )
    return Check(
        section="server",
        name="stable API",
        verdict=PASS,
        measured=f"{required}; a strict API V1 client's {what} was accepted",
        fix=None,
        figures={"required": facts.api_required, "strict_v1": True},
    )


# -- the clocks ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DecidingServer:
    """A server whose clock can decide expiry: its ``name`` as the deployment advertises it (None:
    the URI's one server), its ``role``, and ``reached_at``, the address this client reached it
    at when that is not its name (a mapped port, a proxy, a name only its own network resolves)."""

    name: str | None
    role: str
    reached_at: str | None = None


async def _clocks(
    probe: DeploymentProbe, client: AsyncClient, options: CheckOptions, facts: _Facts, clients: list[Any]
) -> list[Check]:
    """Every clock that can decide expiry, against this client's and each other: the replica set's
    members that can become primary, or every mongos the cluster lists (the client's own if it may
    not read the list), or the one server. A server is read at the address this client already
    reaches it at, if any, else at its advertised name; one that cannot be reached is reported as
    such, its clock unknown."""
    direct = _DirectClients(options.uri, facts, clients)
    servers, note = await _deciding_servers(probe, client, facts, direct)
    readings = []
    for server in servers:
        if server.name is None:
            where = "the load balancer" if server.role == "mongos" else "the server"
            readings.append(await _reading(probe, client, where, server.role))
            continue
        try:
            reaching = await direct(server.reached_at or server.name)
        except (ConfigurationError, ValueError) as error:
            readings.append(ClockReading(server.name, server.role, True, error=cause_of(error)))
            continue
        readings.append(await _reading(probe, reaching, server.name, server.role, reached_at=server.reached_at))
    checks = judge_clocks(readings, options.margin, options.ttl)
    if note is not None:
        checks.append(note)
    return checks


class _DirectClients:
    """One client per server address, each connected to that server alone, made on first use."""

    def __init__(self, uri: str, facts: _Facts, clients: list[Any]) -> None:
        self._uri, self._facts, self._clients = uri, facts, clients
        self._by_address: dict[str, Any] = {}

    async def __call__(self, address: str) -> Any:
        if address not in self._by_address:
            self._by_address[address] = await _direct_client(self._uri, address, self._facts)
            self._clients.append(self._by_address[address])
        return self._by_address[address]


async def _deciding_servers(
    probe: DeploymentProbe, client: AsyncClient, facts: _Facts, direct: _DirectClients
) -> tuple[list[_DecidingServer], Check | None]:
    hello = facts.hello
    known = _addresses(client)
    if facts.kind == "replica set":
        primary = hello.get("primary")
        reached = _reached_under_another_name(client)
        return [
            _DecidingServer(host, "primary" if host == primary else "secondary", reached.get(host.lower()))
            for host in hello.get("hosts") or []
        ], None
    if facts.kind == "sharded":
        now = await probe.server_now()
        listed = await probe.listed_mongos(pinged_since=now - timedelta(seconds=MONGOS_ACTIVE_S))
        if listed is None:
            note = Check(
                section="clocks",
                name="mongos listed",
                verdict=WARN,
                measured=(
                    f"config.mongos is not readable by this user: measured the {len(known)} mongos of the URI only"
                ),
                fix=(
                    "run the check as a user who may read config.mongos (clusterMonitor) to measure every mongos "
                    "applications may use"
                ),
            )
            return [_DecidingServer(host, "mongos") for host in known], note
        return await _listed_mongos(probe, listed, known, direct)
    if facts.kind == "load balanced":
        return [_DecidingServer(None, "mongos")], None
    return [_DecidingServer(None, "standalone")], None


async def _listed_mongos(
    probe: DeploymentProbe, listed: list[str], known: list[str], direct: _DirectClients
) -> tuple[list[_DecidingServer], Check | None]:
    """Every mongos the cluster lists, each read at the URI's address that answered as it, if
    one did; the URI's mongos that the list does not name (not pinged lately) as well."""
    named: dict[str, str] = {}  # a listed name (lower case) -> the URI's address that answered as it
    unnamed = 0
    for address in known:
        try:
            listed_as = await probe.listed_as(await direct(address))
        except (PyMongoError, ValueError):
            listed_as = None  # not reachable now: its clock reading says why
        if listed_as is None:
            unnamed += 1
        elif listed_as.lower() != address.lower():
            named[listed_as.lower()] = address
    servers = [_DecidingServer(name, "mongos", named.get(name.lower())) for name in listed]
    listed_lower = {name.lower() for name in listed}
    servers += [
        _DecidingServer(address, "mongos")
        for address in known
        if address.lower() not in listed_lower and address not in named.values()
    ]
    known_lower = {address.lower() for address in known}
    unmatched = [s for s in servers if s.reached_at is None and (s.name or "").lower() not in known_lower]
    note = None
    if unnamed and unmatched:
        note = Check(
            section="clocks",
            name="mongos named",
            verdict=WARN,
            measured=(
                f"{unnamed} mongos of the URI did not say which listed mongos it is (serverStatus refused): each "
                "listed mongos is read at the name it lists itself under"
            ),
            fix=(
                "run the check as a user who may run serverStatus (clusterMonitor), so that a mongos reached at "
                "another address than its listed name (a mapped port, a proxy) is recognised"
            ),
        )
    return servers, note


def _addresses(client: AsyncClient) -> list[str]:
    """The addresses this client reaches its servers at (the URI's hosts, or those discovered)."""
    return sorted(f"{host}:{port}" for host, port in client.topology_description.server_descriptions())


def _reached_under_another_name(client: AsyncClient) -> dict[str, str]:
    """Advertised name (lower case) -> address, for each server this client reached at an address
    other than the name it gives itself (``hello``'s ``me``): a member initiated as
    ``localhost:27017`` in a container and reached through a mapped port, say."""
    reached = {}
    for (host, port), description in client.topology_description.server_descriptions().items():
        me = description.me
        if me is not None and (str(me[0]).lower(), me[1]) != (host.lower(), port):
            reached[f"{me[0]}:{me[1]}".lower()] = f"{host}:{port}"
    return reached


async def _reading(
    probe: DeploymentProbe, client: AsyncClient, host: str, role: str, *, reached_at: str | None = None
) -> ClockReading:
    samples = []
    try:
        for _ in range(CLOCK_SAMPLES):
            sent = time.time()
            now = await probe.server_now(client)
            samples.append((sent, time.time(), now))
    except PyMongoError as error:
        where = host if reached_at is None else reached_at
        return ClockReading(
            host, role, True, error=f"could not be read at {where}: {_reason(error)}", reached_at=reached_at
        )
    return clock_reading(host, role, True, samples, reached_at=reached_at)


async def _direct_client(uri: str, host: str, facts: _Facts) -> Any:
    """A client of the one server ``host``, with the URI's credentials and options."""
    parsed = await parse_uri(uri)
    options = {key: value for key, value in parsed["options"].items() if key.lower() not in _NOT_FOR_ONE_HOST}
    lowered = {key.lower() for key in options}
    if parsed.get("username"):
        options["username"] = parsed["username"]
        options["password"] = parsed["password"]
        if "authsource" not in lowered:
            options["authSource"] = parsed.get("database") or "admin"
    for key, value in client_options(uri).items():
        options.setdefault(key, value)
    return AsyncMongoClient(host, directConnection=True, **options, **_api(facts))


# -- clean-up --------------------------------------------------------------------------------------


async def _clean_up_and_close(
    probe: DeploymentProbe | None, scratch: Scratch, clients: list[Any], *, server_lost: bool
) -> None:
    """Remove the scratch documents (with ``probe``; None: nothing was written), then close the
    clients. Once MongoDB was found unreachable (``server_lost``), both together get
    ``LOST_SERVER_BOUND`` seconds: the clean-up is tried once, and its failure reported as any
    other; closing (which ends the clients' sessions on the server, waiting for a server as any
    request does, and ignores that request's failure) gets what is left of it, or the bound if
    the clean-up itself found the server gone."""
    with pymongo.timeout(LOST_SERVER_BOUND) if server_lost else contextlib.nullcontext():
        try:
            if probe is not None:
                await _clean_up(probe, scratch, bound=None if server_lost else _CLEAN_UP_BOUND)
        finally:
            with pymongo.timeout(LOST_SERVER_BOUND) if scratch.clean_up_unreachable else contextlib.nullcontext():
                await asyncio.gather(*(each.close() for each in clients), return_exceptions=True)


async def _clean_up(probe: DeploymentProbe, scratch: Scratch, *, bound: float | None) -> None:
    """Remove the scratch documents, within ``bound`` seconds (None: the caller's driver deadline
    bounds it); if that fails (the server went away), record why in ``scratch`` rather than
    raise: an error here must not replace the one that ended the check, and the report names the
    prefix to remove by hand."""
    try:
        async with asyncio.timeout(bound):
            await _remove_scratch(probe, scratch)
    except (PyMongoError, TimeoutError) as error:
        scratch.clean_up_error = f"{type(error).__name__}: {cause_of(error)}"
        scratch.clean_up_unreachable = isinstance(error, ConnectionFailure | TimeoutError)


def by_hand(scratch: Scratch, options: CheckOptions) -> str:
    """The mongosh command that removes the scratch documents a failed clean-up left."""
    return (
        f"db.getSiblingDB({json.dumps(options.database)}).getCollection({json.dumps(options.collection)})"
        f".deleteMany({{_id: /^{scratch.prefix}/}})"  # the prefix: letters, digits, "-" and ":"
    )


def _clean_up_failure(scratch: Scratch, options: CheckOptions) -> Check:
    return Check(
        section="collection",
        name="clean-up",
        verdict=FAIL,
        measured=f"the scratch documents {scratch.prefix}* could not be removed ({scratch.clean_up_error})",
        fix="remove them by hand once MongoDB answers, while no check runs:",
        figures={"prefix": scratch.prefix, "error": scratch.clean_up_error},
        command=by_hand(scratch, options),
    )


def _with_clean_up_failure(error: UserError, scratch: Scratch, options: CheckOptions) -> UserError:
    """The error that ended the check, and the clean-up's failure after it, in one line."""
    if scratch.clean_up_error is None:
        return error
    return UserError(
        f"{error}; and the scratch documents {scratch.prefix}* could not be removed ({scratch.clean_up_error}): "
        f"remove them by hand once MongoDB answers: {by_hand(scratch, options)}",
        error.exit_code,
    )


async def _remove_scratch(probe: DeploymentProbe, scratch: Scratch) -> None:
    """Remove the scratch documents, and look again: a request of the library still on its way
    (a waiter's withdrawal) could write one after the removal, never create one (only acquires
    upsert, and they are all done)."""
    for attempt in range(3):
        scratch.removed += await probe.remove_scratch(scratch.prefix)
        await asyncio.sleep(0.2 * attempt)
        scratch.left = await probe.scratch_count(scratch.prefix)
        if not scratch.left:
            return


# -- the command -----------------------------------------------------------------------------------


def run(arguments: argparse.Namespace) -> int:
    """``mongolock check``: run, print (text or ``--json``), return the exit code: 0 every check
    passed, 1 a warning, 2 a failure (3 unreachable, 6 credentials rejected, through ``UserError``;
    130 after Ctrl-C and 143 after SIGTERM, once the clean-up has run)."""
    options = options_from(arguments)
    scratch = Scratch()
    terminated = False

    async def main() -> CheckRun:
        nonlocal terminated
        task = asyncio.current_task()
        if task is None:  # never: a coroutine run by asyncio.run
            raise RuntimeError("the check runs outside a task")
        loop = asyncio.get_running_loop()

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            loop.remove_signal_handler(signal.SIGTERM)  # a second SIGTERM ends the process at once
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on the main thread
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await run_checks(options, scratch, Progress())
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)

    # What the library's locks say while they run (a server that stops answering) is this
    # command's own report to make: one line, not the library's warnings.
    logging.getLogger("mongolock_async").addHandler(logging.NullHandler())
    logging.getLogger("mongolock_async").propagate = False
    try:
        result = asyncio.run(main())
    except UserError as error:
        raise _with_clean_up_failure(error, scratch, options) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        left = f", {scratch.left} left" if scratch.left else ""
        if scratch.clean_up_error is not None:
            left += f"; the rest could not be removed ({scratch.clean_up_error}): {by_hand(scratch, options)}"
        print(
            f"mongolock check: interrupted; removed {scratch.removed} scratch documents "
            f"({scratch.prefix}*){left}",
            file=sys.stderr,
        )
        return 143 if terminated else 130
    if arguments.json:
        print_json(as_payload(result.checks, result.header))
    else:
        _print_text(result, options)
    return EXIT_UNREACHABLE if scratch.clean_up_unreachable else exit_code(result.checks)


def _print_text(result: CheckRun, options: CheckOptions) -> None:
    utf8_stdout()  # lock names can be any UTF-8
    scratch = result.header["scratch"]
    head = (
        f"mongolock check: {result.header['uri']} ({options.database}.{options.collection}), TTL {options.ttl:g} s, "
        f"safety margin {ms(options.margin)}" + (", read-only" if options.read_only else "")
    )
    for line in [*paragraph(head), *as_text(result.checks)]:
        print(line)
    if scratch["written"]:
        cleaned = (
            f"scratch documents ({scratch['prefix']}*): {scratch['removed']} removed, none left"
            if not scratch["left"]
            else f"scratch documents ({scratch['prefix']}*): {scratch['left']} could not be removed"
        )
    else:
        cleaned = "nothing was written"
    print()
    for line in paragraph(f"{summary(result.checks)} in {result.header['duration_s']:.1f} s; {cleaned}"):
        print(line)

