"""``mongolock check``: every check passes on the embedded server, each check that must fail fails,
and nothing the check writes is left behind, also when it is interrupted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore
from mongolock_async._cli import main as cli
from mongolock_async._cli.check import run as _check_run
from mongolock_async._cli.check.run import Scratch, options_from, run_checks
from mongolock_async._cli.check.verdicts import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    ClockReading,
    as_payload,
    clock_reading,
    judge_clocks,
    judge_documents,
    judge_majority_writes,
    judge_privileges,
    judge_version,
)
from mongolock_async.privileges import lock_privileges, operator_privileges
from mongolock_async.store.probe import DeploymentProbe
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.commands import CommandCounter
from tests.support.run_settings import child_environment

SCRATCH = re.compile("^mongolock-check-")
# Every command that writes; a read-only check must send none of them.
WRITES = {"insert", "update", "delete", "findAndModify", "createIndexes", "collMod", "drop", "create"}
PERF = ["--perf", "--perf-cycles", "5", "--perf-hand-offs", "3", "--perf-leases", "20", "--perf-duration", "1"]
# What the embedded server cannot show (it has no replSetGetConfig): reported as not run, and why.
EMBEDDED_SKIPS = {"replication.failover", "replication.journaling"}


async def check(uri: str, *arguments: str) -> dict[str, Any]:
    """``mongolock check`` in this process; its ``--json`` output."""
    options = options_from(cli.build_parser().parse_args(["check", "--uri", uri, *arguments]))
    run = await run_checks(options, Scratch())
    return as_payload(run.checks, run.header)


def by_id(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["id"]: entry for entry in payload["checks"]}


async def snapshot(collection: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every document and index of ``collection``, to show that the check left them as they were."""
    documents = await collection.find().sort("_id", 1).to_list(None)
    indexes = await (await collection.list_indexes()).to_list(None) if await exists(collection) else []
    return documents, indexes


async def exists(collection: Any) -> bool:
    return collection.name in await collection.database.list_collection_names()


async def some_locks(collection: Any) -> list[Any]:
    """A held lock, a released one, an expired one (its holder gone without releasing) and a
    semaphore's permit, as a deployment in use has them; the handles, which the caller keeps (a
    handle dropped while it holds releases its lease)."""
    held = AsyncMongoLock(collection, "nightly-report", ttl=120, label="report-worker")
    assert await held.acquire(blocking=False)
    async with AsyncMongoLock(collection, "billing", ttl=10):
        pass
    permit = AsyncMongoSemaphore(collection, "partner-api", 3, ttl=120)
    assert await permit.acquire(blocking=False)
    crashed = AsyncMongoLock(collection, "crashed-job", ttl=120)
    assert await crashed.acquire(blocking=False)
    crashed._forget_lease()  # its holder crashed: never released nor renewed
    # Its lease expires unreleased (set on the server's clock by hand: with a TTL of 0.3 s, a loaded
    # machine's reply could come too late for the acquire to hold it).
    await collection.update_one({"_id": "crashed-job"}, [{"$set": {"expiresAt": "$$NOW"}}])
    return [held, permit, crashed]


@pytest.mark.timing(margin=1.0)  # a majority write or a change event slower than 1 s warns
async def test_every_check_passes_on_the_embedded_server_and_nothing_is_left(mongolock_uri: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
    name = f"checked_{uuid.uuid4().hex[:8]}"
    collection = client[TEST_DATABASE][name]
    try:
        handles = await some_locks(collection)
        before = await snapshot(collection)
        payload = await check(mongolock_uri, "--db", TEST_DATABASE, "--collection", name, "--ttl", "10")
        after = await snapshot(collection)
        leftovers = await collection.count_documents({"_id": SCRATCH})
        del handles
    finally:
        await collection.drop()
        await client.close()
    checks = by_id(payload)
    embedded = "SecantusDB" in checks["server.version"]["measured"]
    verdicts = {entry["id"]: entry["verdict"] for entry in payload["checks"]}
    if embedded:  # elsewhere (MONGODB_URI) the deployment decides; the check itself must not break
        assert payload["exit_code"] == 0 and set(verdicts.values()) == {PASS, SKIP}, verdicts
        assert {key for key, verdict in verdicts.items() if verdict == SKIP} == EMBEDDED_SKIPS, verdicts
        assert all("replSetGetConfig" in checks[key]["measured"] for key in EMBEDDED_SKIPS)
    assert FAIL not in verdicts.values(), payload
    for expected in (
        "server.version", "server.topology", "server.change_streams", "server.transactions", "server.wake-ups",
        "server.stable_API", "durability.majority_write", "clocks.agreement", "privileges.lock_role",
        "privileges.operator_role", "collection.indexes", "collection.documents", "collection.readable",
        "collection.expired_leases", "server.support", "replication.members", "replication.lag",
        "replication.oplog_window", "replication.arbiters", "collection.options",
    ):  # fmt: skip
        assert expected in checks, expected
    assert checks["collection.documents"]["figures"]["documents"] == 4
    assert checks["collection.expired_leases"]["figures"]["names"] == ["'crashed-job'"]
    assert checks["durability.majority_write"]["figures"]["writes"] == 20
    assert payload["scratch"]["written"] and payload["scratch"]["removed"] > 0 and payload["scratch"]["left"] == 0
    assert leftovers == 0 and after == before, "the check left something behind or changed a lock"


async def test_a_malformed_document_fails_the_check_and_read_only_writes_nothing(
    mongolock_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = CommandCounter()
    monkeypatch.setattr(
        _check_run, "connect", lambda uri, **options: AsyncMongoClient(uri, event_listeners=[counter], **options)
    )
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
    name = f"checked_{uuid.uuid4().hex[:8]}"
    collection = client[TEST_DATABASE][name]
    try:
        async with AsyncMongoLock(collection, "fine", ttl=10):
            pass
        await collection.insert_one({"_id": "hand-edited", "owner": 42, "expiresAt": "tomorrow"})
        before = await snapshot(collection)
        payload = await check(mongolock_uri, "--db", TEST_DATABASE, "--collection", name, "--read-only")
        after = await snapshot(collection)
    finally:
        await collection.drop()
        await client.close()
    checks = by_id(payload)
    assert payload["exit_code"] == 2
    readable = checks["collection.readable"]
    assert readable["verdict"] == FAIL and "'hand-edited'" in readable["measured"], readable
    assert "mongolock release NAME --force" in readable["fix"]
    assert readable["command"] == f"mongolock release hand-edited --force --db {TEST_DATABASE} --collection {name}"
    assert [entry["id"] for entry in payload["checks"] if entry["verdict"] == FAIL] == ["collection.readable"]
    assert checks["durability.majority_write"]["verdict"] == "skip"
    assert "--read-only" in checks["durability.majority_write"]["measured"]
    sent = set(counter.names)
    assert sent & {"find", "aggregate"} and not sent & WRITES, sent
    assert after == before and not payload["scratch"]["written"]


@pytest.mark.parametrize(
    ("name", "shell"), [("it's$(touch pwned)", "sh"), ("bad\x1b[2J\u202eevil `touch pwned`", "bash")],
    ids=["shell-syntax", "escapes"],
)
def test_the_repair_command_pastes_as_the_one_name_it_repairs(
    mongolock_uri: str, tmp_path: Path, name: str, shell: str
) -> None:
    collection = f"repair_{uuid.uuid4().hex[:8]}"
    with MongoClient(mongolock_uri) as client:
        locks = client[TEST_DATABASE][collection]
        locks.insert_one({"_id": name, "owner": 42, "expiresAt": "tomorrow"})
        try:
            shown = mongolock_check(mongolock_uri, "--read-only", "--db", TEST_DATABASE, "--collection", collection)
            lines = shown.stdout.splitlines()
            (command,) = [line.strip() for line in lines if line.strip().startswith("mongolock release")]
            # As an operator pastes it (--yes: no terminal here to confirm on).
            pasted = subprocess.run(
                [shell, "-c", command + " --yes"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                env=child_environment(MONGODB_URI=mongolock_uri,
                                      PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
            )  # fmt: skip
            repaired = locks.find_one({"_id": name})
        finally:
            client[TEST_DATABASE].drop_collection(collection)
    assert shown.returncode == 2 and all(line.isprintable() for line in lines), shown.stdout
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert not (tmp_path / "pwned").exists(), "nothing in the name ran"
    assert repaired is not None and repaired["owner"] is None and "forcedRelease" in repaired, repaired


# -- privileges --------------------------------------------------------------------------------------

# SecantusDB checks killCursors when a client closes its own cursor (a change stream's), where mongod
# needs no privilege for that (MongoDB's privilege reference); the test's roles add it.
_CLOSE_OWN_CURSORS = "killCursors"


async def test_a_missing_privilege_is_named_before_production_finds_it() -> None:
    # The embedded server enforces one action per command (findAndModify: update; delete: remove;
    # createIndexes: createIndex; a change stream: find only), so the refusals below are the server's.
    database, collection = "mongolock", "locks"
    lock_role = lock_privileges(database, collection)
    lock_role[0]["actions"] = [*lock_role[0]["actions"], _CLOSE_OWN_CURSORS]
    without_update = lock_privileges(database, collection) + operator_privileges(database, collection)
    without_update[0]["actions"] = [a for a in without_update[0]["actions"] if a != "update"] + [_CLOSE_OWN_CURSORS]
    with EmbeddedMongo(auth=("admin", "admin-pw")) as server:
        admin: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(server.uri)
        try:
            await admin.admin.command("createRole", "app", privileges=lock_role, roles=[])
            await admin.admin.command("createRole", "no-update", privileges=without_update, roles=[])
            for user in ("app", "no-update"):
                await admin.admin.command("createUser", user, pwd="pw", roles=[{"role": user, "db": "admin"}])
            async with AsyncMongoLock(admin[database][collection], "job", ttl=10):
                pass
            before = await snapshot(admin[database][collection])
            address = f"127.0.0.1:{server.port}/?directConnection=true&authSource=admin"
            app = await check(f"mongodb://app:pw@{address}")
            broken = await check(f"mongodb://no-update:pw@{address}")
            after = await snapshot(admin[database][collection])
        finally:
            await admin.close()

    # The application's documented role: enough for locks; the operator's actions are named missing,
    # and the check writes nothing it could not remove.
    checks = by_id(app)
    assert app["exit_code"] == 1
    assert checks["privileges.lock_role"]["verdict"] == PASS
    operator = checks["privileges.operator_role"]
    assert operator["verdict"] == WARN
    assert {"listCollections", "listIndexes", "createIndex", "remove"} <= set(operator["figures"]["missing"])
    assert "operator_privileges('mongolock', 'locks')" in operator["fix"]
    assert checks["durability.majority_write"]["verdict"] == "skip"
    assert "cannot remove the check's scratch documents" in checks["durability.majority_write"]["measured"]
    assert not app["scratch"]["written"]

    # A role without update: the lock's own writes would fail; the check names the action.
    checks = by_id(broken)
    assert broken["exit_code"] == 2
    lock = checks["privileges.lock_role"]
    assert lock["verdict"] == FAIL and lock["figures"]["missing"] == ["update"], lock
    assert "update (refused" in lock["measured"] and "lock_privileges('mongolock', 'locks')" in lock["fix"]
    assert checks["privileges.operator_role"]["verdict"] == PASS
    assert "may not take locks" in checks["durability.majority_write"]["measured"]
    assert after == before


def test_privileges_the_server_lists_are_judged_against_the_documented_roles() -> None:
    # What a mongod answers to connectionStatus with showPrivileges: true (MongoDB's reference for
    # connectionStatus: authInfo.authenticatedUsers, authenticatedUserRoles, authenticatedUserPrivileges,
    # each privilege a resource {db, collection} and its actions). The embedded server lists none, so
    # this decision is shown on mongod's reply shape.
    def reply(*privileges: dict[str, Any]) -> dict[str, Any]:
        return {
            "authenticatedUsers": [{"user": "app", "db": "admin"}],
            "authenticatedUserRoles": [{"role": "mongolockUser", "db": "admin"}],
            "authenticatedUserPrivileges": list(privileges),
        }

    tried = {action: ("accepted", "") for action in ("find", "insert", "update", "remove")}
    tried["changeStream"] = ("not tried", "change streams do not work here")
    no_stream = {"resource": {"db": "mongolock", "collection": "locks"}, "actions": ["find", "insert", "update"]}
    lock, operator = judge_privileges(tried, reply(no_stream), "mongolock", "locks")
    assert lock.verdict == FAIL and lock.figures["missing"] == ["changeStream"]
    assert "changeStream (not in this user's privileges)" in lock.measured
    assert operator.verdict == WARN and set(operator.figures["missing"]) == {
        "listCollections", "collMod", "createIndex", "listIndexes", "remove"
    }  # fmt: skip

    every_action = ["changeStream", "find", "insert", "update", "listCollections", "collMod", "createIndex",
                    "listIndexes", "remove"]  # fmt: skip
    whole_database = {"resource": {"db": "mongolock", "collection": ""}, "actions": every_action}
    assert [c.verdict for c in judge_privileges(tried, reply(whole_database), "mongolock", "locks")] == [PASS, PASS]
    root = {"resource": {"anyResource": True}, "actions": ["changeStream", "find", "insert", "update"]}
    assert judge_privileges(tried, reply(root), "mongolock", "locks")[0].verdict == PASS
    elsewhere = {**no_stream, "resource": {"db": "mongolock", "collection": "other"}, "actions": ["changeStream"]}
    assert judge_privileges(tried, reply(no_stream, elsewhere), "mongolock", "locks")[0].verdict == FAIL
    # Authentication off: nothing is listed, and nothing is missing.
    assert judge_privileges(tried, {}, "mongolock", "locks")[0].verdict == PASS


def test_the_thresholds_the_docs_state() -> None:
    too_old = judge_version({"version": "4.4.29"}, "4.4", 9)
    assert too_old.verdict == FAIL and "5.0 or newer" in (too_old.fix or "")
    assert judge_version({"version": "5.0.0"}, None, 13).verdict == PASS
    assert judge_version({"version": "6.0.3"}, "4.4", 17).verdict == FAIL  # an upgrade not finished
    ttl = 10.0
    assert judge_majority_writes([0.005] * 20, [0.004] * 20, ttl).verdict == PASS
    assert judge_majority_writes([0.005] * 19 + [1.5], [], ttl).verdict == WARN  # p99 above 10 % of the TTL
    assert judge_majority_writes([0.005] * 19 + [3.4], [], ttl).verdict == FAIL  # p99 at a third of it
    assert judge_majority_writes([], [], ttl, "waiting for replication timed out").verdict == FAIL
    document = {"_id": "queue", "owner": None, "fence": 1}
    for size, verdict in ((100_000, PASS), (2_000_000, WARN), (9_000_000, FAIL)):
        judged = judge_documents(1, [{**document, "_size": size, "_expired": 0}], True, "db", "locks")
        assert judged[0].verdict == verdict


# -- clocks ------------------------------------------------------------------------------------------


async def test_clocks_that_decide_expiry_are_judged_against_the_safety_margin(mongolock_uri: str) -> None:
    # A real reading of the server's clock; two clocks that differ are that reading and a copy of it
    # shifted (one server's clock cannot be moved, and an embedded server runs on this machine's).
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
    try:
        probe = DeploymentProbe(client, TEST_DATABASE, "clocks")
        samples: list[tuple[float, float, Any]] = []
        # Five, and more until one came back within 0.1 s (the reading is the quickest's; a loaded
        # machine's five can all be slow): its uncertainty, half of it, must be well under the
        # quarter of the margin two clocks may differ by.
        while len(samples) < 5 or (min(answered - sent for sent, answered, _ in samples) > 0.1 and len(samples) < 50):
            sent = time.time()
            now = await probe.server_now()
            samples.append((sent, time.time(), now))
    finally:
        await client.close()
    measured = clock_reading("a:27017", "primary", True, samples)
    assert measured.offset is not None and measured.uncertainty is not None
    assert abs(measured.offset) <= measured.uncertainty + 0.05, "this machine and its own server agree"
    margin, u = 1.0, measured.uncertainty

    def shifted(host: str, by: float) -> ClockReading:
        assert measured.offset is not None
        return ClockReading(host, "secondary", True, measured.offset + by, u, measured.round_trip)

    def agreement(*readings: ClockReading) -> str:
        return judge_clocks(readings, margin, 10.0)[-1].verdict

    assert agreement(measured) == PASS
    assert agreement(measured, shifted("b:27017", 0.0)) == PASS
    assert agreement(measured, shifted("b:27017", margin / 2)) == WARN  # not within a quarter of the margin
    failed = judge_clocks([measured, shifted("b:27017", margin + 2 * u + 0.01)], margin, 10.0)[-1]
    assert failed.verdict == FAIL and "a:27017 and b:27017" in failed.measured and "NTP" in (failed.fix or "")
    # A clock that cannot decide expiry (a mongos's differs, but none decides here) does not count.
    aside = ClockReading("c:27017", "passive", False, measured.offset + 5, u, measured.round_trip)
    assert agreement(measured, aside) == PASS
    # This client's clock decides nothing: off by more than the margin, its line warns.
    client_off = ClockReading("a:27017", "primary", True, 5.0, u, measured.round_trip)
    assert [check.verdict for check in judge_clocks([client_off], margin, 10.0)] == [WARN, PASS]


@pytest.mark.timing(margin=0.2)  # the offset within 0.1 s: its quickest round trip under 0.2 s
@pytest.mark.environment  # every clock of the server under test, as this machine reaches it
def test_a_client_clock_made_to_differ_is_reported(mongolock_uri: str, tmp_path: Path) -> None:
    # This process's clock is moved 5 s ahead as libfaketime would move it (not installed here): a
    # sitecustomize module of the test's replaces time.time in the check's process only.
    (tmp_path / "sitecustomize.py").write_text(
        "import time\n_real_time = time.time\ntime.time = lambda: _real_time() + 5.0\n"
    )
    result = mongolock_check(
        mongolock_uri, "--json", "--read-only", "--ttl", "10", env={"PYTHONPATH": str(tmp_path)}
    )
    payload = json.loads(result.stdout)
    clocks = [entry for entry in payload["checks"] if entry["section"] == "clocks"]
    assert [entry["verdict"] for entry in clocks] == [WARN, PASS], clocks
    assert -5100 < clocks[0]["figures"]["offset_ms"] < -4900 and "NTP" in clocks[0]["fix"]
    assert result.returncode == 1 and payload["exit_code"] == 1


# -- the command: --perf, and interruptions ----------------------------------------------------------


def mongolock_check(uri: str, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mongolock_async", "check", "--uri", uri, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(**(env or {})),
    )


@pytest.mark.timing(margin=0.5)  # 4 cycles of the 1 s sustained load
def test_perf_reports_every_figure_with_its_ratio_and_leaves_nothing(mongolock_uri: str) -> None:
    name = f"perf_{uuid.uuid4().hex[:8]}"
    arguments = ["--db", TEST_DATABASE, "--collection", name, "--json", *PERF, "--perf-seconds", "0.5"]
    result = mongolock_check(mongolock_uri, *arguments)
    payload = json.loads(result.stdout)
    checks = by_id(payload)
    assert result.returncode == payload["exit_code"] and payload["exit_code"] in (0, 1), result.stderr
    # A speed only ever warns; what the embedded server cannot show is skipped.
    assert {entry["verdict"] for entry in payload["checks"]} <= {PASS, WARN, SKIP}
    uncontended = checks["perf.uncontended"]["figures"]
    assert uncontended["cycles"] == 5 and uncontended["ratio"] > 0 and uncontended["warn_above"] == 2.0
    assert {"library_p50_ms", "library_p99_ms", "raw_p50_ms", "raw_p99_ms", "ping_p50_ms"} <= set(uncontended)
    hand_off = checks["perf.hand-off"]["figures"]
    assert hand_off["hand_offs"] == 3 and hand_off["ratio"] > 0 and hand_off["raw_event_p50_ms"] > 0
    hot = checks["perf.hot_lock"]["figures"]
    assert set(hot["acquisitions_per_s"]) == set(hot["ratios"]) == {"1", "8", "64"}
    renewal = checks["perf.heartbeat"]["figures"]
    assert renewal["leases"] == 20 and renewal["ratio"] > 0 and renewal["library_ms_per_lease"] > 0
    load = checks["perf.sustained_load"]["figures"]
    assert load["seconds"] == 1 and load["tasks"] == 4 and load["cycles"] >= 4 and load["ratio_p99"] > 0
    assert load["library_p50_ms"] <= load["library_p99_ms"] <= load["library_p999_ms"] <= load["library_max_ms"]
    with MongoClient(mongolock_uri) as client:
        left = client[TEST_DATABASE][name].count_documents({})
        client[TEST_DATABASE].drop_collection(name)
    assert left == 0 and payload["scratch"]["left"] == 0 and payload["scratch"]["removed"] >= 20 + 3


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_check_removes_what_it_wrote(mongolock_uri: str, sent: signal.Signals, code: int) -> None:
    name = f"interrupted_{uuid.uuid4().hex[:8]}"
    arguments = [*PERF, "--perf-seconds", "5", "--db", TEST_DATABASE, "--collection", name]
    process = subprocess.Popen(
        [sys.executable, "-m", "mongolock_async", "check", "--uri", mongolock_uri, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_environment(),
        text=True,
        # As from a terminal: a process started by one that ignores SIGINT (a background job, a test
        # runner's worker) would inherit the ignoring.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    with MongoClient(mongolock_uri) as client:
        collection = client[TEST_DATABASE][name]
        try:
            give_up_at = time.monotonic() + 60
            # Interrupted in the hot-lock windows: tasks waiting, leases held, places queued.
            while not collection.find_one({"_id": re.compile("^mongolock-check-[0-9a-f]+:hot-")}):
                assert process.poll() is None and time.monotonic() < give_up_at, process.communicate()
                time.sleep(0.02)
            process.send_signal(sent)
            out, err = process.communicate(timeout=60)
            left = collection.count_documents({})
        finally:
            if process.poll() is None:
                process.kill()
            client[TEST_DATABASE].drop_collection(name)
    assert process.returncode == code, out + err
    assert re.search(r"interrupted; removed [1-9]\d* scratch documents \(mongolock-check-[0-9a-f]+:\*\)\n$", err), err
    assert "Traceback" not in err and left == 0


def test_a_server_lost_during_perf_reports_both_errors_and_the_scratch_prefix(tmp_path: Path) -> None:
    with EmbeddedMongo() as server:
        arguments = [*PERF, "--perf-seconds", "5", "--db", TEST_DATABASE, "--collection", "lost"]
        process = subprocess.Popen(
            [sys.executable, "-m", "mongolock_async", "check", "--uri", server.uri, *arguments],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_environment(), text=True,
        )  # fmt: skip
        try:
            with MongoClient(server.uri) as client:
                give_up_at = time.monotonic() + 60
                # Stopped in the hot-lock windows: scratch documents written, tasks at work.
                hot = {"_id": re.compile("^mongolock-check-[0-9a-f]+:hot-")}
                while not client[TEST_DATABASE]["lost"].find_one(hot):
                    assert process.poll() is None and time.monotonic() < give_up_at, process.communicate()
                    time.sleep(0.02)
            server.stop()
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 3, out + err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("mongolock: cannot reach MongoDB at "), err
    prefix = re.search(r"the scratch documents (mongolock-check-[0-9a-f]+:)\* could not be removed", err)
    assert prefix is not None, err
    assert f'deleteMany({{_id: /^{prefix.group(1)}/}})' in err, "the command that removes them by hand"


async def test_a_server_lost_in_a_hot_lock_window_ends_it_and_the_clean_up_is_tried_once_under_a_short_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pymongo import _csot

    from mongolock_async._cli.check import perf as _perf
    from mongolock_async._cli.commandline import UserError

    windows: list[tuple[float, BaseException | None]] = []  # when each hot-lock window ended, and its error
    hot_lock_rate = _perf.hot_lock_rate

    async def recorded_window(*args: Any) -> float:
        try:
            rate = await hot_lock_rate(*args)
        except Exception as error:
            windows.append((time.monotonic(), error))
            raise
        windows.append((time.monotonic(), None))
        return rate

    deadlines: list[float | None] = []  # the driver's deadline of each clean-up tried
    remove_scratch = _check_run._remove_scratch

    async def recorded_clean_up(probe: DeploymentProbe, scratch: Scratch) -> None:
        deadlines.append(_csot.get_timeout())
        await remove_scratch(probe, scratch)

    monkeypatch.setattr(_perf, "hot_lock_rate", recorded_window)
    monkeypatch.setattr(_check_run, "_remove_scratch", recorded_clean_up)
    with EmbeddedMongo() as server:
        arguments = [*PERF, "--perf-seconds", "5", "--db", TEST_DATABASE, "--collection", "lost"]
        options = options_from(cli.build_parser().parse_args(["check", "--uri", server.uri, *arguments]))
        checking = asyncio.create_task(run_checks(options, Scratch()))
        try:
            async with AsyncMongoClient(server.uri) as client:
                give_up_at = time.monotonic() + 60
                # Stopped in the hot-lock windows: scratch documents written, tasks at work.
                hot = {"_id": re.compile("^mongolock-check-[0-9a-f]+:hot-")}
                while not await client[TEST_DATABASE]["lost"].find_one(hot):
                    assert not checking.done() and time.monotonic() < give_up_at
                    await asyncio.sleep(0.02)
            await asyncio.to_thread(server.stop)
            stopped_at = time.monotonic()
            with pytest.raises(UserError) as raised:
                await checking
            took = time.monotonic() - stopped_at
        finally:
            checking.cancel()
    assert raised.value.exit_code == 3 and str(raised.value).startswith("cannot reach MongoDB at "), raised.value
    # The window under way ended with the driver's error (a release retries until its lease
    # expires: its tasks did not say so for 20 s, and the window then reported a rate).
    assert windows and all(error is not None for ended_at, error in windows if ended_at > stopped_at), windows
    # The clean-up was tried once, under the driver's short deadline (it waited for a server again).
    assert deadlines == [_check_run.LOST_SERVER_BOUND], deadlines
    # Generous: 8 to 12 s at load averages up to 19 (43 to 64 s before, when each request waited
    # out the client's 5 s server selection timeout).
    assert took < 40, took


async def test_an_acquire_timed_out_for_want_of_a_server_ends_the_check_with_the_drivers_error() -> None:
    from pymongo.errors import ServerSelectionTimeoutError

    from mongolock_async.errors import LockTimeoutError

    driver_error = ServerSelectionTimeoutError("127.0.0.1:1: connection refused")

    async def unreachable() -> None:
        raise LockTimeoutError("hot", 10.0, unreachable="connection refused") from driver_error

    async def held() -> None:
        raise LockTimeoutError("hot", 10.0)

    checks: list[Check] = []
    with pytest.raises(ServerSelectionTimeoutError) as raised:
        await _check_run._guarded(checks, "perf", "measurements", unreachable())
    assert raised.value is driver_error and not checks
    # A lock held too long is a measurement that failed, as before.
    await _check_run._guarded(checks, "perf", "measurements", held())
    assert [check.verdict for check in checks] == [FAIL], checks


async def test_a_clean_up_that_fails_after_the_checks_is_a_failure_naming_what_to_remove(
    mongolock_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymongo.errors import ServerSelectionTimeoutError

    async def server_gone(probe: Any, scratch: Scratch) -> None:
        raise ServerSelectionTimeoutError("127.0.0.1:1: connection refused")

    monkeypatch.setattr(_check_run, "_remove_scratch", server_gone)
    name = f"unclean_{uuid.uuid4().hex[:8]}"
    try:
        payload = await check(mongolock_uri, "--db", TEST_DATABASE, "--collection", name, "--ttl", "10")
    finally:
        with MongoClient(mongolock_uri) as client:
            client[TEST_DATABASE].drop_collection(name)
    entry = by_id(payload)["collection.clean-up"]
    prefix = payload["scratch"]["prefix"]
    assert entry["verdict"] == FAIL and prefix in entry["measured"] and "connection refused" in entry["measured"]
    where = f'db.getSiblingDB("{TEST_DATABASE}").getCollection("{name}")'
    assert entry["command"] == f"{where}.deleteMany({{_id: /^{prefix}/}})"
    assert payload["scratch"]["clean_up_error"].startswith("ServerSelectionTimeoutError")


# -- at the depth of rs.status() ----------------------------------------------------------------------


def rs_status(*members: tuple[str, str, float, float], majority: int) -> dict[str, Any]:
    """``replSetGetStatus`` as MongoDB documents it: each member (name, stateStr, health, seconds
    behind the primary)."""
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    return {
        "set": "rs0",
        "writeMajorityCount": majority,
        "heartbeatIntervalMillis": 2000,
        "members": [
            {"_id": index, "name": name, "stateStr": state, "health": health,
             **({} if state == "ARBITER" else {"optimeDate": now - timedelta(seconds=behind)})}
            for index, (name, state, health, behind) in enumerate(members)
        ],
    }  # fmt: skip


def test_members_and_lag_are_judged_from_rs_status() -> None:
    from mongolock_async._cli.check.deployment import judge_members

    healthy = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "SECONDARY", 1, 0.5), ("c:1", "SECONDARY", 1, 1), majority=2)
    members, lag = judge_members(healthy, None, ttl=30)
    assert (members.verdict, lag.verdict) == (PASS, PASS), (members, lag)
    # A primary-secondary-arbiter set with its secondary down: no majority write can commit.
    psa = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "(not reachable/healthy)", 0, 0), ("c:1", "ARBITER", 1, 0),
                    majority=2)  # fmt: skip
    members, _ = judge_members(psa, None, ttl=30)
    assert members.verdict == FAIL and "b:1" in members.measured and "needs 2" in members.measured
    one_down = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "SECONDARY", 1, 0), ("c:1", "RECOVERING", 1, 0),
                         majority=2)  # fmt: skip
    assert judge_members(one_down, None, ttl=30)[0].verdict == WARN
    # One secondary 5 s behind: over a tenth of a 30 s TTL, but the other completes a majority.
    one_behind = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "SECONDARY", 1, 0), ("c:1", "SECONDARY", 1, 5),
                           majority=2)  # fmt: skip
    _, lag = judge_members(one_behind, None, ttl=30)
    assert lag.verdict == WARN and lag.figures["majority_lag_s"] == 0 and lag.figures["lag_s"]["c:1"] == 5
    both_behind = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "SECONDARY", 1, 12), ("c:1", "SECONDARY", 1, 15),
                            majority=2)  # fmt: skip
    _, lag = judge_members(both_behind, None, ttl=30)
    assert lag.verdict == FAIL and lag.figures["majority_lag_s"] == 12, lag
    # A member with no votes does not complete a majority.
    config = {"members": [{"host": "b:1", "votes": 1}, {"host": "c:1", "votes": 0}]}
    nonvoting = rs_status(("a:1", "PRIMARY", 1, 0), ("b:1", "SECONDARY", 1, 12), ("c:1", "SECONDARY", 1, 0),
                          majority=2)  # fmt: skip
    assert judge_members(nonvoting, config, ttl=30)[1].verdict == FAIL


def test_failover_arbiters_journaling_and_the_oplog_window() -> None:
    from datetime import UTC, datetime, timedelta

    from mongolock_async._cli.check.deployment import judge_arbiters, judge_failover, judge_journaling, judge_oplog
    from mongolock_async.store.replication import OplogSpan

    defaults = {"settings": {"electionTimeoutMillis": 10_000, "heartbeatIntervalMillis": 2_000}}
    short = judge_failover(defaults, {}, ttl=10, margin=1)
    assert short.verdict == WARN and short.figures["failover_gap_s"] == 12 and "19.5 s" in (short.fix or "")
    assert judge_failover(defaults, {}, ttl=30, margin=1).verdict == PASS
    from_metrics = judge_failover(None, {"electionCandidateMetrics": {"electionTimeoutMillis": 5_000}}, 15, 1)
    assert from_metrics.verdict == PASS and from_metrics.figures["failover_gap_s"] == 7
    assert judge_failover(None, {}, 10, 1, "refused").verdict == SKIP
    assert judge_arbiters({"hosts": ["a:1", "b:1"], "arbiters": ["c:1"]}).verdict == WARN
    assert judge_arbiters({"hosts": ["a:1", "b:1", "c:1"]}).verdict == PASS
    assert judge_journaling({"writeConcernMajorityJournalDefault": False}).verdict == FAIL
    assert judge_journaling({}).verdict == PASS, "true by default"
    start = datetime(2026, 12, 4, tzinfo=UTC)
    three_hours = start + timedelta(hours=3)
    assert judge_oplog(OplogSpan(start, three_hours, 950 * 2**20, 1000 * 2**20)).verdict == WARN, "full: the window"
    assert judge_oplog(OplogSpan(start, three_hours, 100 * 2**20, 1000 * 2**20)).verdict == PASS, "still growing"
    assert judge_oplog(OplogSpan(start, three_hours)).verdict == SKIP, "fullness unknown"
    assert judge_oplog(OplogSpan(start, start + timedelta(hours=30))).verdict == PASS


def test_releases_past_their_end_of_life_are_named() -> None:
    from datetime import date

    from mongolock_async._cli.check.deployment import judge_support

    today = date(2026, 12, 4)
    verdicts = {
        version: judge_support({"version": version}, today).verdict
        for version in ("5.0.31", "6.0.20", "7.0.14", "7.2.2", "8.0.4", "8.2.11", "9.0.0", "8.1.1")
    }
    assert verdicts == {"5.0.31": WARN, "6.0.20": WARN, "7.0.14": PASS, "7.2.2": WARN, "8.0.4": PASS,
                        "8.2.11": PASS, "9.0.0": PASS, "8.1.1": WARN}  # fmt: skip
    assert "2025-07-31" in judge_support({"version": "6.0.20"}, today).measured
    assert judge_support({"version": "7.0.14"}, date(2027, 9, 1)).verdict == WARN


@pytest.mark.parametrize(
    ("options", "verdict", "said"),
    [
        ({"collation": {"locale": "en", "strength": 2}}, FAIL, "collation"),
        ({"validator": {"owner": {"$type": "string"}}}, WARN, "validator"),
        ({"capped": True, "size": 1_000_000}, FAIL, "capped"),
        ({}, PASS, "plain collection"),
    ],
    ids=["collation", "validator", "capped", "plain"],
)
async def test_the_collections_options_are_judged(
    mongolock_uri: str, options: dict[str, Any], verdict: str, said: str
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
    name = f"options_{uuid.uuid4().hex[:8]}"
    try:
        await client[TEST_DATABASE].create_collection(name, **options)
        payload = await check(mongolock_uri, "--db", TEST_DATABASE, "--collection", name, "--read-only")
    finally:
        await client[TEST_DATABASE].drop_collection(name)
        await client.close()
    entry = by_id(payload)["collection.options"]
    assert entry["verdict"] == verdict and said in entry["measured"], entry
