"""Check the lease protocol's model (model/lease.pml: a lock's document, a semaphore's and an election's)
and the jobs' periods' (model/jobs.pml) with SPIN: every configuration exhaustively, then every
control, which must be refuted, and every finding (a counterexample the model found in the code's
rules, still there).

    python3 model/check.py            # the bounded check of `make model`
    python3 model/check.py --deep     # the deeper bounds of `make soak`
    python3 model/check.py --only p3x1-lost --trail   # one run, its counterexample's steps printed

Each model's verifier is compiled once (model/build/<model>/, again only when it changes; lease.pml
also as model/build/lease-2x3/, for 2 processes of 3 tasks) and each run picks its bounds, faults,
document and control from MODEL_* environment variables (see lease.pml's init).
Exit status 1 if the real model has a counterexample, a control has none, or a search did not
complete (a bound that did not fit in memory or time is a failure, never a pass); a finding that is no
longer found fails too (the rule it shows was fixed: move the run to the configurations).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
# Exact (lossless) state compression; safety properties only (they are all assertions here).
CFLAGS = ["-O1", "-DSAFETY", "-DNOREDUCE", "-DCOLLAPSE", "-DMEMLIM=6000", "-w"]


@dataclass(frozen=True)
class Run:
    """One exhaustive search: its bounds and faults (MODEL_* settings), and for a control, the
    mutation in force and the property whose counterexample it must produce."""

    name: str
    settings: dict[str, str]
    what: str
    refutes: str | None = None  # a control: the property (its uerror prefix, e.g. "P3") it must violate
    deep: bool = False
    model: str = "lease"  # model/<model>.pml
    finding: bool = False  # a counterexample in the code's own rules, not a mutation's
    variant: str = ""  # a build of the model with other compile-time bounds (VARIANTS)


# lease.pml's processes and tasks per process are compile-time bounds (3 x 2 unless told): a line
# of 3 waiters in one process (what `look-per-head` needs to do harm) takes a build of its own.
VARIANTS: dict[str, list[str]] = {"": [], "2x3": ["-DNP=2", "-DNT=3"]}


# The mutations (lease.pml's MUT_*), as the switches' numbers.
MUT = {
    "no-withdrawal": "1",
    "no-withdrawn": "2",
    "claim-withdrawn": "3",
    "hand-to-any-place": "4",
    "fence-clock-only": "5",
    "no-fence-check": "6",
    "forget-releases": "7",
    "renew-expired": "8",
    "look-per-head": "9",
    "released-not-done": "10",
    "leave-no-upsert": "11",
    "deadline-from-reply": "12",
    "take-live": "13",
    "follower-forgotten": "14",
    "oversleep": "15",
    "refresh-failed-gone": "16",
    "attempt-per-waiter": "17",
    "follower-requeued": "18",
    "permit-no-room": "19",
    "permit-doc-fence": "20",
    "leader-until-told": "21",
}
# jobs.pml's mutations (MUT_*).
JOBS_MUT = {
    "slot-number": "1",
    "finish-unowned": "2",
    "tries-by-request": "3",
}


def _s(**settings: object) -> dict[str, str]:
    return {key.upper(): str(value) for key, value in settings.items()}


# The documents of permits: a semaphore of 2 permits (3 processes can ask for more), an election
# (lease.pml's init makes it fair, renewed, of 1 permit).
SEM = {"kind": 1, "limit": 2}
ELECTION = {"kind": 2}


# The real model: each run is exhaustive within its bounds (docs/model.md says why these). TASKS
# lists each process's acquiring tasks (0: the process only exists), TIMEOUTS each task's acquire
# timeout in ticks (255: none, 0: blocking=False), H the ticks of time explored. KIND picks the
# document: a lock's (0, unless told), a semaphore's (1, of LIMIT permits) or an election's (2).
CONFIGS: list[Run] = [  # the longest first: the others run beside it
    Run("p3x2", _s(tasks="2,2,2", timeouts="255,1,0,2,1,255", h=3, start_by=1), "3 processes, 2 tasks each (a TTL)"),
    Run("p3x1", _s(tasks="1,1,1", timeouts="255,2,0", h=7), "3 processes, a task each (no timeout, 2 ticks, a try)"),
    Run("p2x2", _s(tasks="2,2,0", timeouts="255,1,2,255", h=6, start_by=2), "2 processes, 2 tasks each"),
    Run("fair", _s(tasks="1,1,1", timeouts="255,2,255", h=7, fair=1), "fair=True"),
    Run("heartbeat", _s(tasks="1,1,0", timeouts="255,255", h=8, hb=1), "the heartbeat renews"),
    Run("lost", _s(tasks="1,1,0", timeouts="255,2", h=7, f_lost=1), "a reply lost (resent), or a request unapplied"),
    Run("cancel", _s(tasks="1,2,0", timeouts="255,1,1", h=7, f_cancel=1), "a caller cancelled at any await"),
    Run("held", _s(tasks="1,2,0", timeouts="255,1,1", h=7, f_hold=1), "a request held at the server past its bound"),
    Run("held-later", _s(tasks="1,2,0", timeouts="255,2,3", h=7, f_hold=1), "a request held, waiters giving up later"),
    Run("pause", _s(tasks="1,1,0", timeouts="255,255", h=8, f_pause=1), "a process paused past its TTL"),
    Run("kill", _s(tasks="1,1,1", timeouts="255,255,255", h=7, f_kill=1, start_by=2), "a process killed"),
    Run("step", _s(tasks="1,1,0", timeouts="255,255", h=7, f_step=1), "the server's clock steps back or on"),
    Run("stream", _s(tasks="2,1,0", timeouts="255,255,2", h=6, f_event=1, f_stream=1), "events lost or late, a reopen"),
    Run("force-purge", _s(tasks="1,1,0", timeouts="255,255", h=8, acqs=2, f_force=1, f_purge=1), "force, idle cleanup"),
    Run("slow", _s(tasks="1,2,0", timeouts="255,1,1", h=7, f_slow=1), "a reply delayed on its way back"),
    Run("line", _s(tasks="1,3", timeouts="255,255,255,2,4,255", h=8, start_by=1),
        "a line of 3 waiters giving up in turn", variant="2x3"),
    # A semaphore of 2 permits (store/permits.py, permit_release.py): P6 at most 2 holders.
    Run("sem", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=7), "a semaphore: 3 processes, 2 permits"),
    Run("sem-successor", _s(**SEM, tasks="2,1,1", timeouts="255,255,255,255", h=5, start_by=2),
        "a semaphore, a release naming its process's next waiter"),
    Run("sem-held", _s(**SEM, tasks="1,1,1", timeouts="255,1,255", h=7, f_hold=1), "a semaphore, a request held"),
    Run("sem-lost", _s(**SEM, tasks="1,1,1", timeouts="255,255,2", h=7, f_lost=1), "a semaphore, a reply lost"),
    Run("sem-cancel", _s(**SEM, tasks="1,1,1", timeouts="255,1,255", h=7, f_cancel=1), "a semaphore, a cancellation"),
    Run("sem-pause", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=7, f_pause=1), "a semaphore, a process paused"),
    Run("sem-kill", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=7, f_kill=1), "a semaphore, a process killed"),
    Run("sem-step", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=7, f_step=1), "a semaphore, the clock steps"),
    Run("sem-stream", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=6, f_event=1, f_stream=1),
        "a semaphore, events lost or late, a reopen"),
    Run("sem-force-purge", _s(**SEM, tasks="1,1,1", timeouts="255,255,255", h=8, f_force=1, f_purge=1),
        "a semaphore, force, idle cleanup"),
    Run("sem-slow", _s(**SEM, tasks="1,1,1", timeouts="255,255,2", h=7, f_slow=1), "a semaphore, a reply delayed"),
    # An election (_core/election.py: a permit of 1, served in turn, always renewed): P7 one leader.
    Run("election", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, acqs=2), "2 candidates campaigning twice"),
    Run("election-resign", _s(**ELECTION, tasks="1,1,1", timeouts="255,255,255", h=6, resign_to=1),
        "3 candidates, resign(to=...)"),
    Run("election-pause", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_pause=1), "a leader paused"),
    Run("election-held", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_hold=1), "a request held"),
    Run("election-lost", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_lost=1), "a reply lost"),
    Run("election-kill", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_kill=1), "a leader's process killed"),
    Run("election-step", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_step=1), "the clock steps"),
    Run("election-slow", _s(**ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_slow=1), "a reply delayed"),
]  # fmt: skip

DEEP: list[Run] = [
    Run("deep-p3x2-h4", _s(tasks="2,2,2", timeouts="255,1,2,0,1,255", h=4, start_by=1), "3x2, 4 ticks", deep=True),
    Run("deep-sem-step", _s(**SEM, tasks="2,1,1", timeouts="255,255,255,255", h=5, start_by=2, streak=0, f_step=1),
        "a semaphore, 4 tasks, the clock steps", deep=True),
    Run("deep-election-resign", _s(**ELECTION, tasks="1,1,1", timeouts="255,255,255", h=8, resign_to=1),
        "3 candidates, resign(to=...), 8 ticks", deep=True),
]  # fmt: skip


# Issue 36's findings' bounds (docs/model.md): a clock step back, and two max_attempts (3 and 1).
STEPPED_TRIES = _s(every="3,3", calls="3,3", h=7, f_step=1, db=2)
MIXED_TRIES = _s(every="4,2", maxa="3,1", calls="3,2", h=5)

# The jobs' periods (P5, model/jobs.pml): replicas with their own schedules (EVERY, OFFSET, MAXA:
# max_attempts, CALLS: calls of the job each makes), a TTL of 2 ticks, H ticks. Each judges the
# successes and the attempts (P5); the last two were issue 36's findings (docs/model.md).
JOBS: list[Run] = [
    Run("jobs-versions", _s(every="3,4", offset="0,1", maxa="2,2", calls="3,3", h=7, f_kill=1, f_lost=1),
        "two schedules at once, a kill, a finish resent", model="jobs"),
    Run("jobs-step", _s(every="3,3", offset="1,1", maxa="2,2", calls="3,3", h=7, f_kill=1, f_step=1, db=2),
        "the server's clock steps back 2 ticks, a kill", model="jobs"),
    Run("jobs-versions-step", _s(every="3,4", offset="0,1", maxa="2,2", calls="2,3", h=7, f_step=1, db=2),
        "two schedules, the clock steps back", model="jobs"),
    Run("jobs-3", _s(npr=3, every="3,4,5", offset="0,1,0", maxa="2,2,2", calls="2,2,2", h=6, f_kill=1),
        "three replicas, three schedules, a kill", model="jobs"),
    Run("jobs-attempts-step", STEPPED_TRIES, "tries after a step back", model="jobs"),
    Run("jobs-attempts-mixed", MIXED_TRIES, "two max_attempts at once", model="jobs"),
]  # fmt: skip


def _control(mutation: str, refutes: str, what: str, variant: str = "", /, **settings: object) -> Run:
    """The control of ``mutation``: a counterexample to ``refutes`` (a property, e.g. "P3") wanted."""
    return Run(f"ctl-{mutation}", _s(mut=MUT[mutation], **settings), what, refutes, variant=variant)


def _jobs_control(name: str, mutation: str, what: str, refutes: str = "P5 once", **settings: object) -> Run:
    """A control of jobs.pml's ``mutation``: a counterexample to ``refutes`` (by default a second
    success in one period) wanted."""
    return Run(f"ctl-{name}", _s(mut=JOBS_MUT[mutation], **settings), what, refutes, model="jobs")


# The controls: each mutation must be refuted by a counterexample to the property it names. Each
# runs where its trace is short: 2 processes, one with 2 waiters that give up after a tick, a
# request held at the server (HELD), a process killed (KILLED), the server's clock stepped (STEPPED).
HELD = {"tasks": "1,2,0", "timeouts": "255,1,1", "h": 7, "f_hold": 1}
CANCELLED = {"tasks": "2,2,0", "timeouts": "255,2,1,255", "h": 7, "f_cancel": 2}
GAVE_UP = {"tasks": "2,1,1", "timeouts": "255,1,255", "h": 8}
HELD_LATER = {"tasks": "1,2,0", "timeouts": "255,2,3", "h": 7, "f_hold": 1}
STEPPED = {"tasks": "1,1,0", "timeouts": "255,255", "h": 6, "f_step": 1}
KILLED = {"tasks": "1,1,1", "timeouts": "255,255,255", "h": 7, "f_kill": 1, "start_by": 2}
CONTROLS: list[Run] = [
    _control("no-withdrawal", "P3", "a waiter that gives up withdraws nothing", **GAVE_UP),
    _control("no-withdrawn", "P3", "a withdrawal forgets its tokens", **HELD),
    _control("released-not-done", "P3", "a released token's late acquire queues", **HELD),
    _control("leave-no-upsert", "P3", "a withdrawal before the document exists writes nothing", **HELD),
    _control("hand-to-any-place", "P3", "a release hands off to an expired place", **KILLED),
    _control("follower-forgotten", "P3", "a lone waiter names no follower its place records", **CANCELLED),
    _control("take-live", "P1", "an acquire takes a live lease", tasks="1,1,0", timeouts="255,255", h=5),
    _control("fence-clock-only", "P2", "a fencing token is the server's clock alone", **STEPPED),
    _control("refresh-failed-gone", "P3", "a place refresh that failed in transit is taken as gone", **HELD_LATER),
    # Its trace also needs the store's old rule (a late claim queues a withdrawn follower): either
    # fix alone closes it in these bounds (docs/model.md, 5).
    _control("attempt-per-waiter", "P3", "a first waiter's attempt is its own, and a withdrawn follower joins",
             mut2=MUT["follower-requeued"], **HELD_LATER),
    _control("oversleep", "P4", "a placed waiter sleeps until news, not the lease's expiry",
             tasks="1,1,0", timeouts="255,255", h=8),
    # Issue 50: the switches no property refuted before (docs/model.md, "The controls").
    _control("no-fence-check", "P2", "a hand-off seen on the stream is taken as fresh without its fence",
             tasks="1,1,1", timeouts="255,255,255", h=8, f_pause=1),
    _control("forget-releases", "P8", "a release sent again after a lost reply is not recognised",
             tasks="1,1,0", timeouts="255,2", h=7, f_lost=1),
    _control("deadline-from-reply", "P1", "a holder's local deadline counts from the reply",
             tasks="1,1,0", timeouts="255,255", h=7, f_slow=1),
    _control("look-per-head", "P4", "when to look again belongs to the first waiter, not the place",
             "2x3", tasks="1,3", timeouts="255,255,255,2,4,255", h=8, start_by=1),
    # The documents of permits' controls.
    _control("permit-no-room", "P6", "a permit is taken without testing the room under the limit",
             **SEM, tasks="1,1,1", timeouts="255,255,255", h=7),
    # (Two permits handed in one write: a permit expired as the other holder releases, which a step
    # forward of the server's clock makes come before the waiters look.)
    _control("permit-doc-fence", "P2", "a hand-off naming several permits is taken with the document's fence",
             **SEM, tasks="2,1,1", timeouts="255,255,255,255", h=4, start_by=2, streak=0, f_step=1),
    _control("leader-until-told", "P7", "a leader believes it leads until a renewal is refused",
             **ELECTION, tasks="1,1,0", timeouts="255,255", h=8, f_pause=1),
    _jobs_control("slot-number", "slot-number", "a period done by its slot number, with two schedules",
                  every="3,4", offset="0,1", calls="3,3", h=7),
    _jobs_control("finish-unowned", "finish-unowned", "a finish records success without the live lease",
                  every="4,4", calls="2,2", h=6),
    _jobs_control("slot-number-step", "slot-number", "a period done by its slot number, the clock stepped back",
                  every="3,3", offset="1,1", calls="3,3", h=7, f_step=1),
    _jobs_control("tries-by-request-step", "tries-by-request", "tries in the requests' order, the clock stepped back",
                  "P5 attempts", **STEPPED_TRIES),
    _jobs_control("tries-by-request-mixed", "tries-by-request", "tries kept by the caller's max_attempts",
                  "P5 attempts", **MIXED_TRIES),
]  # fmt: skip

# Counterexamples the model finds in the code's own rules, not yet fixed (docs/model.md): each must
# still be found; the day one is not, its rule was fixed and its bounds join JOBS or CONFIGS, with its
# old rule as a control (issue 36's two attempts findings went that way).
FINDINGS: list[Run] = []


@dataclass
class Result:
    run: Run
    stored: int = 0
    transitions: int = 0
    seconds: float = 0.0
    error: str = ""
    complete: bool = False
    output: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.run.refutes is not None:
            return self.error.startswith(self.run.refutes)
        return self.complete and not self.error


def build(model: str, variant: str = "") -> Path:
    """The verifier of model/<model>.pml (with the compile-time bounds of ``variant``), compiled again
    only when it (or this script's flags) changed."""
    source = HERE / f"{model}.pml"
    where = BUILD / (f"{model}-{variant}" if variant else model)
    pan = where / "pan"
    stamp = where / "flags"
    defines = VARIANTS[variant]
    flags = " ".join([*defines, *CFLAGS])
    if pan.exists() and pan.stat().st_mtime > source.stat().st_mtime and stamp.exists() and stamp.read_text() == flags:
        return pan
    for tool in ("spin", "gcc"):
        if shutil.which(tool) is None:
            sys.exit(f"model/check.py: {tool} is not installed (Debian: apt-get install {tool}; `make model` does it)")
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, where / source.name)
    started = time.monotonic()
    subprocess.run(["spin", *defines, "-a", source.name], cwd=where, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["gcc", *CFLAGS, "-o", "pan", "pan.c"], cwd=where, check=True)
    stamp.write_text(flags)
    print(f"compiled {where.name}'s verifier in {time.monotonic() - started:.0f} s", flush=True)
    return pan


def verify(pan: Path, run: Run, *, limit: float, trail: bool = False) -> Result:
    """One search; a control stops at its first counterexample."""
    workdir = BUILD / run.name
    workdir.mkdir(exist_ok=True)
    for old in workdir.glob("*.trail"):
        old.unlink()
    env = {**os.environ, **{f"MODEL_{key}": value for key, value in run.settings.items()}}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(pan), "-m20000", "-E", "-n", "-c1"],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=limit,
        )  # fmt: skip
        text = done.stdout
    except subprocess.TimeoutExpired as expired:
        text = f"Search not completed: stopped after {limit:.0f} s\n" + str(expired.stdout or "")
    result = Result(run, seconds=time.monotonic() - started, output=text.splitlines())
    if match := re.search(r"(\d+) states, stored", text):
        result.stored = int(match.group(1))
    if match := re.search(r"(\d+) transitions", text):
        result.transitions = int(match.group(1))
    if match := re.search(r"pan:\d+: (P\d[^\n]*?)(?: \(at depth|$)", text):
        result.error = match.group(1).strip()
    elif re.search(r"errors: [1-9]", text):
        result.error = "other: " + next((line for line in text.splitlines() if line.startswith("pan:")), "?")
    result.complete = (
        "Search not completed" not in text and "out of memory" not in text and "max search depth too small" not in text
    )
    if trail and list(workdir.glob("*.trail")):
        replay = subprocess.run([str(pan), "-r", "-n"], cwd=workdir, env=env, capture_output=True, text=True)
        result.output = replay.stdout.splitlines()
    return result


def describe(result: Result) -> str:
    run = result.run
    if run.finding:
        verdict = "still found" if result.ok else "NOT FOUND (fixed? see docs/model.md)"
        outcome = f"{verdict} ({result.error or 'no counterexample'}; issue 36's rules)"
    elif run.refutes is not None:
        verdict = "refuted" if result.ok else "NOT REFUTED"
        outcome = f"{verdict} ({result.error or 'no counterexample'}; wanted {run.refutes})"
    else:
        verdict = "passes" if result.ok else "FAILS"
        outcome = verdict if result.ok else f"{verdict}: {result.error or 'search not completed'}"
    return f"{run.name:<24} {result.stored:>10,} states {result.seconds:>7.1f} s  {outcome}   [{run.what}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deep", action="store_true", help="also the deeper bounds (make soak)")
    parser.add_argument("--only", help="only the runs whose names match this regular expression")
    parser.add_argument("--trail", action="store_true", help="print a counterexample's steps (with --only)")
    parser.add_argument("--jobs", type=int, default=2, help="searches at once (default 2)")
    parser.add_argument("--limit", type=float, default=600, help="seconds a search may take (default 600)")
    arguments = parser.parse_args()
    runs = CONFIGS + (DEEP if arguments.deep else []) + JOBS + CONTROLS + FINDINGS
    if arguments.only:
        runs = [run for run in CONFIGS + DEEP + JOBS + CONTROLS + FINDINGS if re.fullmatch(arguments.only, run.name)]
        if not runs:
            parser.error(f"no run named {arguments.only}")
    with ThreadPoolExecutor(max_workers=arguments.jobs) as pool:
        builds = {key: pool.submit(build, *key) for key in sorted({(run.model, run.variant) for run in runs})}
        pans = {key: done.result() for key, done in builds.items()}
    started = time.monotonic()
    failed = 0
    with ThreadPoolExecutor(max_workers=arguments.jobs) as pool:
        searches = [
            pool.submit(verify, pans[run.model, run.variant], run, limit=arguments.limit, trail=arguments.trail)
            for run in runs
        ]
        for search in as_completed(searches):
            result = search.result()
            print(describe(result), flush=True)
            if arguments.trail:
                print("\n".join(result.output))
            failed += not result.ok
    total = sum(1 for _ in runs)
    print(f"{total - failed}/{total} as expected, {time.monotonic() - started:.0f} s of searching")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
