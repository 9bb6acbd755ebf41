"""A holder process paused past its lease (SIGSTOP: a GC pause, a frozen VM) runs no step of its
block past the lease's local deadline, with or without a heartbeat, and learns it lost the lease.

Each step is judged against the deadline its handle reported at that step (a renewal moves it), so
however late this test stops the holder, a correct library passes: only a step taken while the
handle no longer says the lease is live, or past what it says, fails it."""

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

pytestmark = pytest.mark.safety

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
        holder.stdout.readline()  # one step ran before the pause
        os.kill(holder.pid, signal.SIGSTOP)  # a GC pause, a frozen VM: nothing runs, not even timers
        # Past every deadline the lease can have: renewed at most as it was stopped, it ends a TTL
        # after that at the latest.
        time.sleep(ttl + 1.0)
        os.kill(holder.pid, signal.SIGCONT)
        out, _ = holder.communicate(timeout=60)
    finally:
        holder.kill()
    lines = [line.split() for line in out.splitlines()]
    assert lines[-1][0] == "lost", out
    steps = [(float(at), deadline) for kind, at, deadline in (line for line in lines if line[0] == "step")]
    late = [(at, deadline) for at, deadline in steps if deadline == "None" or at >= float(deadline)]
    assert not late, f"the block ran {len(late)} step(s) past its lease's local deadline: {late[:3]}"
