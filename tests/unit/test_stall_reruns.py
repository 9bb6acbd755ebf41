"""The suite's own rule for stalls (tests/support/stalls.py, tests/support/stall_reruns.py): what the
watcher records, and that only a failure with a stall seen during it runs again."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import stalls
from tests.support.run_settings import child_environment
from tests.support.stalls import Clocks, Mark, Stall, StallLog, Watcher

ROOT = Path(__file__).resolve().parents[2]


class _Clocks(Clocks):
    """A monotonic and a wall clock the test moves; ``sleep`` moves both."""

    def __init__(self) -> None:
        super().__init__(monotonic=lambda: self.now, wall=self._read_wall, sleep=self._sleep)
        self.now = 1000.0
        self.offset = 1_800_000_000.0
        self.interrupted_reads = 0
        """How many of the next wall-clock reads come back early, as if preempted before the next read."""

    def _read_wall(self) -> float:
        wall = self.now + self.offset
        if self.interrupted_reads:
            self.interrupted_reads -= 1
            self.now += 0.3
        return wall

    def _sleep(self, seconds: float) -> None:
        self.now += seconds


def _watched(tmp_path: Path) -> tuple[_Clocks, Watcher, StallLog]:
    """A watcher writing a log, and the log as a test process reads it, on the same fake clocks."""
    clocks = _Clocks()
    path = tmp_path / "stalls.log"
    path.touch()

    def record(stall: Stall) -> None:
        with path.open("a") as log:
            log.write(stall.line())

    return clocks, Watcher(record, clocks), StallLog(path, clocks)


def _seen(log: StallLog, mark: Mark) -> list[str]:
    return [stall.description for stall in log.stalls_since(mark)]


def test_samples_on_time_record_nothing(tmp_path: Path) -> None:
    clocks, watcher, log = _watched(tmp_path)
    mark = log.mark()
    for _ in range(100):
        clocks.sleep(stalls.PERIOD * 1.5)
        watcher.sample()
    assert _seen(log, mark) == []


@pytest.mark.parametrize(("late", "seen"), [(stalls.PAUSE + 0.05, True), (stalls.PAUSE - 0.01, False)])
def test_a_pause_longer_than_the_threshold_is_recorded_with_its_length(
    tmp_path: Path, late: float, seen: bool
) -> None:
    clocks, watcher, log = _watched(tmp_path)
    mark = log.mark()
    clocks.sleep(late)
    watcher.sample()
    expected = [f"nothing ran for {late:.2f} s (the watcher sleeps {stalls.PERIOD:g} s)"]
    assert _seen(log, mark) == (expected if seen else [])


@pytest.mark.parametrize("step", [0.2, -0.2])
def test_a_wall_clock_step_is_recorded(tmp_path: Path, step: float) -> None:
    clocks, watcher, log = _watched(tmp_path)
    mark = log.mark()
    clocks.sleep(stalls.PERIOD)
    clocks.offset += step
    watcher.sample()
    assert _seen(log, mark) == [f"the wall clock stepped {step:+.3f} s against the monotonic one"]


def test_small_steps_add_up_to_a_drift(tmp_path: Path) -> None:
    clocks, watcher, log = _watched(tmp_path)
    mark = log.mark()
    for _ in range(6):
        clocks.sleep(stalls.PERIOD)
        clocks.offset += stalls.STEP / 2
        watcher.sample()
    assert _seen(log, mark) == [f"the wall clock drifted {3 * stalls.STEP:+.3f} s against the monotonic one"]


def test_a_read_interrupted_between_the_clocks_is_taken_again(tmp_path: Path) -> None:
    clocks, watcher, log = _watched(tmp_path)
    mark = log.mark()
    clocks.sleep(stalls.PERIOD)
    clocks.interrupted_reads = 1  # the sample's first wall-clock read is 0.3 s older than its monotonic one
    watcher.sample()
    assert clocks.interrupted_reads == 0
    # The 0.3 s did pass (a pause, as the watcher saw it), but the clocks did not step.
    assert [text.split(" ")[:2] for text in _seen(log, mark)] == [["nothing", "ran"]]


def test_what_came_before_the_mark_is_not_counted(tmp_path: Path) -> None:
    clocks, watcher, log = _watched(tmp_path)
    clocks.sleep(1.0)
    watcher.sample()
    clocks.sleep(stalls.PERIOD)
    assert _seen(log, log.mark()) == []


def test_waiting_for_calm(tmp_path: Path) -> None:
    clocks, watcher, log = _watched(tmp_path)
    started = clocks.now
    log.wait_for_calm(10.0, longest=60.0)
    assert clocks.now == started, "nothing was seen: no wait"
    clocks.sleep(1.0)
    watcher.sample()  # a pause, seen now
    seen_at = clocks.now
    log.wait_for_calm(10.0, longest=60.0)
    assert clocks.now == pytest.approx(seen_at + 10.0)
    clocks.sleep(1.0)
    watcher.sample()
    seen_at = clocks.now
    log.wait_for_calm(10.0, longest=4.0)
    assert clocks.now == pytest.approx(seen_at + 4.0), "waits no longer than asked"


def test_a_line_cut_short_is_not_read(tmp_path: Path) -> None:
    """The watcher may be writing a line while a test process reads the log."""
    _, _, log = _watched(tmp_path)
    whole = Stall(1.0, 2.0, "nothing ran for 0.50 s").line()
    log.path.write_text(whole + whole[:7])
    assert log.stalls() == [Stall(1.0, 2.0, "nothing ran for 0.50 s")]


_TESTS = """
import os
import signal
import subprocess
import time
from pathlib import Path

ATTEMPTS = Path(__file__).with_name("attempts")


def attempt(name):
    with ATTEMPTS.open("a") as file:
        file.write(f"{name} {time.monotonic()}\\n")
    return [line.split()[0] for line in ATTEMPTS.read_text().splitlines()].count(name)


def stop_the_machine():
    # Every process of the run (this one and the watcher: a process group of its own) stops for
    # 0.6 s. SIGCONT more than once: one sent before the SIGSTOP lands would leave them stopped.
    group = os.getpgid(0)
    wake = f"sleep 0.6; kill -CONT -{group}; sleep 2; kill -CONT -{group}"
    subprocess.Popen(["sh", "-c", wake], start_new_session=True)
    os.killpg(group, signal.SIGSTOP)


def test_fails_once_after_a_stall():
    if attempt("once") == 1:
        stop_the_machine()
        assert False, "the first attempt fails after the stall"


def test_fails_after_stopping_alone():
    # This process alone stops (as when its own code holds the GIL): the machine did not stall.
    if attempt("alone") == 1:
        subprocess.Popen(["sh", "-c", f"sleep 0.6; kill -CONT {os.getpid()}; sleep 2; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
    assert False, "fails every time, after stopping alone the first time"


def test_fails_without_a_stall():
    attempt("plain")
    assert False, "fails every time, no stall"


def test_fails_after_a_stall_every_time():
    attempt("always")
    stop_the_machine()
    assert False, "fails every time, after a stall"


def test_stalls_and_passes():
    attempt("passes")
    stop_the_machine()
"""


CALM = 1.0


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "1"]], ids=["one process", "an xdist worker"])
def test_only_a_failure_with_a_stall_runs_again(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_stalling.py").write_text(textwrap.dedent(_TESTS))
    ini = "[pytest]\naddopts = -p no:cacheprovider\nasyncio_default_fixture_loop_scope = function\n"
    (tmp_path / "pytest.ini").write_text(ini)
    plugin = ["-p", "tests.support.stall_reruns", "-o", f"stall_calm={CALM}"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-q", *workers],
        cwd=tmp_path,
        env=child_environment(PYTHONPATH=str(ROOT)),
        start_new_session=True,  # its process group is the machine its tests stop
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    attempts = [(line.split()[0], float(line.split()[1])) for line in (tmp_path / "attempts").read_text().splitlines()]
    names = [name for name, _ in attempts]
    counts = {name: names.count(name) for name in ("once", "alone", "plain", "always", "passes")}
    assert counts == {"once": 2, "alone": 1, "plain": 1, "always": 3, "passes": 1}, output
    # The next attempt waited for CALM seconds without a stall, after the 0.6 s stop ended.
    first, second = [at for name, at in attempts if name == "once"]
    assert second - first >= 0.6 + CALM, (second - first, output)
    assert "3 failed, 2 passed, 3 rerun" in output, output
    assert "ran again: they failed while this machine stalled" in output, output
    after_heading = output.split("ran again: they failed while this machine stalled")[1].splitlines()[1:]
    summary = "\n".join(itertools.takewhile(lambda line: not line.startswith("="), after_heading))
    once = "test_stalling.py::test_fails_once_after_a_stall (call failed: AssertionError: the first attempt fails"
    assert summary.count(once) == 1 and "after the stall): nothing ran for 0." in summary
    assert summary.count("test_stalling.py::test_fails_after_a_stall_every_time (call failed: ") == 2
    assert "test_fails_without_a_stall" not in summary and "test_fails_after_stopping_alone" not in summary
