"""A holder process paused past its lease (SIGSTOP: a GC pause, a frozen VM) runs no step of its
block past the lease's local deadline, with or without a heartbeat, and learns it lost the lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.processes import ROOT, WORKERS
from tests.support.run_settings import child_environment

PAUSED_HOLDER = WORKERS / "paused_holder.py"


@pytest.mark.parametrize("heartbeat", [0.0, 0.4], ids=["without-heartbeat", "with-heartbeat"])
def test_a_paused_holder_runs_no_step_past_its_deadline(mongolock_uri: str, heartbeat: float) -> None:
    ttl = 1.5
    holder = subprocess.Popen(
        [sys.executable, str(PAUSED_HOLDER), mongolock_uri, TEST_DATABASE, "paused", "held", str(ttl), str(heartbeat)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_environment(),
    )
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline().split()
        assert first[0] == "deadline", first
        deadline = float(first[1])
        holder.stdout.readline()  # one step ran before the pause
        os.kill(holder.pid, signal.SIGSTOP)  # a GC pause, a frozen VM: nothing runs, not even timers
        time.sleep(max(0.0, deadline - time.monotonic()) + 1.0)
        os.kill(holder.pid, signal.SIGCONT)
        out, _ = holder.communicate(timeout=60)
    finally:
        holder.kill()
    lines = [line.split() for line in out.splitlines()]
    steps = [float(at) for kind, at in lines if kind == "step"]
    assert lines[-1][0] == "lost", out
    late = [at for at in steps if at > deadline]
    assert not late, f"the block ran {len(late)} step(s) past its local deadline {deadline}: {late[:3]}"
