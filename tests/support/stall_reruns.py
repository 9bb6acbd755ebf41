"""A pytest plugin (tests/conftest.py loads it): a test that failed while the machine stalled runs
again, at most ``RERUNS`` more times; one that failed with no stall seen fails the run.

A stall is what the run's watcher (``stalls``, a process of its own) saw: nothing run for
``stalls.PAUSE`` or more, or the wall clock stepping against the monotonic one. Either breaks what
a timing test assumes (a lease of two seconds outlives its holder's pause of one), not what it
tests. Before a test runs again, its process waits until the watcher has seen no stall for
``stall_calm`` seconds (an ini option, 10 by default; at most 60 s). pytest-rerunfailures (16.7 or
later: it asks the condition after the failure) runs the attempts; this plugin decides which
failures get one, attaches what was seen to the failed attempt's report, and lists the tests that
ran again at the end of the run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_rerunfailures  # noqa: F401  (the dev extra's: it must be there, or no test runs again)

from tests.support import stalls
from tests.support.run_settings import child_environment
from tests.support.stalls import Mark, Stall, StallLog

RERUNS = 2
LONGEST_WAIT = 60.0
SECTION = "stalls seen during this attempt"
LOG_VARIABLE = "MONGOLOCK_TEST_STALL_LOG"
"""Where the run's watcher writes; set by the process that starts it (the one pytest-xdist's workers
are started from), inherited by the workers. Its ``MONGOLOCK_`` prefix keeps it from the children
tests start (``child_environment``): a pytest run a test starts watches for itself."""


@dataclass
class _Watching:
    log: StallLog | None = None
    watcher: subprocess.Popen[bytes] | None = None
    """The watcher, in the process that started it."""


_run = _Watching()
_attempt = pytest.StashKey[Mark]()
_stalls = pytest.StashKey[list[Stall]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "stall_calm",
        "seconds without a stall a test waits for before it runs again after a stall (tests/support/stall_reruns.py)",
        default="10",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="mongolock-stalls-"), "stalls.log")
        _run.watcher = _start_watcher(Path(path))
        os.environ[LOG_VARIABLE] = path
    _run.log = StallLog(Path(path))


def _start_watcher(path: Path, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start a watcher writing to ``path`` (which must not exist yet); return once it watches."""
    command = [sys.executable, stalls.__file__, str(path)]
    watcher = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=child_environment())
    give_up_at = time.monotonic() + timeout
    while not path.exists():
        if watcher.poll() is not None or time.monotonic() > give_up_at:
            watcher.kill()
            raise RuntimeError(f"the stall watcher did not start (exit status {watcher.poll()})")
        time.sleep(0.01)
    return watcher


def pytest_unconfigure(config: pytest.Config) -> None:
    if _run.watcher is not None and _run.log is not None:
        _run.watcher.terminate()
        _run.watcher.wait()
        shutil.rmtree(_run.log.path.parent, ignore_errors=True)
        del os.environ[LOG_VARIABLE]
    _run.log = _run.watcher = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.flaky(reruns=RERUNS, condition=functools.partial(_stalled, item)))


def _stalled(item: pytest.Item, error: BaseException | None) -> bool:
    """pytest-rerunfailures' condition: whether the failed attempt saw a stall."""
    return bool(item.stash.get(_stalls, []))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    assert _run.log is not None
    if getattr(item, "execution_count", 1) > 1:  # pytest-rerunfailures counts the attempts
        _run.log.wait_for_calm(float(item.config.getini("stall_calm")), longest=LONGEST_WAIT)
    item.stash[_attempt] = _run.log.mark()
    item.stash[_stalls] = []
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _run.log is not None and _attempt in item.stash:
        seen = _run.log.stalls_since(item.stash[_attempt])
        if seen:
            item.stash[_stalls] = seen
            report.sections.append((SECTION, "\n".join(map(str, seen))))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the watcher saw during the run, which tests ran again, and what was seen while their
    failed attempt ran."""
    seen = _run.log.stalls() if _run.watcher is not None and _run.log is not None else []
    if seen:
        times = "once" if len(seen) == 1 else f"{len(seen)} times"
        terminalreporter.write_sep("=", f"the machine stalled {times} during the run")
        for stall in seen[:20]:
            terminalreporter.write_line(str(stall))
        if len(seen) > 20:
            terminalreporter.write_line(f"and {len(seen) - 20} more")
    reruns = terminalreporter.stats.get("rerun", [])
    if reruns:
        terminalreporter.write_sep("=", "ran again: they failed while this machine stalled")
    for report in reruns:
        during = "; ".join(text.replace("\n", "; ") for name, text in report.sections if name == SECTION)
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "").split("\n")[0][:100]
        terminalreporter.write_line(f"{report.nodeid} ({report.when} failed: {crash}): {during}")
