"""Stalls of the machine that no test's timing can absorb, seen by a process that only watches the
clocks.

The suite's timing tests hold leases of a few seconds and check deadlines to a tenth of one. A
machine that stops running its processes for longer (a virtual machine paused while its memory is
copied, a host starving it) breaks what they assume, not what they test; so does a wall clock that
jumps against the monotonic one, since the server's leases run on the wall clock and the library's
deadlines on the monotonic one. The watcher, a process of its own (``python stalls.py LOG``), wakes
every ``PERIOD`` and appends to LOG what it saw:

- a **pause**: it woke more than ``PAUSE`` after it last ran. Beside twelve whole `make test` runs
  (8 workers on 2 cores) it was at most 0.18 s late in eleven of them and 0.24 s in one; the runs'
  own watchers saw pauses of 0.23 to 0.34 s in two of the last eight, in which nothing failed. It is
  a process of its own because a thread in each worker process, tried first, woke up to 1.0 s late
  (once 11 s) at moments when a watcher process saw nothing: something in the worker held it back,
  not the machine;
- a **clock step**: the wall clock moved more than ``STEP`` against the monotonic one.

``stall_reruns`` runs a test again when it failed and the watcher saw either during its attempt;
a failure with nothing seen fails the run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

PERIOD = 0.01
PAUSE = 0.2
STEP = 0.05
_CONSISTENT_READ = 0.001
"""Two wall-clock reads around a monotonic one further apart than this were interrupted: a
preemption between the reads would look like a clock step, so the sample is taken again."""


@dataclass(frozen=True)
class Mark:
    """A moment to look back to: the monotonic time (the same in every process of the machine),
    and the wall clock's offset from it then."""

    monotonic: float
    offset: float


@dataclass(frozen=True)
class Stall:
    monotonic: float
    """When the watcher saw it."""
    wall: float
    description: str

    def __str__(self) -> str:
        at = datetime.fromtimestamp(self.wall, UTC).strftime("%H:%M:%S.%f")[:-3]
        return f"{self.description} (seen at {at} UTC)"

    def line(self) -> str:
        return f"{self.monotonic:.6f}\t{self.wall:.6f}\t{self.description}\n"

    @classmethod
    def parse(cls, line: str) -> Stall:
        monotonic, wall, description = line.rstrip("\n").split("\t", 2)
        return cls(float(monotonic), float(wall), description)


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


class Watcher:
    """Compares each sample with the one before; what it finds, it hands to ``record``."""

    def __init__(self, record: Callable[[Stall], object], clocks: Clocks | None = None) -> None:
        self._record = record
        self._clocks = clocks or Clocks()
        self._last = self._clocks.mark()

    def sample(self) -> None:
        now = self._clocks.mark()
        late = now.monotonic - self._last.monotonic
        step = now.offset - self._last.offset
        wall = now.monotonic + now.offset
        if late > PAUSE:
            self._record(Stall(now.monotonic, wall, f"nothing ran for {late:.2f} s (the watcher sleeps {PERIOD:g} s)"))
        if abs(step) > STEP:
            self._record(Stall(now.monotonic, wall, f"the wall clock stepped {step:+.3f} s against the monotonic one"))
        self._last = now

    def run(self, until: Callable[[], bool]) -> None:
        while not until():
            self._clocks.sleep(PERIOD)
            self.sample()


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

    def stalls_since(self, mark: Mark) -> list[Stall]:
        """What the watcher saw since ``mark``, after giving it time to wake from a stall that has
        just ended; if it saw nothing, the wall clock's drift since ``mark`` when that is more than
        ``STEP`` (steps too small to record one by one)."""
        self._clocks.sleep(PAUSE)
        seen = [stall for stall in self.stalls() if stall.monotonic >= mark.monotonic]
        now = self._clocks.mark()
        drift = now.offset - mark.offset
        if abs(drift) > STEP and not seen:
            text = f"the wall clock drifted {drift:+.3f} s against the monotonic one"
            seen.append(Stall(now.monotonic, now.monotonic + now.offset, text))
        return seen

    def wait_for_calm(self, calm: float, longest: float) -> None:
        """Return once nothing was seen for ``calm`` seconds, or after ``longest`` seconds."""
        give_up_at = self._clocks.monotonic() + longest
        while (now := self._clocks.monotonic()) < give_up_at:
            latest = max((stall.monotonic for stall in self.stalls()), default=None)
            if latest is None or now - latest >= calm:
                return
            self._clocks.sleep(min(calm - (now - latest), give_up_at - now))


def main(path: str) -> None:
    """Watch until the process that started this one ends. The log exists once watching has begun."""
    parent = os.getppid()
    watcher = Watcher(lambda stall: log.write(stall.line()))  # its first sample, before the log exists
    with open(path, "a", buffering=1) as log:
        watcher.run(until=lambda: os.getppid() != parent)


if __name__ == "__main__":
    main(sys.argv[1])
