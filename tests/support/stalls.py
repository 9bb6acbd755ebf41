"""Pauses that no test's timing can absorb, seen where they happen by a process that only watches.

The suite's timing tests hold leases of a few seconds and check deadlines to a tenth of one. A
process of the test that cannot run for longer than the test allows (its worker, a child it started,
the embedded server it talks to) breaks what the test assumes, not what it tests; so does a wall
clock that jumps against the monotonic one, since the server's leases run on the wall clock and the
library's deadlines on the monotonic one. The watcher, a process of its own (``python stalls.py
LOG``, started by the process that starts the run), appends to LOG what it saw:

- **a process waiting for a CPU**: every ``PROCESS_PERIOD`` it reads, for the process that started
  it and each process descended from that one, the kernel's account of its main thread
  (``/proc/PID/schedstat``: the time it has waited, runnable, on a run queue; ``/proc/PID/stat``: its
  state). A wait of at least ``PROCESS_FLOOR`` is recorded with the process and its ancestors, so that
  a test's worker finds the pauses of its own children and servers. A process that waited often
  but briefly (a few milliseconds at each wake-up on a loaded machine) was slowed, not paused, and
  is not recorded. A process stopped by a signal is recorded too, marked as such: in this suite only
  tests stop processes (their own servers and holders, on purpose), and the pause injector;
- **the whole machine stopping**: the watcher itself woke more than ``PAUSE`` late (a virtual
  machine paused while its memory is copied, a host starving it). Beside twelve whole `make test`
  runs (8 workers on 2 cores) it was at most 0.18 s late in eleven of them and 0.24 s in one;
- **a clock step**: the wall clock moved more than ``STEP`` against the monotonic one.

``stall_reruns`` reads the log: a timing test that failed runs again only if a pause of one of its
own processes (or of the machine) during the attempt was at least the margin it declares.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

PERIOD = 0.01
PAUSE = 0.2
STEP = 0.05
PROCESS_PERIOD = 0.05
PROCESS_FLOOR = 0.1
TREE_PERIOD = 0.5
"""How often the watcher looks for new processes of the run; one that lives shorter may be missed."""
_CONSISTENT_READ = 0.001
"""Two wall-clock reads around a monotonic one further apart than this were interrupted: a
preemption between the reads would look like a clock step, so the sample is taken again."""
STOPPED = "stopped by a signal"
WAITING = "waiting for a CPU"


@dataclass(frozen=True)
class Mark:
    """A moment to look back to: the monotonic time (the same in every process of the machine),
    and the wall clock's offset from it then."""

    monotonic: float
    offset: float


@dataclass(frozen=True)
class Stall:
    monotonic: float
    """When it ended (when the watcher saw it)."""
    wall: float
    description: str
    duration: float = 0.0
    """How long the process (or the machine) did not run, or the size of a clock step."""
    processes: tuple[int, ...] = ()
    """The process that paused, then its ancestors; empty when the whole machine stalled."""
    stopped: bool = False
    """The process was stopped by a signal (a test's or the pause injector's doing)."""

    def __str__(self) -> str:
        at = datetime.fromtimestamp(self.wall, UTC).strftime("%H:%M:%S.%f")[:-3]
        return f"{self.description} (seen at {at} UTC)"

    def hits(self, pid: int) -> bool:
        """Whether it paused process ``pid``: the whole machine, the process, or a descendant."""
        return not self.processes or pid in self.processes

    def line(self) -> str:
        pids = ",".join(map(str, self.processes))
        fields = [f"{self.monotonic:.6f}", f"{self.wall:.6f}", f"{self.duration:.6f}", pids, str(int(self.stopped))]
        return "\t".join([*fields, self.description]) + "\n"

    @classmethod
    def parse(cls, line: str) -> Stall:
        monotonic, wall, duration, pids, stopped, description = line.rstrip("\n").split("\t", 5)
        processes = tuple(int(pid) for pid in pids.split(",") if pid)
        return cls(float(monotonic), float(wall), description, float(duration), processes, stopped == "1")


class Clocks:
    """The two clocks, read together; and sleep. Tests give fakes."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.monotonic, self.wall, self.sleep = monotonic, wall, sleep

    def mark(self) -> Mark:
        while True:
            before, monotonic, after = self.wall(), self.monotonic(), self.wall()
            if after - before <= _CONSISTENT_READ:
                return Mark(monotonic, (before + after) / 2 - monotonic)


@dataclass(frozen=True)
class ProcessSample:
    """What the kernel says of one process's main thread: the seconds it has waited to run, in all
    (``run_delay``: Documentation/scheduler/sched-stats.rst), and whether it is stopped."""

    waited: float
    stopped: bool


class Processes:
    """The processes of the run, as ``/proc`` shows them. Tests give fakes."""

    def parents(self) -> dict[int, int]:
        """Every process's parent."""
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _read(f"/proc/{entry}/stat")) is not None:
                parents[int(entry)] = int(_stat_fields(stat)[1])
        return parents

    def sample(self, pid: int) -> ProcessSample | None:
        """The process's account now, or None if it is gone."""
        stat, schedstat = _read(f"/proc/{pid}/stat"), _read(f"/proc/{pid}/schedstat")
        if stat is None or schedstat is None:
            return None
        return ProcessSample(int(schedstat.split()[1]) / 1e9, _stat_fields(stat)[0] in ("T", "t"))


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:  # the process ended
        return None


def _stat_fields(stat: str) -> list[str]:
    """``/proc/PID/stat``'s fields after the command's name (which may hold spaces and brackets)."""
    return stat[stat.rindex(")") + 2 :].split()


@dataclass
class _Tracked:
    ancestors: tuple[int, ...]
    last: ProcessSample
    at: float
    stopped_since: float | None = None


@dataclass
class _Tree:
    """The processes descended from ``root``, found again every ``TREE_PERIOD``."""

    root: int
    tracked: dict[int, _Tracked] = field(default_factory=dict)
    looked_at: float = float("-inf")


class Watcher:
    """Compares each sample with the one before; what it finds, it hands to ``record``."""

    def __init__(
        self,
        record: Callable[[Stall], object],
        clocks: Clocks | None = None,
        processes: Processes | None = None,
        root: int | None = None,
    ) -> None:
        self._record = record
        self._clocks = clocks or Clocks()
        self._processes = processes
        self._tree = _Tree(os.getppid() if root is None else root)
        self._last = self._clocks.mark()
        self._sampled_processes = self._last.monotonic

    def sample(self) -> None:
        now = self._clocks.mark()
        late = now.monotonic - self._last.monotonic
        step = now.offset - self._last.offset
        wall = now.monotonic + now.offset
        if late > PAUSE:
            text = f"nothing ran for {late:.2f} s (the watcher sleeps {PERIOD:g} s)"
            self._record(Stall(now.monotonic, wall, text, late))
        if abs(step) > STEP:
            text = f"the wall clock stepped {step:+.3f} s against the monotonic one"
            self._record(Stall(now.monotonic, wall, text, abs(step)))
        self._last = now
        if self._processes is not None and now.monotonic - self._sampled_processes >= PROCESS_PERIOD:
            self._sampled_processes = now.monotonic
            self._sample_processes(now)

    def _sample_processes(self, now: Mark) -> None:
        assert self._processes is not None
        tree = self._tree
        if now.monotonic - tree.looked_at >= TREE_PERIOD:
            tree.looked_at = now.monotonic
            self._find_new_processes(now.monotonic)
        for pid, tracked in list(tree.tracked.items()):
            sample = self._processes.sample(pid)
            if sample is None:
                self._end_stop(pid, tracked, now)
                del tree.tracked[pid]
                continue
            # The kernel adds a wait to the account when it ends. Of the waits that ended since the
            # last sample, all but the first lie wholly after it: so the first lasted at least this.
            longest_wait = (sample.waited - tracked.last.waited) - (now.monotonic - tracked.at)
            if longest_wait >= PROCESS_FLOOR:
                self._record_pause(pid, tracked, now, now.monotonic, longest_wait, stopped=False)
            if sample.stopped and tracked.stopped_since is None:
                tracked.stopped_since = tracked.at
            elif not sample.stopped:
                self._end_stop(pid, tracked, now)
            tracked.last, tracked.at = sample, now.monotonic

    def _find_new_processes(self, at: float) -> None:
        assert self._processes is not None
        tree, parents = self._tree, self._processes.parents()
        for pid in parents:
            if pid in tree.tracked or pid == os.getpid():
                continue
            ancestors = tuple(_ancestors(pid, parents))
            if (pid == tree.root or tree.root in ancestors) and (sample := self._processes.sample(pid)) is not None:
                tree.tracked[pid] = _Tracked(ancestors, sample, at)

    def _end_stop(self, pid: int, tracked: _Tracked, now: Mark) -> None:
        if tracked.stopped_since is not None and tracked.at - tracked.stopped_since >= PROCESS_FLOOR:
            self._record_pause(pid, tracked, now, tracked.at, tracked.at - tracked.stopped_since, stopped=True)
        tracked.stopped_since = None

    def _record_pause(
        self, pid: int, tracked: _Tracked, now: Mark, ended: float, duration: float, *, stopped: bool
    ) -> None:
        text = f"process {pid} did not run for {duration:.2f} s ({STOPPED if stopped else WAITING})"
        self._record(Stall(ended, ended + now.offset, text, duration, (pid, *tracked.ancestors), stopped))

    def run(self, until: Callable[[], bool]) -> None:
        while not until():
            self._clocks.sleep(PERIOD)
            self.sample()


def _ancestors(pid: int, parents: dict[int, int]) -> Iterable[int]:
    seen = {pid}
    while (pid := parents.get(pid, 0)) > 0 and pid not in seen:
        seen.add(pid)
        yield pid


class StallLog:
    """The watcher's log, as the test processes read it."""

    def __init__(self, path: Path, clocks: Clocks | None = None) -> None:
        self.path = path
        self._clocks = clocks or Clocks()

    def mark(self) -> Mark:
        return self._clocks.mark()

    def stalls(self) -> list[Stall]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [Stall.parse(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def stalls_since(self, mark: Mark, pid: int | None = None) -> list[Stall]:
        """What the watcher saw since ``mark`` (of process ``pid``, its descendants, or the whole
        machine, if ``pid`` is given), after giving it time to see a pause that has just ended; if
        it saw no clock step, the wall clock's drift since ``mark`` when that is more than ``STEP``
        (steps too small to record one by one)."""
        self._clocks.sleep(PAUSE)
        seen = [
            stall for stall in self.stalls() if stall.monotonic >= mark.monotonic and (pid is None or stall.hits(pid))
        ]
        now = self._clocks.mark()
        drift = now.offset - mark.offset
        if abs(drift) > STEP and not any("wall clock" in stall.description for stall in seen):
            text = f"the wall clock drifted {drift:+.3f} s against the monotonic one"
            seen.append(Stall(now.monotonic, now.monotonic + now.offset, text, abs(drift)))
        return seen

    def wait_for_calm(self, calm: float, longest: float, pid: int | None = None) -> None:
        """Return once nothing (of ``pid``, if given) was seen for ``calm`` seconds, or after
        ``longest`` seconds."""
        give_up_at = self._clocks.monotonic() + longest
        while (now := self._clocks.monotonic()) < give_up_at:
            stalls = [stall for stall in self.stalls() if pid is None or stall.hits(pid)]
            latest = max((stall.monotonic for stall in stalls if not stall.stopped), default=None)
            if latest is None or now - latest >= calm:
                return
            self._clocks.sleep(min(calm - (now - latest), give_up_at - now))


def main(path: str) -> None:
    """Watch until the process that started this one ends. The log exists once watching has begun."""
    parent = os.getppid()
    watcher = Watcher(lambda stall: log.write(stall.line()), processes=Processes())  # first sample before the log
    with open(path, "a", buffering=1) as log:
        watcher.run(until=lambda: os.getppid() != parent)


if __name__ == "__main__":
    main(sys.argv[1])
