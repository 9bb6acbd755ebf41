"""``make stall-check``: the safety tests under random pauses, and against a planted defect.

    python -m tests.support.stall_check [--runs 1] [--defect-runs 5] [--workers 4] [--seed N]

1. ``--runs`` times, the tests marked ``safety`` run (``pytest -m safety``) while the pause injector
   (``tests/support/pause_injector.py``) stops random processes of the run (pytest's workers, their
   embedded servers, their tests' worker processes) for 0.2 to 1.5 s at random moments. Each run
   must pass: a safety test judges what the library promises, which no pause can break.
2. ``--defect-runs`` times, the same tests (no pauses) run in a temporary copy of this checkout with
   ``planted_defect.patch`` applied to its library: one acquisition of a lock in twenty ignores the
   current holder. Each run must fail: a detector that a rare defect escapes proves nothing. The
   patch touches only the copy. Such a run stops at its third failure.

Prints each run's outcome (its summary line, the failed tests, the pauses injected) and exits 1 if
any run came out otherwise than it must.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.run_settings import child_environment

ROOT = Path(__file__).resolve().parents[2]
PATCH = Path(__file__).with_name("planted_defect.patch")
SELECTION = os.environ.get("MONGOLOCK_STALL_CHECK_MARKERS", "safety")
"""The tests it runs: pytest's ``-m`` expression (``safety``; another only to try the check out)."""
_XDIST_WORKER = "exec(eval(sys.stdin.readline()))"
"""What an xdist worker's command line says (execnet's popen gateway)."""
_SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    status: int
    summary: str
    failed: list[str]
    seconds: float


def run_safety_tests(
    checkout: Path,
    workers: int,
    injector_log: Path | None,
    seed: int | None,
    keyword: str | None = None,
    *,
    until_failures: int | None = None,
) -> Outcome:
    """The safety tests of ``checkout`` (its library, on ``PYTHONPATH``), with pauses injected
    into the run's processes when ``injector_log`` is given."""
    command = [sys.executable, "-m", "pytest", "-m", SELECTION, "-n", str(workers), "--dist", "loadgroup"]
    command += ["-p", "no:cacheprovider", "-q", "-rf"]
    command += ["-k", keyword] if keyword else []
    # A run against the defect stops at its first failures: the defect can also make a test wait
    # out its timeout (300 s), which says nothing more.
    command += [f"--maxfail={until_failures}"] if until_failures else []
    started = time.monotonic()
    tests = subprocess.Popen(
        command,
        cwd=checkout,
        env=child_environment(PYTHONPATH=str(checkout), COLUMNS="400"),  # COLUMNS: -rf lines keep their message
        stdout=subprocess.PIPE,
        text=True,
    )
    injector = None
    if injector_log is not None:
        inject = [sys.executable, "-m", "tests.support.pause_injector", str(tests.pid), str(injector_log)]
        seeded = ["--seed", str(seed)] if seed is not None else []
        injector = subprocess.Popen([*inject, *seeded], cwd=ROOT, env=child_environment())
    try:
        output, _ = tests.communicate(timeout=1800)
    finally:
        if injector is not None:
            injector.terminate()
            injector.wait(timeout=30)
    summary = _SUMMARY.search(output)
    failed = [line[:400] for line in re.findall(r"^FAILED (.+)$", output, re.MULTILINE)]
    if summary is None:
        print(output[-4000:])
    return Outcome(tests.returncode, summary.group(1) if summary else "no summary", failed, time.monotonic() - started)


def copy_with_defect(destination: Path) -> Path:
    """A copy of this checkout's files (as git lists them) with the planted defect applied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, env=child_environment(), capture_output=True, check=True
    ).stdout
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    subprocess.run(["git", "apply", str(PATCH)], cwd=destination, env=child_environment(), check=True)
    where = subprocess.run(
        [sys.executable, "-c", "import mongolock_async.store.mutex as m; print(m.__file__)"],
        cwd=destination,
        env=child_environment(PYTHONPATH=str(destination)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(destination)) or "PLANTED DEFECT" not in Path(where).read_text():
        raise SystemExit(f"the copy's tests would not import the copy's library (they import {where})")
    return destination


def _pauses(log: Path) -> str:
    lines = log.read_text().splitlines() if log.exists() else []
    seconds = [float(line.split("\t")[1]) for line in lines]
    kinds: dict[str, int] = {}
    for line in lines:
        command = line.split("\t", 3)[3]
        kind = "server" if "secantus" in command else "pytest worker" if _XDIST_WORKER in command else "test's process"
        kinds[kind] = kinds.get(kind, 0) + 1
    spread = ", ".join(f"{count} of a {kind}" for kind, count in sorted(kinds.items()))
    if not seconds:
        return "no pauses injected"
    return f"{len(seconds)} pauses ({min(seconds):.2f} to {max(seconds):.2f} s, {sum(seconds):.0f} s in all: {spread})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--defect-runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("-k", dest="keyword", default=None, help="only the safety tests pytest's -k selects")
    arguments = parser.parse_args()
    wrong = 0
    with tempfile.TemporaryDirectory(prefix="mongolock-stall-check-") as scratch:
        for run in range(1, arguments.runs + 1):
            log = Path(scratch) / f"pauses-{run}.log"
            seed = None if arguments.seed is None else arguments.seed + run
            outcome = run_safety_tests(ROOT, arguments.workers, log, seed, arguments.keyword)
            ok = outcome.status == 0
            wrong += not ok
            verdict = "green" if ok else "RED"
            print(f"paused run {run}: {verdict}: {outcome.summary} in {outcome.seconds:.0f} s; {_pauses(log)}")
            for name in outcome.failed:
                print(f"  failed: {name}")
        if arguments.defect_runs:
            copy = copy_with_defect(Path(scratch) / "defect")
            for run in range(1, arguments.defect_runs + 1):
                outcome = run_safety_tests(copy, arguments.workers, None, None, arguments.keyword, until_failures=3)
                # pytest exits 1 with failures, 2 when --maxfail stopped it: failures either way.
                caught = outcome.status in (1, 2) and bool(outcome.failed)
                wrong += not caught
                verdict = "caught" if caught else "NOT CAUGHT"
                print(f"planted defect, run {run}: {verdict}: {outcome.summary} in {outcome.seconds:.0f} s")
                for name in outcome.failed:
                    print(f"  failed: {name}")
    print("stall check:", "as it must be" if not wrong else f"{wrong} runs came out wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    os.environ.pop("PYTEST_ADDOPTS", None)
    sys.exit(main())
