"""Deployments as users run them: a strict Stable API client, TLS, authentication, least privileges."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
import trustme
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.server_api import ServerApi
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoElection,
    AsyncMongoJob,
    AsyncMongoLock,
    AsyncMongoRWLock,
    AsyncMongoSemaphore,
    ServerUnreachableError,
    ensure_idle_cleanup_index,
)
from mongolock_async._cli import main as cli
from mongolock_async._util.diagnosis import cause_of
from mongolock_async.fencing import fenced_update_one
from mongolock_async.privileges import lock_privileges, operator_privileges
from mongolock_async.store import LockStore
from mongolock_async.testing import EmbeddedMongo, EmbeddedTLS
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from mongolock_async.testing.server import HANDSHAKE_TIMEOUT
from tests.support.commands import CommandCounter
from tests.support.fail_points import fail_points_answer, set_fail_point
from tests.support.run_settings import child_environment
from tests.support.sessions import transaction
from tests.support.uris import uri_with_options

# Every operator the library's requests use, each checked in MongoDB's source to be in the Stable
# API (V1): a strict client's request that names one outside it fails with APIStrictError. V1 only
# ever grows, and SERVER-58076 left out of it only what 5.0 itself brought ($dateAdd, $dateDiff,
# $dateSubtract, $dateTrunc, $getField, $setField, $setWindowFields; SERVER-60899 added them later
# in 5.0), none of which is used here, so these hold from 5.0.0 on.
STABLE_API_V1_OPERATORS = {
    # Stages, registered with AllowedWithApiStrict::kAlways: document_source_add_fields.cpp ($addFields
    # and its alias $set), document_source_project.cpp ($project and $unset), document_source_match.cpp,
    # document_source_sort.cpp; $changeStream is kConditionally (document_source_change_stream.cpp):
    # only options the library does not send (showExpandedEvents and kin) are refused.
    "$set", "$unset", "$match", "$project", "$addFields", "$sort", "$changeStream",
    # Query and update operators (filters, $match, fenced writes): the matcher's and the update
    # language's own, not registered per API version.
    "$and", "$or", "$in", "$nin", "$type", "$regex", "$exists", "$gt", "$gte", "$lt", "$lte", "$elemMatch",
    "$expr", "$inc",
    # Expressions: REGISTER_STABLE_EXPRESSION in src/mongo/db/pipeline/expression.cpp ($add, $and,
    # $arrayElemAt, $first, $eq/$ne/$gt/$gte/$lt/$lte, $concat, $concatArrays, $cond, $literal,
    # $filter, $let, $map, $multiply, $ifNull, $in, $indexOfArray, $not, $or, $range, $reduce,
    # $isArray, $slice, $size, $subtract, $toDate and $toLong (makeConversionAlias of $convert),
    # $type); accumulators as expressions, in accumulator_sum.cpp ($sum), accumulator_min_max.cpp
    # ($max) and accumulator_merge_objects.cpp ($mergeObjects). $filter's "limit" and $reduce's
    # "as", "valueAs" and "arrayIndexAs" are kNeverInVersion1: not used.
    "$add", "$multiply", "$subtract", "$max", "$sum", "$cond", "$not", "$eq", "$ne", "$ifNull", "$literal",
    "$toDate", "$toLong", "$filter", "$map", "$reduce", "$let", "$range", "$arrayElemAt", "$indexOfArray",
    "$size", "$concat", "$concatArrays", "$first", "$isArray", "$mergeObjects", "$slice",
    # A job's period and record: REGISTER_STABLE_EXPRESSION(mod, ...) and (allElementsTrue, ...),
    # same file.
    "$mod", "$allElementsTrue",
}  # fmt: skip


def operators_in(value: Any, *, top: bool = True) -> set[str]:
    """Every ``$``-operator in a command (its top-level ``$db``, ``$clusterTime`` and kin are fields)."""
    found: set[str] = set()
    if isinstance(value, Mapping):  # a pipeline's fixed stages are sent encoded (RawBSONDocument)
        for key, item in value.items():
            if key.startswith("$") and not top:
                found.add(key)
            found |= operators_in(item, top=False)
    elif isinstance(value, list):
        for item in value:
            found |= operators_in(item, top=False)
    return found


async def every_kind_of_request(driver: str, uri: str, name: str, **options: Any) -> None:
    """Each kind of request the library sends, with clients made with ``options``: a lock with the
    heartbeat, extended, asked about; a waiter in another client woken by the change stream; a
    token-checked write and a guarded transaction; an operator's listing and forced release; the
    idle-cleanup index. Leaves the collection ``name`` (with the waiter's lease broken) behind."""
    client, other = make_client(driver, uri, **options), make_client(driver, uri, **options)
    locks, elsewhere = client[TEST_DATABASE][name], other[TEST_DATABASE][name]
    try:
        holder = AsyncMongoLock(locks, "job", ttl=3.0, heartbeat=0.5)
        async with holder:
            waiter = AsyncMongoLock(elsewhere, "job", ttl=30.0)
            waiting = asyncio.create_task(waiter.acquire(timeout=20))
            await asyncio.sleep(1.2)  # renewed twice; the waiter queued and its stream opened
            assert await holder.locked() and await holder.owned()
            await holder.extend(4.0)
            stock = client[TEST_DATABASE][name + "_stock"]
            written = await fenced_update_one(stock, {"_id": "sku"}, {"$inc": {"n": 1}}, token=holder, upsert=True)
            assert written.applied
            await guarded_transaction(client, holder)
        assert await waiting, "the hand-off to the other client did not arrive"
        store = LockStore(locks, WriteConcern(w="majority"))
        assert [report.name for report in await store.report()] == ["job"]
        assert await store.force_release("job") is not None, "the waiter's lease was there to break"
        await ensure_idle_cleanup_index(locks, idle_after=3600)
        await stock.drop()
    finally:
        await close_client(other)
        await close_client(client)


async def guarded_transaction(client: Any, holder: AsyncMongoLock, tries: int = 5) -> None:
    """A transaction with ``holder``'s guard, run again after a transient transaction error, as
    ``with_transaction`` does: the heartbeat's renewal of the same document, landing between the
    transaction's snapshot and the guard's write, fails it with WriteConflict (seen at load 20)."""
    for attempt in range(tries):
        try:
            async with transaction(client) as session:
                await holder.guard_transaction(session)
            return
        except OperationFailure as error:
            if not error.has_error_label("TransientTransactionError") or attempt == tries - 1:
                raise


async def every_kind_of_permit_request(driver: str, uri: str, name: str, **options: Any) -> None:
    """Each kind of request of the semaphore, the read-write lock and the election, with clients
    made with ``options``: permits taken, renewed by the heartbeat, extended, asked about, waited
    for through the change stream and handed on; a waiter that gives up (its place withdrawn);
    a guarded transaction; a leader handing over to a named candidate; an observer's stream; an
    operator's listing and forced releases. Leaves the collection ``name`` behind."""
    client, other = make_client(driver, uri, **options), make_client(driver, uri, **options)
    locks, elsewhere = client[TEST_DATABASE][name], other[TEST_DATABASE][name]
    try:
        semaphore = AsyncMongoSemaphore(locks, "quota", 1, ttl=3.0, heartbeat=0.5)
        async with semaphore:
            waiter = AsyncMongoSemaphore(elsewhere, "quota", 1, ttl=30.0)
            waiting = asyncio.create_task(waiter.acquire(timeout=20))
            await asyncio.sleep(1.2)  # renewed; the waiter queued and its stream opened
            assert await semaphore.locked() and await semaphore.owned()
            await semaphore.extend(4.0)
            await guarded_transaction(client, semaphore)
            assert not await AsyncMongoSemaphore(elsewhere, "quota", 1, ttl=30.0).acquire(timeout=0.3)
        assert await waiting, "the permit handed to the other client did not arrive"
        assert await waiter.release()
        rwlock, readers = AsyncMongoRWLock(locks, "table", ttl=30.0), AsyncMongoRWLock(elsewhere, "table", ttl=30.0)
        reader_handles = [readers.read() for _ in range(2)]
        async with rwlock.write():
            reading = [asyncio.create_task(reader.acquire(timeout=20)) for reader in reader_handles]
            await asyncio.sleep(0.5)
        assert all(await asyncio.gather(*reading)), "the writer's release did not hand on to the readers"
        leader = AsyncMongoElection(locks, "leader", ttl=3.0, heartbeat=0.5, label="first")
        follower = AsyncMongoElection(elsewhere, "leader", ttl=3.0, heartbeat=0.5, label="named")
        assert await leader.campaign(timeout=5) > 0
        changes = follower.changes()
        try:
            assert (await anext(changes)) is not None  # an observer reads the leader, then watches
            campaigning = asyncio.create_task(follower.campaign(timeout=20))
            # The named candidate's place stored: a hand-over names one that waits (a fixed 0.5 s
            # is tight on a loaded machine).
            give_up_at = time.monotonic() + 20
            while (seen := await leader.leader()) is None or seen.candidates < 1:
                assert time.monotonic() < give_up_at, "the named candidate's place never showed"
                await asyncio.sleep(0.05)
            assert await leader.resign(to="named")
            assert await campaigning > 0
        finally:
            await changes.aclose()
        assert await follower.resign()
        store = LockStore(locks, WriteConcern(w="majority"))
        assert {report.name for report in await store.report()} >= {"quota", "table", "leader"}
        assert await store.force_release("table") is not None, "the readers' permits were there to break"
        assert not any([await reader.release() for reader in reader_handles]), "the operator broke them"
    finally:
        await close_client(other)
        await close_client(client)


@pytest.mark.timing(margin=2.2)  # 3 s leases renewed every 0.5 s
async def test_a_strict_stable_api_client_works(mongolock_driver: str, mongolock_uri: str) -> None:
    # On MongoDB, a strict client's command that names anything outside API V1 (a command, a stage
    # or an expression) fails with APIStrictError; the embedded server refuses commands and
    # aggregation stages outside V1 only (not expressions, nor update pipelines' stages): there,
    # STABLE_API_V1_OPERATORS, checked in MongoDB's source, is what holds every operator sent.
    counter = CommandCounter()
    name = f"locks_{uuid.uuid4().hex[:12]}"
    strict = ServerApi("1", strict=True)
    await every_kind_of_request(mongolock_driver, mongolock_uri, name, server_api=strict, event_listeners=[counter])
    await every_kind_of_permit_request(
        mongolock_driver, mongolock_uri, name, server_api=strict, event_listeners=[counter]
    )
    client = make_client(mongolock_driver, mongolock_uri)
    await client[TEST_DATABASE][name].drop()
    await close_client(client)
    used = set().union(*(operators_in(command) for command in counter.commands))
    assert "$dateAdd" not in used
    assert used <= STABLE_API_V1_OPERATORS, f"outside the Stable API: {used - STABLE_API_V1_OPERATORS}"
    assert {"findAndModify", "update", "aggregate", "getMore", "createIndexes"} <= set(counter.names)
    # What the permits' pipelines need beyond the lock's: had they not been sent, the list above
    # would prove nothing about them.
    assert {"$reduce", "$let", "$range", "$concat", "$arrayElemAt", "$sum", "$regex"} <= used


async def every_kind_of_job_request(driver: str, uri: str, name: str, **options: Any) -> None:
    """A scheduled job's requests, with a client made with ``options``: a run that succeeds, a call
    in the same period (skipped), a run that fails and is retried, and the job's state. Leaves the
    collection ``name`` behind."""
    client = make_client(driver, uri, **options)
    locks = client[TEST_DATABASE][name]
    try:
        digest = AsyncMongoJob(locks, "digest", every=3600, max_attempts=3, min_interval=1)
        assert (await digest.run(asyncio.sleep, 0)).ran
        assert (await digest.run(asyncio.sleep, 0)).skipped == "done"
        failing = AsyncMongoJob(locks, "report", every=3600, max_attempts=3)
        with pytest.raises(ZeroDivisionError):
            await failing.run(asyncio.to_thread, lambda: 1 / 0)
        assert (await failing.run(asyncio.sleep, 0)).ran, "the failed run's period was retried"
        assert (await digest.state()) is not None
    finally:
        await close_client(client)


async def test_a_strict_stable_api_client_runs_jobs(mongolock_driver: str, mongolock_uri: str) -> None:
    # A job's requests carry its period's arithmetic ($mod) besides the lock's pipeline:
    # a strict client must be able to send every one of them (on MongoDB, any expression outside
    # API V1 fails with APIStrictError; the embedded server does not check expressions).
    counter = CommandCounter()
    name = f"jobs_{uuid.uuid4().hex[:12]}"
    strict = ServerApi("1", strict=True)
    try:
        await every_kind_of_job_request(
            mongolock_driver, mongolock_uri, name, server_api=strict, event_listeners=[counter]
        )
    finally:
        client = make_client(mongolock_driver, mongolock_uri)
        await client[TEST_DATABASE][name].drop()
        await close_client(client)
    used = set().union(*(operators_in(command) for command in counter.commands))
    assert used <= STABLE_API_V1_OPERATORS, f"outside the Stable API: {used - STABLE_API_V1_OPERATORS}"
    assert {"$mod", "$allElementsTrue"} <= used, "the period's arithmetic was not sent: the test proves nothing"


async def test_a_strict_client_reaches_the_server_as_strict(mongolock_driver: str, mongolock_uri: str) -> None:
    # The strict test above means something only if strictness reaches the server: a command
    # outside API V1 (buildInfo) is refused with APIStrictError (323), on MongoDB and on the
    # embedded server alike. The embedded server checks no more than commands and aggregation
    # stages, though: the expressions are proven on MongoDB only (the workflow's servers).
    client = make_client(mongolock_driver, mongolock_uri, server_api=ServerApi("1", strict=True))
    try:
        with pytest.raises(OperationFailure) as raised:
            await client.admin.command("buildInfo")
        assert raised.value.code == 323, raised.value
    finally:
        await close_client(client)


# -- TLS and authentication ----------------------------------------------------------------------------

USER, PASSWORD = "locker", "tls-pa55-secret"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    """The authority that signed the server's and the client's certificates."""
    stranger: Path
    """An authority that signed neither."""
    server: Path
    server_key: Path
    client: Path
    """The client's certificate and key in one file, as tlsCertificateKeyFile wants them."""


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("tls")
    authority, stranger = trustme.CA(), trustme.CA()
    server = authority.issue_cert("127.0.0.1", "localhost")
    names = ("ca.pem", "stranger.pem", "server.pem", "server.key", "client.pem")
    files = Certificates(*(folder / name for name in names))
    authority.cert_pem.write_to_path(str(files.ca))
    stranger.cert_pem.write_to_path(str(files.stranger))
    server.cert_chain_pems[0].write_to_path(str(files.server))
    server.private_key_pem.write_to_path(str(files.server_key))
    authority.issue_cert("lock-client").private_key_and_cert_chain_pem.write_to_path(str(files.client))
    return files


@pytest.fixture(scope="module")
def tls_server(certificates: Certificates) -> Iterator[EmbeddedMongo]:
    """TLS only, SCRAM-SHA-256 authentication required."""
    tls = EmbeddedTLS(certificates.server, certificates.server_key, certificates.ca)
    with EmbeddedMongo(auth=(USER, PASSWORD), tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def mutual_tls_server(certificates: Certificates) -> Iterator[EmbeddedMongo]:
    """TLS only, and every client presents a certificate signed by the test's authority."""
    tls = EmbeddedTLS(certificates.server, certificates.server_key, certificates.ca, client_ca=certificates.ca)
    with EmbeddedMongo(tls=tls) as server:
        yield server


async def operate(uri: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run a ``mongolock`` command in a child process, off the event loop: a blocked loop would stall
    this process's drivers mid-handshake with the embedded server."""
    command = [sys.executable, "-m", "mongolock_async", *arguments, "--db", TEST_DATABASE, "--collection", "secure"]
    run = functools.partial(
        subprocess.run, command, capture_output=True, text=True, timeout=120, env=child_environment(MONGODB_URI=uri)
    )
    return await asyncio.to_thread(run)


async def test_a_peer_stuck_in_its_tls_handshake_does_not_stall_the_embedded_server(
    mongolock_driver: str, tls_server: EmbeddedMongo
) -> None:
    # SecantusDB handshakes on its only accept thread; without a bound, this silent peer would make
    # every later connection wait for it, and the server look unreachable.
    with socket.create_connection(("127.0.0.1", tls_server.port)):
        client = make_client(
            mongolock_driver, tls_server.uri, serverSelectionTimeoutMS=int(4 * HANDSHAKE_TIMEOUT * 1000)
        )
        try:
            assert (await client.admin.command("ping"))["ok"] == 1
        finally:
            await close_client(client)


@pytest.mark.timing(margin=2.2)  # 3 s leases renewed every 0.5 s
async def test_locks_and_the_command_work_over_tls_with_scram(mongolock_driver: str, tls_server: EmbeddedMongo) -> None:
    await every_kind_of_request(mongolock_driver, tls_server.uri, "secure")
    listing = await operate(tls_server.uri, "list")
    assert listing.returncode == 0 and "job" in listing.stdout, listing.stdout + listing.stderr
    assert (await operate(tls_server.uri, "inspect", "job")).returncode == 0
    for result in (listing, await operate(tls_server.uri, "list", "--json")):
        assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.timing(margin=2.2)  # 3 s leases renewed every 0.5 s
async def test_locks_and_the_command_work_with_a_client_certificate(
    mongolock_driver: str, mutual_tls_server: EmbeddedMongo, certificates: Certificates
) -> None:
    uri = uri_with_options(mutual_tls_server.uri, tlsCertificateKeyFile=str(certificates.client))
    await every_kind_of_request(mongolock_driver, uri, "secure")
    listing = await operate(uri, "list")
    assert listing.returncode == 0 and "job" in listing.stdout, listing.stdout + listing.stderr


@pytest.mark.parametrize("mistake", ["wrong password", "unknown CA", "no client certificate"])
async def test_each_misconfiguration_is_named_and_no_password_shows(
    mongolock_driver: str,
    mistake: str,
    tls_server: EmbeddedMongo,
    mutual_tls_server: EmbeddedMongo,
    certificates: Certificates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri, cause, exit_code = {
        "wrong password": (tls_server.uri.replace(PASSWORD, "not-" + PASSWORD), "rejected the credentials", 6),
        "unknown CA": (
            tls_server.uri.replace(quote_plus(str(certificates.ca)), quote_plus(str(certificates.stranger))),
            "certificate did not verify",
            3,
        ),
        "no client certificate": (mutual_tls_server.uri, "client certificate", 3),
    }[mistake]
    # Generous: a TLS handshake with a busy embedded server can take seconds on a loaded machine.
    uri = uri_with_options(uri, serverSelectionTimeoutMS="8000")
    caplog.set_level(logging.DEBUG)
    # The command meets the same mistake in its own process meanwhile (each waits out its own
    # server selection timeout; one after the other they took twice as long).
    listing = asyncio.create_task(operate(uri, "list"))
    client = make_client(mongolock_driver, uri, serverSelectionTimeoutMS=8000)
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE]["secure"], "secure", ttl=30.0)
        started = time.monotonic()
        # Raised as the driver raised it (retrying cannot fix it), or, where a TLS 1.3 client sees a
        # missing client certificate only as the server closing the connection, as an outage once
        # the client's server selection timeout (8 s) has passed.
        with pytest.raises((PyMongoError, ServerUnreachableError)) as raised:
            await lock.acquire(timeout=30)
        assert time.monotonic() - started < 19, "a misconfiguration was retried for the acquire's whole timeout"
        reason = str(raised.value) if isinstance(raised.value, ServerUnreachableError) else cause_of(raised.value)
        assert cause in reason, reason
        shown = f"{raised.value!s} {raised.value!r} {caplog.text}"
        assert "not-" + PASSWORD not in shown and PASSWORD not in shown
    finally:
        await close_client(client)
        result = await listing
    assert result.returncode == exit_code, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert cause in result.stderr or mistake == "wrong password", result.stderr
    assert PASSWORD not in result.stdout + result.stderr


# -- least privileges ------------------------------------------------------------------------------

# What each command needs, from MongoDB's privilege reference ("Privilege Actions"): findAndModify
# needs find and update, and insert with upsert; update needs update (and insert with upsert); find and
# aggregate need find, a change stream also changeStream; getMore and killCursors of one's own
# cursors, ping, hello, endSessions and the transaction commands need nothing.
NEEDS: dict[str, set[str]] = {
    "findAndModify": {"find", "update"},
    "update": {"update"},
    "find": {"find"},
    "aggregate": {"find"},
    "createIndexes": {"createIndex"},
    "collMod": {"collMod"},
    "listIndexes": {"listIndexes"},
    "listCollections": {"listCollections"},
    **{name: set() for name in ("getMore", "killCursors", "ping", "hello", "endSessions", "commitTransaction")},
}


def actions_needed(commands: list[dict[str, Any]], database: str, collection: str) -> dict[str, set[str]]:
    """The actions per resource ("" for the database) the commands sent to ``database`` need."""
    needed: dict[str, set[str]] = {}
    for command in commands:
        if not command:
            continue  # authentication commands, which monitoring redacts
        name = next(iter(command))
        if command.get("$db") not in (database, "admin"):
            continue
        assert name in NEEDS, f"{name} is not in the privilege table: look it up and add it"
        actions = set(NEEDS[name])
        if name == "aggregate" and command["pipeline"] and "$changeStream" in command["pipeline"][0]:
            actions.add("changeStream")
        if command.get("upsert") or any(statement.get("upsert") for statement in command.get("updates", ())):
            actions.add("insert")
        resource = "" if name == "listCollections" else command[name]
        if actions:
            assert resource == collection or resource == "", f"{name} on {resource}"
            needed.setdefault(resource, set()).update(actions)
    return needed


def granted(privileges: list[dict[str, Any]]) -> dict[str, set[str]]:
    actions: dict[str, set[str]] = {}
    for privilege in privileges:
        actions.setdefault(privilege["resource"]["collection"], set()).update(privilege["actions"])
    return actions


@pytest.mark.timing(margin=2.2)  # 3 s leases renewed every 0.5 s
async def test_the_documented_roles_grant_what_is_sent_and_no_more(
    mongolock_driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded server authenticates (SCRAM-SHA-256) but does not enforce roles: the users below
    # run everything with the documented roles, and each command sent is checked against MongoDB's
    # privilege reference, which is what a real server would enforce.
    database, collection = "mongolock", "locks"
    with EmbeddedMongo(auth=("admin", "admin-pw")) as server:
        admin = make_client(mongolock_driver, server.uri)
        try:
            await admin.admin.command(
                "createRole", "mongolockUser", privileges=lock_privileges(database, collection), roles=[]
            )
            operator_role = [{"role": "mongolockUser", "db": "admin"}]
            await admin.admin.command(
                "createRole",
                "mongolockOperator",
                privileges=operator_privileges(database, collection),
                roles=operator_role,
            )
            await admin.admin.command("createUser", "app", pwd="app-pw", roles=operator_role)
            await admin.admin.command(
                "createUser", "ops", pwd="ops-pw", roles=[{"role": "mongolockOperator", "db": "admin"}]
            )
        finally:
            await close_client(admin)
        address = f"127.0.0.1:{server.port}/?directConnection=true&authSource=admin"
        app_counter, ops_counter = CommandCounter(), CommandCounter()
        app = make_client(mongolock_driver, f"mongodb://app:app-pw@{address}", event_listeners=[app_counter])
        other = make_client(mongolock_driver, f"mongodb://app:app-pw@{address}", event_listeners=[app_counter])
        try:
            locks = app[database][collection]
            holder = AsyncMongoLock(locks, "job", ttl=3.0, heartbeat=0.5)  # over 2 s per renewal
            async with holder:
                waiter = AsyncMongoLock(other[database][collection], "job", ttl=30.0)
                waiting = asyncio.create_task(waiter.acquire(timeout=20))
                await asyncio.sleep(1.2)
                assert await holder.locked() and await holder.owned()
                await holder.extend(3.0)
                await guarded_transaction(app, holder)
            assert await waiting  # the waiter holds "job" while an operator looks at it and breaks it
            ops_uri = f"mongodb://ops:ops-pw@{address}"
            monkeypatch.setattr(cli, "connect", lambda uri: make_client("pymongo", uri, event_listeners=[ops_counter]))
            for arguments in (["list"], ["inspect", "job"], ["release", "job", "--force", "--yes"]):
                assert await cli._operate(cli.build_parser().parse_args([*arguments, "--uri", ops_uri])) == 0
            assert not await waiter.release(), "the operator broke the lease"
        finally:
            await close_client(other)
            await close_client(app)
        ops = make_client(mongolock_driver, ops_uri, event_listeners=[ops_counter])
        try:
            await ensure_idle_cleanup_index(ops[database][collection], idle_after=3600)
            await ensure_idle_cleanup_index(ops[database][collection], idle_after=7200)
        finally:
            await close_client(ops)
    assert actions_needed(app_counter.commands, database, collection) == granted(lock_privileges(database, collection))
    operator = granted(lock_privileges(database, collection) + operator_privileges(database, collection))
    needed = actions_needed(ops_counter.commands, database, collection)
    assert needed == {
        "": {"listCollections"},
        collection: {"find", "update", "createIndex", "collMod", "listIndexes"},
    }
    assert all(needed[resource] <= operator[resource] for resource in needed)


async def test_fault_tests_run_on_a_server_of_their_own_where_the_server_has_no_fail_points(
    mongolock_driver: str
) -> None:
    # Against a MongoDB started without enableTestCommands (a managed service, say), the probe says
    # so and the tests that inject faults with failCommand run on an embedded server of their own
    # (fault_server); a fail point armed there anyway is skipped, saying why.
    with EmbeddedMongo(test_commands=False) as server:
        assert not fail_points_answer(server.uri)
        client = make_client(mongolock_driver, server.uri)
        try:
            with pytest.raises(pytest.skip.Exception, match="enableTestCommands"):
                await set_fail_point(client[TEST_DATABASE]["locks"], "off")
        finally:
            await close_client(client)
