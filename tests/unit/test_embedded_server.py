"""The embedded SecantusDB server: start, ping, restart with data intact, pause/resume, clean stop."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from bson import Int64
from bson.binary import UUID_SUBTYPE, Binary
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from mongolock_async.testing import EmbeddedMongo, EmbeddedServerError
from mongolock_async.testing import server as server_module
from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.libfaketime import objects_of, preloaded
from tests.support.processes import ROOT
from tests.support.run_settings import child_environment


def client_for(server: EmbeddedMongo) -> MongoClient[dict[str, object]]:
    return MongoClient(server.uri, serverSelectionTimeoutMS=5_000, socketTimeoutMS=5_000)


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_starts_and_answers_ping() -> None:
    with EmbeddedMongo() as server, client_for(server) as client:
        assert server.uri.startswith("mongodb://127.0.0.1:")
        assert client.admin.command("ping")["ok"] == 1
        assert client.admin.command("hello").get("setName"), "replica-set mode is the default"


def test_standalone_mode_drops_the_replica_set() -> None:
    with EmbeddedMongo(replica_set=False) as server, client_for(server) as client:
        assert "setName" not in client.admin.command("hello")


def test_the_oplog_stays_short() -> None:
    # A stream's opening decodes the embedded server's whole oplog, under the lock every request
    # takes: it must not grow with the writes a test run makes (it prunes every 1,000 writes).
    writes = 3 * server_module.OPLOG_ENTRIES
    with EmbeddedMongo() as server, client_for(server) as client:
        for first in range(0, writes, 100):
            client.db.things.insert_many([{"_id": n} for n in range(first, first + 100)])
        assert client.db.things.count_documents({}) == writes
        assert client.local["oplog.rs"].count_documents({}) <= 2 * server_module.OPLOG_ENTRIES


def test_a_retried_write_is_applied_once() -> None:
    # The server keeps one retryable-write reply per session (EmbeddedMongo's patch, as mongod): a
    # retry of the newest write, same session and txnNumber, gets the first reply, not a second write.
    with EmbeddedMongo() as server, client_for(server) as client:
        session = {"id": Binary(uuid.uuid4().bytes, UUID_SUBTYPE)}

        def increment(txn_number: int) -> object:
            reply = client.db.command(
                {
                    "findAndModify": "counters",
                    "query": {"_id": 1},
                    "update": {"$inc": {"n": 1}},
                    "upsert": True,
                    "new": True,
                    "lsid": session,
                    "txnNumber": Int64(txn_number),
                }
            )
            return reply["value"]["n"]

        assert [increment(1), increment(1), increment(2), increment(2), increment(3)] == [1, 1, 2, 2, 3]
        assert client.db.counters.find_one({"_id": 1}) == {"_id": 1, "n": 3}


@pytest.mark.parametrize("crash", [False, True], ids=["clean-stop", "sigkill"])
def test_restart_keeps_data(crash: bool) -> None:
    with EmbeddedMongo() as server:
        with client_for(server) as client:
            client.db.things.insert_one({"_id": 1, "value": "kept"})
        old_pid, old_port = server.pid, server.port
        server.restart(crash=crash)
        assert server.pid != old_pid
        assert server.port == old_port
        with client_for(server) as client:
            assert client.db.things.find_one({"_id": 1}) == {"_id": 1, "value": "kept"}


def test_pause_and_resume() -> None:
    with EmbeddedMongo() as server, client_for(server) as client:
        client.admin.command("ping")
        server.pause()
        with MongoClient(server.uri, serverSelectionTimeoutMS=500, socketTimeoutMS=500) as impatient:
            with pytest.raises(PyMongoError):
                impatient.admin.command("ping")
        server.resume()
        assert client.admin.command("ping")["ok"] == 1


def test_close_frees_the_port_and_removes_the_directory() -> None:
    server = EmbeddedMongo()
    server.start()
    port, workdir, pid = server.port, server.storage_path, server.pid
    assert port is not None and workdir is not None and pid is not None
    assert workdir.exists()
    server.close()
    assert port_is_free(port)
    assert not workdir.parent.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_auth_requires_the_credentials_in_the_uri() -> None:
    with EmbeddedMongo(auth=("alice", "s3cret")) as server:
        assert "alice:s3cret@" in server.uri
        with client_for(server) as client:
            assert client.admin.command("ping")["ok"] == 1
            client.db.things.insert_one({"_id": 1})
        anonymous_uri = server.uri.replace("alice:s3cret@", "")
        with MongoClient(anonymous_uri, serverSelectionTimeoutMS=5_000) as anonymous:
            with pytest.raises(PyMongoError):
                anonymous.db.things.find_one({"_id": 1})


def test_start_up_failure_shows_the_log() -> None:
    with EmbeddedMongo() as first:
        # A second server on the same data directory and port cannot start.
        clash = EmbeddedMongo(startup_timeout=15)
        clash._workdir = first.storage_path.parent if first.storage_path else None
        clash.port = first.port
        try:
            with pytest.raises(EmbeddedServerError, match="log"):
                clash.start()
        finally:
            clash._workdir = None  # the directory belongs to ``first``
            clash.stop()


async def test_async_context_manager() -> None:
    async with EmbeddedMongo() as server:
        assert server.running
        with client_for(server) as client:
            assert client.admin.command("ping")["ok"] == 1
        workdir = server.storage_path
    assert not server.running
    assert workdir is not None and not workdir.exists()


def server_pid_of_child(script: str) -> tuple[subprocess.Popen[str], int]:
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(),
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, child.stderr.read() if child.stderr else ""
    return child, int(line)


def wait_until_gone(pid: int, seconds: float = 15.0) -> bool:
    give_up_at = time.monotonic() + seconds
    while time.monotonic() < give_up_at:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A killed server may linger as a zombie of init for a moment; /proc tells.
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


START_AND_REPORT = (
    "from mongolock_async.testing import EmbeddedMongo\n"
    "server = EmbeddedMongo(); server.start(); print(server.pid, flush=True)\n"
)


def test_no_orphan_when_the_owner_process_is_killed() -> None:
    child, server_pid = server_pid_of_child(START_AND_REPORT + "import time; time.sleep(120)\n")
    child.kill()
    child.wait()
    assert wait_until_gone(server_pid), "the embedded server outlived the SIGKILLed process that started it"


def test_no_orphan_when_the_owner_process_fails() -> None:
    child, server_pid = server_pid_of_child(START_AND_REPORT + "raise RuntimeError('a failing test')\n")
    child.wait(timeout=60)
    assert child.returncode != 0
    assert wait_until_gone(server_pid), "the embedded server outlived the failing process that started it"


def workdir_of(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))


@pytest.mark.parametrize(
    "ending",
    ["exit without close", "exception", "SIGTERM", "SIGKILL", "started from a thread, SIGKILL"],
)
def test_nothing_is_left_behind_however_the_owner_ends(ending: str) -> None:
    # Under libfaketime, whose objects in /dev/shm (named after the server's pid) must go too.
    start = (
        "import threading; from mongolock_async.testing import EmbeddedMongo\n"
        f"server = EmbeddedMongo(environment={preloaded(FAKETIME='+0s')!r})\n"
        + (
            "thread = threading.Thread(target=server.start); thread.start(); thread.join()\n"
            if "thread" in ending
            else "server.start()\n"
        )
        + "print(server.pid, flush=True)\n"
    )
    finish = {
        "exit without close": "",
        "exception": "raise RuntimeError('a failing script')\n",
        "SIGTERM": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)\n",
        "SIGKILL": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n",
    }[ending.split(", ")[-1]]
    child = subprocess.Popen(
        [sys.executable, "-c", start + "import time; time.sleep(0.5)\n" + finish],
        stdout=subprocess.PIPE,
        text=True,
        env=child_environment(),
    )
    assert child.stdout is not None
    server_pid = int(child.stdout.readline())
    workdir = workdir_of(server_pid)
    assert objects_of(server_pid), "libfaketime made no objects for the server: nothing to check"
    child.wait(timeout=60)
    assert wait_until_gone(server_pid), "the server outlived its owner"
    give_up_at = time.monotonic() + 10
    while (workdir.exists() or objects_of(server_pid)) and time.monotonic() < give_up_at:
        time.sleep(0.1)
    assert not workdir.exists(), f"{workdir} was left behind"
    assert not objects_of(server_pid), f"libfaketime's {objects_of(server_pid)} were left behind"


@pytest.mark.parametrize("ending", ["close", "clean stop", "SIGKILL"])
def test_a_server_under_libfaketime_leaves_none_of_its_objects(ending: str) -> None:
    # libfaketime removes the semaphore and shared memory it names after the server's pid only at a
    # normal exit; left behind, they make a later faketime command given that pid exit 1.
    with EmbeddedMongo(environment=preloaded(FAKETIME="+0s")) as server:
        assert server.pid is not None
        pids = [server.pid]
        assert objects_of(server.pid), "libfaketime made no objects for the server: nothing to check"
        if ending != "close":
            server.restart(crash=ending == "SIGKILL")
            assert server.pid is not None
            pids.append(server.pid)
            assert not objects_of(pids[0]), f"{ending}: {objects_of(pids[0])} were left behind"
            assert objects_of(server.pid), "the restarted server has its own"
    assert not objects_of(pids[-1]), f"close: {objects_of(pids[-1])} were left behind"


def test_a_failed_start_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Path] = []
    original = tempfile.mkdtemp

    def mkdtemp(**arguments: str) -> str:
        made.append(Path(original(**arguments)))
        return str(made[-1])

    with EmbeddedMongo() as first:
        clash = EmbeddedMongo(port=first.port, startup_timeout=15)
        monkeypatch.setattr(server_module.tempfile, "mkdtemp", mkdtemp)
        with pytest.raises(EmbeddedServerError, match="Address already in use"):
            clash.start()
    assert len(made) == 1 and not made[0].exists(), "the failed start left its directory behind"


def test_the_suite_fails_if_it_leaves_a_directory_behind(tmp_path: Path) -> None:
    # The check this suite runs at its end (tests/conftest.py), on a run that leaks a directory.
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_leak.py").write_text(
        "import tempfile\n\ndef test_leaks() -> None:\n    tempfile.mkdtemp(prefix='mongolock-embedded-')\n"
    )
    scratch = tmp_path / "tmp"  # the run's temporary directory: the leak stays in there
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_leak.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(PYTHONPATH=str(ROOT), TMPDIR=str(scratch)),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "left 1 embedded server directories behind" in result.stdout


def test_a_start_removes_directories_whose_server_and_reaper_are_gone() -> None:
    # What a SIGKILL of a whole session (owner and reaper) leaves behind; a directory a live
    # process still names (a reaper of a stopped server) and one just made (a start under way) stay.
    abandoned = Path(tempfile.mkdtemp(prefix="mongolock-embedded-"))
    (abandoned / "data").mkdir()
    in_use = Path(tempfile.mkdtemp(prefix="mongolock-embedded-"))
    just_made = Path(tempfile.mkdtemp(prefix="mongolock-embedded-"))
    long_ago = time.time() - 3600
    for directory in (abandoned, in_use):
        os.utime(directory, (long_ago, long_ago))
    holder = subprocess.Popen(
        ["sh", "-c", "sleep 60", "mongolock-embedded-reaper", str(in_use)], env=child_environment()
    )
    try:
        with EmbeddedMongo():
            assert not abandoned.exists(), "an abandoned directory was left"
            assert in_use.exists() and just_made.exists()
    finally:
        holder.kill()
        holder.wait()
        for directory in (in_use, just_made):
            shutil.rmtree(directory, ignore_errors=True)


def test_a_pipelines_problem_is_found_in_any_stage_however_often_it_is_sent(
    mongolock_admin_client: MongoClient[dict[str, object]],
) -> None:
    """The embedded server remembers each pipeline stage's parse-time check (EmbeddedMongo's patch):
    a problem must still be reported wherever the stage stands and however often it is sent, and a
    good stage must still be applied. MongoDB reports an undefined variable as 17276 when it parses
    the pipeline, before reading a document: the bad pipelines match none, so only that check
    can report it."""
    good = {"$set": {"a": {"$add": ["$a", 1]}}}
    bad = {"$set": {"b": {"$concat": ["x", "$$undefinedVariable"]}}}
    things = mongolock_admin_client[TEST_DATABASE][f"stages_{uuid.uuid4().hex[:8]}"]
    try:
        things.insert_one({"_id": 1, "a": 0})
        for _ in range(3):
            things.update_one({"_id": 1}, [good])
            for pipeline in ([bad], [good, bad], [bad, good]):
                with pytest.raises(OperationFailure) as update:
                    things.update_one({"_id": "absent"}, pipeline)
                with pytest.raises(OperationFailure) as find_and_modify:
                    things.find_one_and_update({"_id": "absent"}, pipeline)
                assert update.value.code == find_and_modify.value.code == 17276, pipeline
        assert things.find_one({"_id": 1}) == {"_id": 1, "a": 3}
    finally:
        things.drop()
