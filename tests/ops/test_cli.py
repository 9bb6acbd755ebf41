"""The ``mongolock`` command: the demo, and list / inspect / release --force, with its user errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from mongolock_async import AsyncMongoElection, AsyncMongoLock, AsyncMongoRWLock, AsyncMongoSemaphore, __version__
from mongolock_async._cli.commandline import redact_uri
from mongolock_async._cli.demo.run import DROP_SETTLE, drop_for_good
from mongolock_async.testing import EmbeddedMongo
from tests.support.permits import two_permits_of_one_process
from tests.support.processes import ROOT, WORKERS
from tests.support.run_settings import child_environment
from tests.support.terminal import lines_on_a_terminal
from tests.support.uris import uri_with_options, uri_without_credentials

PASSWORD = "pa55-w0rd-secret"
SMALL_DEMO = ["--workers", "2", "--tasks", "2", "--items", "1", "--stock", "4", "--schedulers", "2", "--ttl", "1",
              "--job-ttls", "1"]  # fmt: skip


def mongolock(
    *arguments: str, uri: str | None = None, stdin: str | None = None, temporary: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {} if uri is None else {"MONGODB_URI": uri}
    if temporary is not None:
        env["TMPDIR"] = str(temporary)
    return subprocess.run(
        [sys.executable, "-m", "mongolock_async", *arguments],
        capture_output=True,
        text=True,
        env=child_environment(**env),
        input=stdin,
        timeout=240,
    )


async def hold(uri: str, database: str, collection: str, name: str, label: str) -> int:
    """Take ``name`` with a long TTL and leave it held (no release), as a live holder would."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        lock = AsyncMongoLock(client[database][collection], name, ttl=120.0, label=label)
        assert await lock.acquire(blocking=False)
        assert lock.fencing_token is not None
        return lock.fencing_token
    finally:
        await client.close()


@pytest.fixture
def held_locks(mongolock_uri: str) -> Iterator[tuple[str, str, dict[str, int]]]:
    database, collection = "mongolock_cli", f"locks_{uuid.uuid4().hex[:8]}"
    tokens = {
        name: asyncio.run(hold(mongolock_uri, database, collection, name, f"{name}-worker"))
        for name in ("alpha", "beta")
    }
    yield database, collection, tokens


# Its TTL of 1 s leaves a job's renewal (every 0.33 s) about 0.57 s before the lease's deadline.
@pytest.mark.timing(margin=0.5)
def test_demo_on_the_embedded_server_passes_its_checks() -> None:
    result = mongolock(
        "demo", "--workers", "2", "--tasks", "3", "--items", "2", "--stock", "8",
        "--schedulers", "2", "--ttl", "1", "--job-ttls", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "embedded server listening" in out
    assert "19/19 checks passed" in out and "FAIL" not in out and "WARN" not in out
    assert "the API never saw more than 3 calls at once" in out
    assert "sales equal the stock (16 of 16)" in out
    assert "SIGKILLed doomed" in out and "takeover" in out
    assert "the successor's fencing token is higher" in out
    assert "SIGSTOPped paused" in out and "ledger transaction refused: LockLostError" in out
    assert "PASS  the account shows only the new holder's posting" in out
    assert "PASS  the clean shutdown handed leadership on at once" in out
    assert "PASS  after the SIGKILL the last replica led only once the dead leader's term expired" in out
    assert "PASS  the killed run's period was run again, by another replica, as its second attempt" in out
    assert "8. mongolock check" in out and "PASS  mongolock check: " in out and "0 warnings, 0 failures" in out


def test_list_shows_holders_and_free_locks(mongolock_uri: str, held_locks: tuple[str, str, dict[str, int]]) -> None:
    database, collection, tokens = held_locks
    result = mongolock("list", "--db", database, "--collection", collection, uri=mongolock_uri)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["NAME", "STATE", "HOLDER", "TIME", "WAITING"]
    assert [row.split()[:3] for row in rows] == [["alpha", "held", "alpha-worker"], ["beta", "held", "beta-worker"]]
    assert "s left" in rows[1] and all(len(line) <= 80 for line in result.stdout.splitlines())

    listed = mongolock("list", "--json", "--db", database, "--collection", collection, uri=mongolock_uri)
    payload = json.loads(listed.stdout)
    assert [entry["name"] for entry in payload] == ["alpha", "beta"]
    for entry in payload:
        assert entry["held"] is True
        assert entry["fencing_token"] == tokens[entry["name"]]
        assert 0 < entry["time_left_ms"] <= 120_000
        assert entry["holder"]["pid"] == os.getpid()  # hold() ran in this process
        assert entry["holder"]["label"] == f"{entry['name']}-worker"


def test_inspect_one_lock(mongolock_uri: str, held_locks: tuple[str, str, dict[str, int]]) -> None:
    database, collection, tokens = held_locks
    result = mongolock("inspect", "alpha", "--json", "--db", database, "--collection", collection, uri=mongolock_uri)
    assert result.returncode == 0, result.stderr
    detail = json.loads(result.stdout)
    assert detail["name"] == "alpha" and detail["fencing_token"] == tokens["alpha"]
    assert detail["ttl_ms"] == 120_000 and detail["expires_at"].endswith("Z")
    text = mongolock("inspect", "beta", "--db", database, "--collection", collection, uri=mongolock_uri).stdout
    assert "lock      beta\n" in text and "state     held, " in text and "holder    beta-worker (" in text
    assert f"token     {tokens['beta']}\n" in text and "{" not in text, "people get lines, not a repr"


def test_release_force_breaks_the_lease(mongolock_uri: str, held_locks: tuple[str, str, dict[str, int]]) -> None:
    database, collection, tokens = held_locks
    where = ("--db", database, "--collection", collection)
    refused = mongolock("release", "alpha", *where, uri=mongolock_uri)
    assert refused.returncode == 5 and "--force" in refused.stderr
    unconfirmed = mongolock("release", "alpha", "--force", *where, uri=mongolock_uri)
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr
    forced = mongolock("release", "alpha", "--force", "--yes", *where, uri=mongolock_uri)
    assert forced.returncode == 0, forced.stderr
    assert "broke the lease of alpha-worker" in forced.stdout and str(tokens["alpha"]) in forced.stdout
    detail = json.loads(mongolock("inspect", "alpha", "--json", *where, uri=mongolock_uri).stdout)
    assert detail["held"] is False and detail["state"] == "released by force"
    beta = json.loads(mongolock("inspect", "beta", "--json", *where, uri=mongolock_uri).stdout)
    assert beta["held"] is True, "only the named lock was broken"
    again = mongolock("release", "alpha", "--force", "--yes", *where, uri=mongolock_uri)
    assert again.returncode == 0 and "'alpha' is released by force; nothing to release" in again.stdout
    as_json = json.loads(mongolock("release", "beta", "--force", "--yes", "--json", *where, uri=mongolock_uri).stdout)
    assert as_json["released"] is True and as_json["broken"]["fencing_token"] == tokens["beta"]
    assert as_json["broken"]["holder"]["label"] == "beta-worker"
    nothing = json.loads(mongolock("release", "beta", "--force", "--yes", "--json", *where, uri=mongolock_uri).stdout)
    assert nothing == {"name": "beta", "released": False, "broken": None, "ended": []}


def test_list_filters_states_and_utf8_json(mongolock_uri: str) -> None:
    """Held only, a name prefix; released, expired and never-released states; non-ASCII kept in JSON."""
    database, collection = "mongolock_cli", f"states_{uuid.uuid4().hex[:8]}"

    async def make_states() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
        try:
            locks = client[database][collection]
            held = AsyncMongoLock(locks, "stock:café", ttl=120.0, label="caisse-à-café")
            released = AsyncMongoLock(locks, "stock:tea", ttl=120.0)
            expired = AsyncMongoLock(locks, "nightly", ttl=120.0)
            for lock in (held, released, expired):
                assert await lock.acquire(blocking=False)
            await released.release()
            expired._forget_lease()  # its holder died: never released nor renewed
            # Its lease expires (set on the server's clock by hand: with a TTL of 0.3 s, a loaded
            # machine's reply could come too late for the acquire to hold it).
            await locks.update_one({"_id": "nightly"}, [{"$set": {"expiresAt": "$$NOW"}}])
        finally:
            await client.close()

    asyncio.run(make_states())
    where = ("--db", database, "--collection", collection)
    everything = json.loads(mongolock("list", "--json", *where, uri=mongolock_uri).stdout)
    assert {entry["name"]: entry["state"] for entry in everything} == {
        "nightly": "expired",
        "stock:café": "held",
        "stock:tea": "released",
    }
    raw = mongolock("list", "--json", "--held", *where, uri=mongolock_uri).stdout
    assert "caisse-à-café" in raw and "\\u" not in raw, "JSON keeps UTF-8 as it is"
    assert [entry["name"] for entry in json.loads(raw)] == ["stock:café"]
    table = mongolock("list", "--prefix", "stock:", *where, uri=mongolock_uri).stdout.splitlines()
    assert [row.split()[:2] for row in table[1:]] == [["stock:café", "held"], ["stock:tea", "released"]]
    empty = mongolock("list", "--held", "--prefix", "other", *where, uri=mongolock_uri)
    assert empty.returncode == 0 and "no locks held named other*" in empty.stdout


@pytest.mark.timing(margin=2.0)  # the read-only check passes: the server's clock read within 1 s
def test_a_password_in_the_uri_never_shows() -> None:
    with EmbeddedMongo(auth=("operator", PASSWORD)) as server:
        asyncio.run(hold(server.uri, "mongolock", "locks", "secret-job", "ops"))
        for arguments in (
            ["list"],
            ["list", "--json"],
            ["inspect", "secret-job"],
            ["release", "secret-job", "--force", "--yes"],
            ["check", "--read-only"],
            ["check", "--read-only", "--json"],
        ):
            result = mongolock(*arguments, uri=server.uri)
            assert result.returncode == 0, result.stdout + result.stderr
            assert PASSWORD not in result.stdout + result.stderr
        # The demo's worker processes get the URI on stdin: never where `ps` shows it to every user.
        demo = subprocess.Popen(
            [sys.executable, "-m", "mongolock_async", "demo", *SMALL_DEMO],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_environment(MONGODB_URI=server.uri),
        )
        # Watched while its first scenarios' workers run (the rest of the demo starts its workers
        # the same way), then interrupted as Ctrl-C would: that ends it cleanly, password unshown.
        seen_processes, deadline = 0, time.monotonic() + 120
        while demo.poll() is None and seen_processes < 40 and time.monotonic() < deadline:
            # -ww: every command line whole (ps cuts one at the width it guesses, which cut the worker's
            # module name off behind the runner's 64-character path to the venv's python).
            listing = subprocess.run(
                ["ps", "-ww", "-eo", "ppid,args"], capture_output=True, text=True, env=child_environment()
            ).stdout
            assert PASSWORD not in listing, "a password shows in the process list"
            # This demo's workers only: another test run's demo on the machine proves nothing of this one,
            # which may still be importing (a Ctrl-C then is a KeyboardInterrupt, exit -2).
            seen_processes += sum(
                line.split(None, 1)[0] == str(demo.pid) and "mongolock_async._cli.demo.worker" in line
                for line in listing.splitlines()
            )
            time.sleep(0.05)
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
        assert demo.returncode in (0, 130), err
        assert seen_processes > 0, f"no worker was ever seen: the check proves nothing ({out[-1500:]}{err[-1500:]})"
        assert PASSWORD not in out + err and "Traceback" not in err
        with MongoClient(server.uri) as client:
            left = [name for name in client.list_database_names() if name.startswith("mongolock_demo_")]
        assert left == [], "the interrupted demo left its database behind"
        wrong = server.uri.replace(PASSWORD, "not-the-password")
        for command in ("list", "check"):
            refused = mongolock(command, uri=wrong)
            assert refused.returncode == 6 and "rejected the credentials" in refused.stderr
            assert "not-the-password" not in refused.stdout + refused.stderr
        port = server.port
    unreachable = f"mongodb://operator:{PASSWORD}@127.0.0.1:{port}/?serverSelectionTimeoutMS=300"
    failed = mongolock("list", uri=unreachable)
    assert failed.returncode == 3
    assert "cannot reach MongoDB" in failed.stderr and "operator:***@" in failed.stderr
    assert PASSWORD not in failed.stdout + failed.stderr
    demo_failed = mongolock("demo", "--uri", unreachable)
    assert demo_failed.returncode == 3 and "cannot reach MongoDB" in demo_failed.stderr
    assert "Traceback" not in demo_failed.stderr and PASSWORD not in demo_failed.stdout + demo_failed.stderr


@pytest.fixture(scope="module")
def demo_server() -> Iterator[EmbeddedMongo]:
    """The demo's own kind of server: it drops databases, which the test run's users may not."""
    with EmbeddedMongo() as server:
        yield server


# Timing: whether the write landed within the settle window is judged by its reply's arrival
# before the drop returned; a pause of the test or its server near the window's end lets a write
# answered in time land after the last look (a fresh clone failed [0.4] so, beside another run).
@pytest.mark.timing(margin=0.2)
@pytest.mark.parametrize("late", [0.0, 0.1, 0.2, 0.3, 0.4])
async def test_the_demo_drops_its_database_for_good_though_a_killed_worker_wrote_late(
    demo_server: EmbeddedMongo, late: float
) -> None:
    """Stop 34's CI: after Ctrl-C, the demo killed its workers and dropped its database, and the
    database was back: the server still runs what a process sent before it died. Here such a
    write lands ``late`` seconds after the first drop, swept across the settle window; the
    database must be gone in the end. A run whose write a loaded machine delayed past the window
    proves nothing, and is made again (at most three runs)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(demo_server.uri)
    database = client[f"mongolock_demo_{uuid.uuid4().hex[:8]}"]

    async def write_after_the_drop() -> None:
        while await database.list_collection_names():  # noqa: ASYNC110 - polls the server
            await asyncio.sleep(0.005)
        await asyncio.sleep(late)
        await database.workers.insert_one({"late": late})

    try:
        for _ in range(3):
            await database.workers.insert_one({"_id": "before"})
            late_write = asyncio.create_task(write_after_the_drop())
            await drop_for_good(database, settle=DROP_SETTLE)
            written_while_settling = late_write.done()
            await late_write
            if written_while_settling:
                break
            await client.drop_database(database.name)
        assert written_while_settling, "the write came after the drop had settled in 3 runs: they prove nothing"
        assert await database.list_collection_names() == [], "the late write brought the database back"
    finally:
        await client.drop_database(database.name)
        await client.close()


@pytest.mark.parametrize(
    ("arguments", "uri", "code", "message"),
    [
        (["list"], None, 2, "no MongoDB URI"),
        (["list"], "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200", 3, "cannot reach MongoDB at 127.0.0.1:1"),
        (["list"], "not-a-uri", 3, "invalid MongoDB URI"),
        (["list", "--collection", "no_such_collection"], "SESSION", 4, "no collection mongolock.no_such_collection"),
        (["inspect", "ghost", "--collection", "present"], "SESSION", 4, "no lock named 'ghost'"),
        (["release", "ghost"], "SESSION", 5, "refusing to release"),
        (["demo", "--workers", "0"], None, 2, "--workers must be at least 1"),
        (["check", "--perf", "--read-only"], "SESSION", 2, "--perf writes scratch locks"),
        (["check", "--ttl", "0"], "SESSION", 2, "--ttl must be a positive number"),
        (["check", "--ttl", "10", "--safety-margin", "10"], "SESSION", 2, "--safety-margin must be"),
        (["check"], None, 2, "no MongoDB URI"),
        (["check"], "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200", 3, "cannot reach MongoDB at 127.0.0.1:1"),
    ],
)
def test_user_errors_give_a_message_and_an_exit_code(
    mongolock_uri: str, arguments: list[str], uri: str | None, code: int, message: str
) -> None:
    if uri == "SESSION":
        uri = mongolock_uri
        asyncio.run(hold(mongolock_uri, "mongolock", "present", f"x-{uuid.uuid4().hex[:6]}", "x"))
    result = mongolock(*arguments, uri=uri)
    assert result.returncode == code, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("mongodb://u:p@h:1/db?x=1", "mongodb://u:***@h:1/db?x=1"),
        ("mongodb+srv://u@h/", "mongodb+srv://u@h/"),
        ("mongodb://h1:1,h2:2/", "mongodb://h1:1,h2:2/"),
        ("mongodb://h:1", "mongodb://h:1/"),
        ("mongodb://u:p%40ss%3Aw%2Frd@h/", "mongodb://u:***@h/"),  # @, : and / in the password
        ("mongodb://u%40corp:s3cret@h/?authSource=admin", "mongodb://u%40corp:***@h/?authSource=admin"),
        (
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:s3cret",
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=***",
        ),
        (
            "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=s3cret",
            "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=***",
        ),
        ("mongdb://u:s3cret@h/", "<not a MongoDB URI: it must start with mongodb:// or mongodb+srv://>"),
        ("u:s3cret@h", "<not a MongoDB URI: it must start with mongodb:// or mongodb+srv://>"),
        ("mongodb://u:s3cret@h/?authSource", "<an invalid mongodb://... URI, not shown>"),
    ],
)
def test_redact_uri(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown
    assert "s3cret" not in redact_uri(uri)


@pytest.mark.parametrize(("answer", "code", "held_after"), [("y", 0, False), ("n", 1, True)])
def test_release_force_asks_on_a_terminal(
    mongolock_uri: str, held_locks: tuple[str, str, dict[str, int]], answer: str, code: int, held_after: bool
) -> None:
    database, collection, _ = held_locks
    where = ("--db", database, "--collection", collection)
    controller, terminal = os.openpty()
    try:
        os.write(controller, f"{answer}\n".encode())
        result = subprocess.run(
            [sys.executable, "-m", "mongolock_async", "release", "alpha", "--force", "--uri", mongolock_uri, *where],
            stdin=terminal,
            capture_output=True,
            text=True,
            env=child_environment(),
            timeout=60,
        )
    finally:
        os.close(controller)
        os.close(terminal)
    assert result.returncode == code, result.stdout + result.stderr
    assert "About to break the lease of alpha-worker" in result.stdout
    detail = json.loads(mongolock("inspect", "alpha", "--json", *where, uri=mongolock_uri).stdout)
    assert detail["held"] is held_after


# -- the first hour: every failure one line, with a documented exit code -------------------------------


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("uri", "code", "cause"),
    [
        (f"mongodb+srv://alice:{PASSWORD}@nowhere.invalid/", 3, "does not resolve (DNS)"),
        ("SESSION", 3, "pymongo-auth-aws"),  # the session's servers with authMechanism=MONGODB-AWS
        ("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300", 3, "connection refused"),
    ],
    ids=["srv-dns", "aws-extra", "refused"],
)
@pytest.mark.environment
def test_connection_failures_are_one_line_naming_the_cause(mongolock_uri: str, uri: str, code: int, cause: str) -> None:
    if uri == "SESSION":  # (MONGODB-AWS takes no password in the URI, nor another authSource)
        uri = uri_with_options(uri_without_credentials(mongolock_uri), authMechanism="MONGODB-AWS")
    result = mongolock("list", uri=uri)
    assert result.returncode == code
    assert cause in one_line(result) and PASSWORD not in result.stderr


def test_the_demo_with_rejected_credentials_is_one_line() -> None:
    with EmbeddedMongo(auth=("operator", PASSWORD)) as server:
        result = mongolock("demo", "--uri", server.uri.replace(PASSWORD, "wrong-password"))
    assert result.returncode == 6
    assert "rejected the credentials" in one_line(result) and "wrong-password" not in result.stderr


def test_a_busy_port_for_the_embedded_server_is_one_line_with_a_hint(tmp_path: Path) -> None:
    with EmbeddedMongo() as other:
        port = other.port
        result = mongolock("server", "--port", str(port), temporary=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert f"port {port} is already in use" in line and "--port 0" in line
    assert not list(tmp_path.iterdir()), "the failed start left its directory behind"


def test_version_and_help() -> None:
    version = mongolock("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mongolock {__version__}"
    for command in ("inspect", "release"):
        assert "the lock's name" in mongolock(command, "--help").stdout
    # The table has no fencing tokens (inspect and --json show them), so its help promises none.
    assert "fencing" not in mongolock("list", "--help").stdout


def test_inspect_of_a_held_lock_shows_no_release_of_it(mongolock_uri: str) -> None:
    database, collection = "mongolock_cli", f"relock_{uuid.uuid4().hex[:8]}"

    async def release_then_hold() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
        try:
            first = AsyncMongoLock(client[database][collection], "job", ttl=120.0)
            assert await first.acquire() and await first.release()
        finally:
            await client.close()
        await hold(mongolock_uri, database, collection, "job", "second")

    asyncio.run(release_then_hold())
    where = ("--db", database, "--collection", collection)
    detail = json.loads(mongolock("inspect", "job", "--json", *where, uri=mongolock_uri).stdout)
    assert detail["held"] is True and detail["released_at"] is None
    text = mongolock("inspect", "job", *where, uri=mongolock_uri).stdout
    assert "state     held" in text and "released" not in text


def test_the_table_fits_an_80_column_terminal(mongolock_uri: str) -> None:
    database, collection = "mongolock_cli", f"wide_{uuid.uuid4().hex[:8]}"
    long_name = "nightly-report:" + "tenant-with-a-rather-long-name:" * 3 + "end"
    asyncio.run(hold(mongolock_uri, database, collection, long_name, "a-label-for-the-report-worker-of-tenant-x"))
    where = ["--uri", mongolock_uri, "--db", database, "--collection", collection]
    lines = lines_on_a_terminal(["list", *where], columns=80)
    text = "\n".join(lines)
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "TIME", "WAITING"] and "─" in lines[1], text  # rich
    assert all(len(line) <= 80 for line in lines), "\n".join(line for line in lines if len(line) > 80)
    name = "".join(line.split()[0] for line in lines[2:])  # the name column, wrapped over several lines
    assert name == long_name, f"the name was cut: {name!r}\n{text}"
    assert "held" in lines[2] and "s left" in lines[2]


async def hold_permits(uri: str, database: str, collection: str, labels: list[str]) -> list[int]:
    """Take one permit of semaphore "pool" (limit 3) per label and leave them held."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        tokens = []
        for label in labels:
            semaphore = AsyncMongoSemaphore(client[database][collection], "pool", 3, ttl=120.0, label=label)
            assert await semaphore.acquire(blocking=False)
            assert semaphore.fencing_token is not None
            tokens.append(semaphore.fencing_token)
            semaphore._forget_lease()  # left held, as by a process that is still running elsewhere
        return tokens
    finally:
        await client.close()


def test_semaphores_are_listed_inspected_and_released_by_force(mongolock_uri: str) -> None:
    database, collection = "mongolock_cli", f"semaphores_{uuid.uuid4().hex[:8]}"
    where = ("--db", database, "--collection", collection)
    tokens = asyncio.run(hold_permits(mongolock_uri, database, collection, ["export-a", "export-b"]))
    listing = mongolock("list", *where, uri=mongolock_uri)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[1].split()[:4] == ["pool", "2/3", "held", "2"]
    detail = json.loads(mongolock("inspect", "pool", "--json", *where, uri=mongolock_uri).stdout)
    assert detail["kind"] == "semaphore" and detail["limit"] == 3 and detail["held"] is True
    assert [holder["holder"]["label"] for holder in detail["holders"]] == ["export-a", "export-b"]
    assert [holder["fencing_token"] for holder in detail["holders"]] == tokens
    text = mongolock("inspect", "pool", *where, uri=mongolock_uri).stdout
    assert "2 of 3 permits held" in text and "export-a (" in text and f"token {tokens[1]}" in text
    first_owner = detail["holders"][0]["owner"]
    one = mongolock("release", "pool", "--force", "--yes", "--holder", first_owner[:12], *where, uri=mongolock_uri)
    assert one.returncode == 0 and "Released 1 permit(s)" in one.stdout and "export-a" in one.stdout, one.stdout
    left = json.loads(mongolock("inspect", "pool", "--json", *where, uri=mongolock_uri).stdout)
    assert [holder["holder"]["label"] for holder in left["holders"]] == ["export-b"]
    rest = json.loads(mongolock("release", "pool", "--force", "--yes", "--json", *where, uri=mongolock_uri).stdout)
    assert rest["released"] is True and [permit["fencing_token"] for permit in rest["broken"]] == tokens[1:]
    after = json.loads(mongolock("inspect", "pool", "--json", *where, uri=mongolock_uri).stdout)
    assert after["held"] is False and after["holders"] == []
    wrong = mongolock("release", "pool", "--force", "--yes", "--holder", "x", *where, uri=mongolock_uri)
    assert wrong.returncode == 0 and "nothing to release" in wrong.stdout


async def hold_rwlock(uri: str, database: str, collection: str) -> None:
    """Two readers hold read-write lock "index"; a writer's place waits behind them."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        rw = AsyncMongoRWLock(client[database][collection], "index", ttl=120.0)
        for label in ("reader-a", "reader-b"):
            reader = rw.read(label=label)
            assert await reader.acquire(blocking=False)
            reader._forget_lease()  # left held, as by a process that is still running elsewhere
        writer = rw.write(label="writer")
        assert not await writer.acquire(timeout=0.3)
    finally:
        await client.close()


def test_read_write_locks_are_listed_inspected_and_released_by_force(mongolock_uri: str) -> None:
    database, collection = "mongolock_cli", f"rwlocks_{uuid.uuid4().hex[:8]}"
    where = ("--db", database, "--collection", collection)
    asyncio.run(hold_rwlock(mongolock_uri, database, collection))
    listing = mongolock("list", *where, uri=mongolock_uri)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[1].split()[:6] == ["index", "read", "by", "2", "2", "readers"]
    detail = json.loads(mongolock("inspect", "index", "--json", *where, uri=mongolock_uri).stdout)
    assert detail["kind"] == "rwlock" and detail["writer"] is None
    assert [reader["holder"]["label"] for reader in detail["readers"]] == ["reader-a", "reader-b"]
    text = mongolock("inspect", "index", *where, uri=mongolock_uri).stdout
    assert "state     read by 2" in text and "reader-a (" in text
    forced = json.loads(mongolock("release", "index", "--force", "--yes", "--json", *where, uri=mongolock_uri).stdout)
    assert forced["released"] is True and len(forced["broken"]) == 2
    assert json.loads(mongolock("inspect", "index", "--json", *where, uri=mongolock_uri).stdout)["readers"] == []


async def lead_election(uri: str, database: str, collection: str) -> int:
    """Election "leader" led by "replica-a", left leading; returns its term."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        leader = AsyncMongoElection(client[database][collection], "leader", ttl=120.0, label="replica-a")
        term = await leader.campaign(timeout=5)
        leader._forget_lease()  # left leading, as by a process that is still running elsewhere
        return term
    finally:
        await client.close()


@pytest.mark.timing(margin=4.5)  # a campaign for a free election within 5 s
def test_elections_are_listed_inspected_and_their_leader_deposed(mongolock_uri: str) -> None:
    database, collection = "mongolock_cli", f"elections_{uuid.uuid4().hex[:8]}"
    where = ("--db", database, "--collection", collection)
    term = asyncio.run(lead_election(mongolock_uri, database, collection))
    worker = WORKERS / "election_worker.py"
    candidate = subprocess.Popen(  # campaigns, then leads until killed
        [sys.executable, str(worker), mongolock_uri, database, collection, "lead", "-", "120", "-"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_environment(),
    )
    try:
        give_up_at = time.monotonic() + 20
        while not (detail := json.loads(mongolock("inspect", "leader", "--json", *where, uri=mongolock_uri).stdout))[
            "candidates"
        ]:
            assert time.monotonic() < give_up_at, "the candidate's place never showed"
        assert detail["kind"] == "election" and detail["leader"]["holder"]["label"] == "replica-a"
        assert detail["leader"]["fencing_token"] == term
        assert [place["pid"] for place in detail["candidates"]] == [candidate.pid]
        listing = mongolock("list", *where, uri=mongolock_uri)
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.splitlines()[1].split()[:3] == ["leader", "led", "replica-a"]
        text = mongolock("inspect", "leader", *where, uri=mongolock_uri).stdout
        assert "election  leader" in text and f"term      {term}, since " in text
        assert f"candidates leader {candidate.pid} (" in text
        released = mongolock("release", "leader", "--force", "--yes", "--json", *where, uri=mongolock_uri).stdout
        forced = json.loads(released)
        assert forced["released"] is True and [permit["fencing_token"] for permit in forced["broken"]] == [term]
        assert candidate.stdout is not None
        said = candidate.stdout.readline().split()  # the candidate leads next, in a higher term
        assert said[:1] == ["leading"] and int(said[1]) > term, said
        leader = json.loads(mongolock("inspect", "leader", "--json", *where, uri=mongolock_uri).stdout)["leader"]
        assert leader["holder"]["pid"] == candidate.pid
    finally:
        candidate.kill()
        candidate.wait()


def test_release_force_holder_breaks_one_permit_of_a_process_or_refuses(mongolock_uri: str) -> None:
    """Two permits of one process: their tokens share a start, so only a whole token (or a start no
    other holder has) names one; anything else is refused, listing the candidates, and breaks nothing."""
    database, collection = "mongolock_cli", f"one_process_{uuid.uuid4().hex[:8]}"
    where = ("--db", database, "--collection", collection)

    async def hold() -> dict[str, str]:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongolock_uri)
        try:
            return await two_permits_of_one_process(client[database][collection])
        finally:
            await client.close()

    tokens = asyncio.run(hold())

    def holders() -> dict[str, str]:
        detail = json.loads(mongolock("inspect", "pool", "--json", *where, uri=mongolock_uri).stdout)
        return {entry["holder"]["label"]: entry["owner"] for entry in detail["holders"]}

    assert holders() == tokens
    text = mongolock("inspect", "pool", *where, uri=mongolock_uri).stdout
    assert tokens["export-a"] in text and tokens["export-b"] in text, "inspect shows what selects each holder"
    for prefix, code, said in ((tokens["export-a"][:12], 2, "matches 2 holders"), ("feedface", 4, "no live holder")):
        refused = mongolock("release", "pool", "--force", "--yes", "--holder", prefix, *where, uri=mongolock_uri)
        assert refused.returncode == code, refused.stdout + refused.stderr
        assert said in refused.stderr and "Traceback" not in refused.stderr
        assert tokens["export-a"] in refused.stderr and tokens["export-b"] in refused.stderr, "lists the candidates"
        assert holders() == tokens, "nothing was broken"
    one = mongolock("release", "pool", "--force", "--yes", "--holder", tokens["export-a"], *where, uri=mongolock_uri)
    assert one.returncode == 0, one.stdout + one.stderr
    said = one.stdout.splitlines()[-1]
    assert "Released 1 permit(s)" in said and "export-a" in said and "export-b" not in said, one.stdout
    assert holders() == {"export-b": tokens["export-b"]}


@pytest.mark.parametrize(
    "arguments",
    [
        ["list"],
        ["list", "--json"],
        ["inspect", "alpha"],
        ["inspect", "alpha", "--json"],
        ["release", "alpha", "--force", "--yes"],
        ["release", "alpha", "--force", "--yes", "--json"],
        ["--help"],
        ["list", "--help"],
        ["--version"],
        ["server", "--port", "0"],
    ],
    ids=" ".join,
)
def test_a_reader_that_goes_away_ends_the_command_quietly(
    mongolock_uri: str, held_locks: tuple[str, str, dict[str, int]], arguments: list[str]
) -> None:
    """``mongolock list | head -1``: the pipe is closed before the command writes; no traceback."""
    database, collection, _ = held_locks
    where = ["--db", database, "--collection", collection] if arguments[0] in ("list", "inspect", "release") else []
    # Buffered, as Python's stdout is by default (an empty PYTHONUNBUFFERED is unset): set on this
    # project's machines, it hid a help text lost at the flush at exit (exit 1), as a hosted
    # runner's job ran into.
    command = subprocess.Popen(
        [sys.executable, "-m", "mongolock_async", *arguments, *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_environment(MONGODB_URI=mongolock_uri, PYTHONUNBUFFERED=""),
    )
    assert command.stdout is not None
    command.stdout.close()  # the reader is gone before the first line
    _, err = command.communicate(timeout=120)
    assert err.decode() == "", err.decode()
    # argparse ignores a failed write of its help and version and exits 0 as usual; a command cut
    # short exits 1, as Python's own recipe for a closed pipe does.
    assert command.returncode == (0 if "--help" in arguments or "--version" in arguments else 1)


@pytest.mark.parametrize("without_rich", [False, True], ids=["rich", "plain"])
def test_a_long_holder_is_shortened_to_fit_the_terminal_never_the_name(mongolock_uri: str, without_rich: bool) -> None:
    database, collection = "mongolock_cli", f"fit_{uuid.uuid4().hex[:8]}"
    name, label = "nightly-report:tenant-07", "the-report-worker-of-tenant-seven-in-the-eu-west-region-" + "x" * 20
    asyncio.run(hold(mongolock_uri, database, collection, name, label))
    lines = lines_on_a_terminal(
        ["list", "--uri", mongolock_uri, "--db", database, "--collection", collection], columns=80,
        without_rich=without_rich,
    )  # fmt: skip
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "TIME", "WAITING"], lines
    assert ("─" in lines[1]) is not without_rich, "rich draws the table, or it is the plain one"
    (row,) = [line for line in lines if line.startswith(name)]
    assert row.split()[:2] == [name, "held"] and row.endswith("s left"), row
    # The columns take the width their content needs: what is left goes to the holder.
    assert label[:16] in row and label not in row, row


@pytest.mark.parametrize("command", [["list"], ["inspect", "job"], ["demo", "--uri", "URI"]], ids=" ".join)
def test_an_srv_host_that_does_not_resolve_is_named_without_a_port(command: list[str]) -> None:
    uri = "mongodb+srv://cluster0.nowhere.invalid/?serverSelectionTimeoutMS=2000"
    result = mongolock(*(uri if argument == "URI" else argument for argument in command), uri=uri)
    assert result.returncode == 3, result.stdout + result.stderr
    line = one_line(result)
    assert "cannot reach MongoDB at cluster0.nowhere.invalid (URI" in line and ":None" not in line, line


def test_the_demo_help_names_its_seven_scenarios() -> None:
    text = " ".join(mongolock("demo", "--help").stdout.split())
    scenarios = ("flash sale", "run-once job", "crash and takeover", "paused holder", "rate limit", "leader", "period")
    for scenario in scenarios:
        assert scenario in text, text
