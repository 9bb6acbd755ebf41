"""What a user's own project gets: the pytest plugin's fixtures (strict mode, with and without
Motor), and ``mongolock server`` for development."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pymongo import MongoClient

from tests.support.run_settings import child_environment

USER_TEST = '''
import pytest

from mongolock_async import AsyncMongoLock


@pytest.mark.asyncio
async def test_a_lock_in_a_fresh_collection(mongolock_collection, mongolock_driver):
    lock = AsyncMongoLock(mongolock_collection, "job", ttl=5)
    async with lock:
        assert await lock.owned()
    assert await mongolock_collection.count_documents({}) == 1


def test_the_uri(mongolock_uri):
    assert mongolock_uri.startswith("mongodb://")
'''


def run_user_project(directory: Path, uri: str, *, without_motor: bool) -> subprocess.CompletedProcess[str]:
    (directory / "test_locks.py").write_text(USER_TEST)
    # The configuration docs/testing.md gives.
    (directory / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    blocked = "sys.modules['motor'] = None; " if without_motor else ""  # as if Motor were not installed
    runner = f"import sys; {blocked}import pytest; sys.exit(pytest.main(['-v', '-p', 'no:cacheprovider']))"
    return subprocess.run(
        [sys.executable, "-c", runner],
        cwd=directory,
        capture_output=True,
        text=True,
        env=child_environment(MONGODB_URI=uri),
        timeout=300,
    )


@pytest.mark.timing(margin=4.5)  # the user's test holds a 5 s lease
@pytest.mark.environment
@pytest.mark.parametrize("without_motor", [False, True], ids=["with-motor", "without-motor"])
def test_the_plugin_works_in_a_strict_mode_project(
    mongolock_uri: str, tmp_path: Path, without_motor: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the real-MongoDB workflow's jobs set for this test run: the user's project must not
    # inherit them (it ran with one driver, or sharded its collection on a server without sharding).
    monkeypatch.setenv("MONGOLOCK_TEST_DRIVERS", "pymongo")
    monkeypatch.setenv("MONGOLOCK_TEST_SHARDED", "1")
    result = run_user_project(tmp_path, mongolock_uri, without_motor=without_motor)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_a_lock_in_a_fresh_collection[pymongo] PASSED" in result.stdout
    assert ("[motor] PASSED" in result.stdout) is not without_motor
    assert "warning" not in result.stdout.lower(), "a user's first run shows a warning"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_mongolock_server_runs_until_stopped_and_cleans_up(stop: signal.Signals) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "mongolock_async", "server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_environment(),
    )
    try:
        assert server.stdout is not None
        uri = re.search(r"listening: (\S+)", server.stdout.readline())
        data = re.search(r"data in (\S+)", server.stdout.readline())
        assert uri and data
        with MongoClient(uri.group(1), serverSelectionTimeoutMS=10_000) as client:
            assert client.admin.command("ping")["ok"] == 1
        assert Path(data.group(1)).exists()
        server.send_signal(stop)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
    for _ in range(20):
        if not Path(data.group(1)).parent.exists():
            break
        time.sleep(0.1)
    assert not Path(data.group(1)).parent.exists(), "the data directory was left behind"

