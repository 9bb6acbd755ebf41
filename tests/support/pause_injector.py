"""The pause injector of ``make stall-check``: stops random processes of a test run for a moment.

    python -m tests.support.pause_injector ROOT_PID LOG [--seed N]

Until process ROOT_PID ends, at random moments (every ``GAP`` seconds on average) it picks one of
the processes descended from ROOT_PID (pytest's workers, the embedded servers they started, the
worker processes of their tests; never ROOT_PID itself, which only gathers reports, nor the stall
watcher) and stops it with ``SIGSTOP`` for a random 0.2 to 1.5 s, then ``SIGCONT``; pauses may
overlap. Every pause is appended to LOG as ``start<TAB>seconds<TAB>pid<TAB>command``. On
``SIGTERM`` (or when ROOT_PID ends) every process still stopped is continued first.

A safety test (``@pytest.mark.safety``) judges what the library promises whatever any process's
timing, so the run must stay green while this runs beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import threading
import time
from pathlib import Path

SHORTEST, LONGEST = 0.2, 1.5
GAP = 1.0
"""Mean seconds between the starts of two pauses."""
_SPARED = ("stalls.py", "pause_injector")


def descendants(root: int) -> dict[int, str]:
    """The processes descended from ``root`` (not ``root``), with their command lines."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        commands[int(entry)] = " ".join(command.replace("\0", " ").split())  # one line: no tabs or newlines
    found = {}
    for pid in parents:
        ancestor = parents[pid]
        while ancestor > 1 and ancestor != root:
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            found[pid] = commands[pid]
    return found


class Injector:
    def __init__(self, root: int, log: Path, rng: random.Random) -> None:
        self.root, self.log, self.rng = root, log, rng
        self._stopped: set[int] = set()
        self._lock = threading.RLock()  # SIGTERM's handler may run while the main thread holds it

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._finish())
        try:
            while _alive(self.root):
                time.sleep(self.rng.expovariate(1 / GAP))
                targets = {pid: command for pid, command in descendants(self.root).items() if not _spared(command)}
                if targets:
                    pid = self.rng.choice(sorted(targets))
                    self._pause(pid, targets[pid], self.rng.uniform(SHORTEST, LONGEST))
        finally:
            self._finish()

    def _pause(self, pid: int, command: str, seconds: float) -> None:
        with self._lock:
            if pid in self._stopped:
                return
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                return
            self._stopped.add(pid)
        with self.log.open("a") as file:
            file.write(f"{time.monotonic():.3f}\t{seconds:.3f}\t{pid}\t{command[:200]}\n")
        timer = threading.Timer(seconds, self._continue, args=(pid,))
        timer.daemon = True
        timer.start()

    def _continue(self, pid: int) -> None:
        with self._lock:
            if pid in self._stopped:
                self._stopped.discard(pid)
                _cont(pid)

    def _finish(self) -> None:
        with self._lock:
            for pid in self._stopped:
                _cont(pid)
            self._stopped.clear()
        raise SystemExit(0)


def _spared(command: str) -> bool:
    return any(name in command for name in _SPARED)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=int)
    parser.add_argument("log", type=Path)
    parser.add_argument("--seed", type=int, default=None)
    arguments = parser.parse_args()
    Injector(arguments.root, arguments.log, random.Random(arguments.seed)).run()


if __name__ == "__main__":
    main()
