"""A pytest plugin (tests/conftest.py loads it): what a failure means, and the few that run again.

- A test marked ``safety`` asserts a promise of the library (exclusion, at most N, a writer alone,
  one leader, tokens rising, stale fenced writes refused, no ghost hand-off), judged so that no
  pause of any process can fail it while the library is right. It never runs again.
- A test marked ``timing(margin=S)`` asserts timing, and S is the slack it allows: the shortest
  pause of one of its own processes that could make a correct library fail it. After a failure it
  runs again (at most ``RERUNS`` more times) only if the watcher (``stalls``) saw, during the failed
  attempt, a pause of at least S of the test's worker, of a process descended from it (a child it
  started, its embedded server), or of the whole machine, or a wall-clock step of at least S. A
  process stopped by a signal does not count: in this suite only a test stops one, on purpose.
- Any other test never runs again.

The run as a whole runs at most ``--max-suite-reruns`` tests again (pyproject.toml's addopts); a
failure past that cap stands. pytest-rerunfailures (16.7 or later: it asks the condition after the
failure) runs the attempts; this plugin decides which failures get one, attaches the decision and
what was seen to the failed attempt's report, and lists at the end of the run every test that ran
again with the pause that justified it. Before a test runs again, its process waits until nothing
was seen of it for ``stall_calm`` seconds (an ini option, 10 by default; at most 60 s).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
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
SECTION = "pauses seen during this attempt"
LOG_VARIABLE = "MONGOLOCK_TEST_STALL_LOG"
"""Where the run's watcher writes; set by the process that starts it (the one pytest-xdist's workers
are started from), inherited by the workers. Its ``MONGOLOCK_`` prefix keeps it from the children
tests start (``child_environment``): a pytest run a test starts watches for itself."""


@dataclass(frozen=True)
class Verdict:
    """Whether a failed attempt runs again, and why (shown in its report and the run's summary)."""

    again: bool
    reason: str


def judge(*, safety: bool, margin: float | None, seen: Sequence[Stall]) -> Verdict:
    """The rule: only a timing test runs again, and only for a pause that can explain its failure."""
    if safety:
        return Verdict(False, "a safety test never runs again")
    if margin is None:
        return Verdict(False, "not a timing test: it never runs again")
    counted = [stall for stall in seen if not stall.stopped]
    longest = max(counted, key=lambda stall: stall.duration, default=None)
    if longest is not None and longest.duration >= margin:
        return Verdict(True, f"a pause of {longest.duration:.2f} s >= its margin of {margin:g} s: {longest}")
    largest = f"the longest seen {longest.duration:.2f} s" if longest else "none seen"
    return Verdict(False, f"no pause of its processes as long as its margin of {margin:g} s ({largest})")


def margin_of(item: pytest.Item) -> float | None:
    """The margin a ``timing`` marker declares; a marker without a positive one is a usage error."""
    marker = item.get_closest_marker("timing")
    if marker is None:
        return None
    margin = marker.kwargs.get("margin")
    if isinstance(margin, bool) or not isinstance(margin, int | float) or margin <= 0 or marker.args:
        raise pytest.UsageError(f"{item.nodeid}: write @pytest.mark.timing(margin=SECONDS), SECONDS > 0")
    return float(margin)


@dataclass
class _Watching:
    log: StallLog | None = None
    watcher: subprocess.Popen[bytes] | None = None
    """The watcher, in the process that started it."""


_run = _Watching()
_attempt = pytest.StashKey[Mark]()
_verdict = pytest.StashKey[Verdict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "stall_calm",
        "seconds without a pause a test waits for before it runs again (tests/support/stall_reruns.py)",
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
        margin = margin_of(item)  # checked for every test, so that a bad marker fails the run at once
        if margin is not None and item.get_closest_marker("safety") is None:
            item.add_marker(pytest.mark.flaky(reruns=RERUNS, condition=functools.partial(_again, item)))


def _again(item: pytest.Item, error: BaseException | None) -> bool:
    """pytest-rerunfailures' condition, asked after the failure."""
    verdict = item.stash.get(_verdict, None)
    return verdict is not None and verdict.again


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    assert _run.log is not None
    if getattr(item, "execution_count", 1) > 1:  # pytest-rerunfailures counts the attempts
        _run.log.wait_for_calm(float(item.config.getini("stall_calm")), longest=LONGEST_WAIT, pid=os.getpid())
    item.stash[_attempt] = _run.log.mark()
    if _verdict in item.stash:
        del item.stash[_verdict]
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)  # innermost: the verdict is there before rerunfailures asks
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _run.log is not None and _attempt in item.stash and _verdict not in item.stash:
        seen = _run.log.stalls_since(item.stash[_attempt], pid=os.getpid())
        safety = item.get_closest_marker("safety") is not None
        verdict = item.stash[_verdict] = judge(safety=safety, margin=margin_of(item), seen=seen)
        lines = [("runs again if it may: " if verdict.again else "does not run again: ") + verdict.reason]
        report.sections.append((SECTION, "\n".join([*lines, *map(str, seen)])))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the watcher saw during the run, which tests ran again, and the pause that let each."""
    seen = _run.log.stalls() if _run.watcher is not None and _run.log is not None else []
    counted = [stall for stall in seen if not stall.stopped]
    if counted:
        times = "once" if len(counted) == 1 else f"{len(counted)} times"
        terminalreporter.write_sep("=", f"the watcher saw a pause or a clock step {times} during the run")
        for stall in counted[:20]:
            terminalreporter.write_line(str(stall))
        if len(counted) > 20:
            terminalreporter.write_line(f"and {len(counted) - 20} more")
    if stopped := len(seen) - len(counted):
        terminalreporter.write_line(f"(and {stopped} pauses of processes stopped by a signal: the tests' own doing)")
    reruns = terminalreporter.stats.get("rerun", [])
    terminalreporter.write_sep("=", f"ran again: {len(reruns)} (timing tests that failed during a long enough pause)")
    for report in reruns:
        during = [text.split("\n")[0] for name, text in report.sections if name == SECTION]
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "").split("\n")[0][:100]
        terminalreporter.write_line(f"{report.nodeid} ({report.when} failed: {crash}): {'; '.join(during)}")
