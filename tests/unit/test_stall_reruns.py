"""The suite's own rule for reruns (tests/support/stalls.py, tests/support/stall_reruns.py): what the
watcher records, of the machine and of each process of the run, and that only a timing test that
failed during a pause at least as long as its margin, in its own processes, runs again."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import stalls
from tests.support.run_settings import child_environment
from tests.support.stall_reruns import judge
from tests.support.stalls import Clocks, Mark, Processes, ProcessSample, Stall, StallLog, Watcher

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
def test_a_pause_longer_than_the_threshold_is_recorded_with_its_length(tmp_path: Path, late: float, seen: bool) -> None:
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


def test_a_stall_is_read_back_as_written(tmp_path: Path) -> None:
    _, _, log = _watched(tmp_path)
    stall = Stall(5.0, 6.0, "process 12 did not run for 0.40 s (waiting for a CPU)", 0.4, (12, 7, 1), stopped=False)
    log.path.write_text(stall.line())
    assert log.stalls() == [stall]
    assert stall.hits(12) and stall.hits(7) and not stall.hits(8)
    assert Stall(5.0, 6.0, "nothing ran for 0.40 s", 0.4).hits(8), "the whole machine: every process"


# -- each process of the run, as the kernel accounts for it -----------------------------------------


class _Processes(Processes):
    """A process tree the test makes, whose processes the test runs, starves, stops and ends. As
    the kernel does, a wait is added to a process's account when it ends."""

    def __init__(self, clocks: _Clocks) -> None:
        self._clocks = clocks
        self.tree = {100: 1, 101: 100, 102: 101, 200: 1}  # 100 started the run (and the watcher); 200 is not of it
        self.waited = dict.fromkeys(self.tree, 0.0)
        self.waiting = dict.fromkeys(self.tree, 0.0)
        self.mode = dict.fromkeys(self.tree, "asleep")
        self._at = clocks.now

    def advance(self) -> None:
        elapsed, self._at = self._clocks.now - self._at, self._clocks.now
        for pid, mode in self.mode.items():
            if mode == "waiting":
                self.waiting[pid] += elapsed
                continue
            self.waited[pid] += self.waiting[pid]  # a wait that ended
            self.waiting[pid] = 0.0
            if mode == "slowed":  # many short waits, each ended: three quarters of the time
                self.waited[pid] += elapsed * 3 / 4

    def parents(self) -> dict[int, int]:
        return dict(self.tree)

    def sample(self, pid: int) -> ProcessSample | None:
        self.advance()
        if pid not in self.tree:
            return None
        return ProcessSample(self.waited[pid], self.mode[pid] == "stopped")


def _watch_processes(tmp_path: Path) -> tuple[_Clocks, _Processes, Watcher, StallLog]:
    clocks, _, log = _watched(tmp_path)
    processes = _Processes(clocks)

    def record(stall: Stall) -> None:
        with log.path.open("a") as file:
            file.write(stall.line())

    return clocks, processes, Watcher(record, clocks, processes, root=100), log


def _run_for(clocks: _Clocks, watcher: Watcher, seconds: float) -> None:
    end = clocks.now + seconds
    while clocks.now < end:
        clocks.sleep(stalls.PERIOD)
        watcher.sample()


@pytest.mark.parametrize(
    ("mode", "seconds", "expected"),
    [
        ("waiting", 0.5, "waiting for a CPU"),
        ("stopped", 0.5, "stopped by a signal"),
        ("waiting", stalls.PROCESS_FLOOR / 2, None),  # too short to record
        ("slowed", 2.0, None),  # it ran now and then: slowed, not paused
        ("asleep", 2.0, None),  # it chose not to run
        ("running", 2.0, None),
    ],
)
def test_a_process_of_the_run_that_could_not_run_is_recorded_with_its_ancestors(
    tmp_path: Path, mode: str, seconds: float, expected: str | None
) -> None:
    clocks, processes, watcher, log = _watch_processes(tmp_path)
    _run_for(clocks, watcher, 1.0)  # the tree found, each process sampled
    mark = log.mark()
    processes.mode[102] = mode
    _run_for(clocks, watcher, seconds)
    processes.mode[102] = "running"
    _run_for(clocks, watcher, 0.2)
    seen = log.stalls_since(mark)
    if expected is None:
        assert seen == []
        return
    [stall] = seen
    assert stall.processes == (102, 101, 100, 1) and stall.stopped == (mode == "stopped")
    assert expected in stall.description
    assert stall.duration == pytest.approx(seconds, abs=2 * stalls.PROCESS_PERIOD)
    assert [s.description for s in log.stalls_since(mark, pid=101)] == [stall.description], "its parent's own"
    assert log.stalls_since(mark, pid=200) == [], "not another process's"


def test_a_process_outside_the_run_and_one_that_ends_while_stopped(tmp_path: Path) -> None:
    clocks, processes, watcher, log = _watch_processes(tmp_path)
    _run_for(clocks, watcher, 1.0)
    mark = log.mark()
    processes.mode[200] = "waiting"
    processes.mode[101] = "stopped"
    _run_for(clocks, watcher, 0.5)
    processes.mode[200] = "running"
    del processes.tree[101]  # it ended, still stopped (killed)
    _run_for(clocks, watcher, 0.2)
    [stall] = log.stalls_since(mark)
    assert stall.processes == (101, 100, 1) and stall.stopped, "200 is not descended from the run's first process"


def test_a_process_started_during_the_run_is_watched(tmp_path: Path) -> None:
    clocks, processes, watcher, log = _watch_processes(tmp_path)
    _run_for(clocks, watcher, 1.0)
    processes.tree[103] = 102
    processes.waited[103] = processes.waiting[103] = 0.0
    processes.mode[103] = "asleep"
    _run_for(clocks, watcher, stalls.TREE_PERIOD + 0.1)
    mark = log.mark()
    processes.mode[103] = "waiting"
    _run_for(clocks, watcher, 0.5)
    processes.mode[103] = "running"
    _run_for(clocks, watcher, 0.2)
    assert [stall.processes for stall in log.stalls_since(mark)] == [(103, 102, 101, 100, 1)]


# -- the rule (tests/support/stall_reruns.py's judge) -----------------------------------------------

_MACHINE = Stall(1.0, 2.0, "nothing ran for 0.60 s", 0.6)
_OWN = Stall(1.0, 2.0, "process 9 did not run for 0.60 s (waiting for a CPU)", 0.6, (9, 1))
_STOPPED = Stall(1.0, 2.0, "process 9 did not run for 3.00 s (stopped by a signal)", 3.0, (9, 1), stopped=True)


@pytest.mark.parametrize(
    ("safety", "margin", "seen", "again"),
    [
        (True, None, [_MACHINE], False),  # a safety test: never
        (True, 0.5, [_MACHINE], False),  # a safety test that also declares a margin: never
        (False, None, [_MACHINE], False),  # neither: never
        (False, 0.5, [_MACHINE], True),  # the machine stalled longer than the margin
        (False, 0.5, [_OWN], True),  # one of its own processes did
        (False, 0.6, [_OWN], True),  # exactly the margin
        (False, 0.7, [_OWN, _MACHINE], False),  # shorter than the margin
        (False, 0.5, [_STOPPED], False),  # a process stopped on purpose explains nothing
        (False, 0.5, [], False),  # nothing seen
    ],
)
def test_the_rule_for_running_again(safety: bool, margin: float | None, seen: list[Stall], again: bool) -> None:
    verdict = judge(safety=safety, margin=margin, seen=seen)
    assert verdict.again is again, verdict.reason


# -- whole runs of pytest, one process and xdist workers --------------------------------------------

_TESTS = """
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

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


def starve_this_process(seconds=0.8):
    # This process alone barely runs: it spins on one CPU beside two busy processes of a far higher
    # priority (it is made nice 19, which it cannot undo: the run is a throwaway), while the watcher
    # and the rest of the machine run on. (Sleeping instead of spinning, it would be woken and run
    # every few milliseconds: slowed, not paused.)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    spin = f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); end = time.monotonic() + {seconds}\\n"
    spin += "while time.monotonic() < end: pass"
    hogs = [subprocess.Popen(["python3", "-c", spin]) for _ in range(2)]
    time.sleep(0.1)
    os.nice(19)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    for hog in hogs:
        hog.wait()


@pytest.mark.timing(margin=0.3)
def test_timing_fails_once_after_a_stall():
    if attempt("once") == 1:
        stop_the_machine()
        assert False, "the first attempt fails after the stall"


@pytest.mark.timing(margin=0.3)
def test_timing_fails_once_after_its_process_starved():
    if attempt("starved") == 1:
        starve_this_process()
        assert False, "the first attempt fails after this process could not run"


@pytest.mark.timing(margin=5)
def test_timing_with_a_longer_margin_than_the_stall():
    attempt("longer")
    stop_the_machine()
    assert False, "fails every time, after a stall shorter than its margin"


@pytest.mark.safety
def test_safety_fails_after_a_stall():
    attempt("safety")
    stop_the_machine()
    assert False, "fails every time, after a stall"


def test_unmarked_fails_after_a_stall():
    attempt("unmarked")
    stop_the_machine()
    assert False, "fails every time, after a stall"


@pytest.mark.timing(margin=0.3)
def test_timing_fails_after_stopping_alone():
    # This process alone is stopped by a signal, as a test stops its own server: explains nothing.
    attempt("alone")
    subprocess.Popen(["sh", "-c", f"sleep 0.6; kill -CONT {os.getpid()}; sleep 2; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    assert False, "fails every time, after stopping alone"


@pytest.mark.timing(margin=0.3)
def test_timing_fails_without_a_stall():
    attempt("plain")
    assert False, "fails every time, no stall"


@pytest.mark.timing(margin=0.3)
def test_timing_fails_after_a_stall_every_time():
    attempt("always")
    stop_the_machine()
    assert False, "fails every time, after a stall"


@pytest.mark.timing(margin=0.3)
def test_timing_stalls_and_passes():
    attempt("passes")
    stop_the_machine()
"""

CALM = 1.0
_HEADING = "ran again: "


def _run_pytest(tmp_path: Path, *options: str) -> tuple[str, dict[str, int], list[tuple[str, float]]]:
    """A pytest run of ``_TESTS`` in a session of its own: its output, each test's attempts, and
    every attempt's name and start."""
    (tmp_path / "test_stalling.py").write_text(textwrap.dedent(_TESTS))
    ini = "[pytest]\naddopts = -p no:cacheprovider\nasyncio_default_fixture_loop_scope = function\n"
    ini += "markers =\n    safety: x\n    timing: x\n"
    (tmp_path / "pytest.ini").write_text(ini)
    plugin = ["-p", "tests.support.stall_reruns", "-o", f"stall_calm={CALM}"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-q", *options],
        cwd=tmp_path,
        env=child_environment(PYTHONPATH=str(ROOT)),
        start_new_session=True,  # its process group is the machine its tests stop
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = run.stdout + run.stderr
    attempts = [(line.split()[0], float(line.split()[1])) for line in (tmp_path / "attempts").read_text().splitlines()]
    names = [name for name, _ in attempts]
    return output, {name: names.count(name) for name in dict.fromkeys(names)}, attempts


def _summary(output: str) -> str:
    assert _HEADING in output, output
    after_heading = output.split(_HEADING, 1)[1].splitlines()[1:]
    return "\n".join(itertools.takewhile(lambda line: not line.startswith("="), after_heading))


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "1"]], ids=["one process", "an xdist worker"])
def test_only_a_timing_failure_during_a_long_enough_pause_of_its_own_runs_again(
    tmp_path: Path, workers: list[str]
) -> None:
    output, counts, attempts = _run_pytest(tmp_path, *workers)
    assert counts == {
        "once": 2,
        "starved": 2,
        "longer": 1,
        "safety": 1,
        "unmarked": 1,
        "alone": 1,
        "plain": 1,
        "always": 3,
        "passes": 1,
    }, output
    # The next attempt waited for CALM seconds without a pause, after the 0.6 s stop ended.
    first, second = [at for name, at in attempts if name == "once"]
    assert second - first >= 0.6 + CALM, (second - first, output)
    assert "6 failed, 3 passed, 4 rerun" in output, output
    summary = _summary(output)
    once = "test_stalling.py::test_timing_fails_once_after_a_stall (call failed: AssertionError: the first attempt"
    assert summary.count(once) == 1 and "nothing ran for 0." in summary, summary
    assert "(waiting for a CPU)" in summary, summary
    assert summary.count("test_stalling.py::test_timing_fails_after_a_stall_every_time (call failed: ") == 2
    for never in ("longer_margin", "safety_fails", "unmarked_fails", "stopping_alone", "without_a_stall"):
        assert never not in summary, summary
    assert "a safety test never runs again" in output and "not a timing test: it never runs again" in output


def test_the_run_runs_at_most_its_cap_again(tmp_path: Path) -> None:
    """``--max-suite-reruns`` (pyproject.toml's addopts: 3) bounds the reruns of a whole run."""
    output, counts, _ = _run_pytest(
        tmp_path, "-p", "no:xdist", "--max-suite-reruns=1", "-k", "timing_fails_once_after_a_stall or every_time"
    )
    assert counts == {"once": 2, "always": 1}, output
    assert "1 failed, 1 passed, 7 deselected, 1 rerun" in output, output
