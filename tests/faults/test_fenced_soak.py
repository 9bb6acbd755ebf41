"""A short run of the fenced-writes soak (``make soak`` runs the long one): processes paused at random
past their TTL and a server restart; no stale write may land at the resource under the guard and the
token check, and the control run without them must show stale writes landing (the detector works)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.run_settings import child_environment

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "fenced_soak.py"


@pytest.mark.safety
def test_no_stale_write_lands_under_the_guard_and_some_do_without_it() -> None:
    result = subprocess.run(
        # The control ends at its first stale write, within 90 s even on a loaded machine.
        [sys.executable, str(SOAK), "--minutes", "0.4", "--control-seconds", "90", "--control-until-stale", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=SOAK.parent.parent,
        env=child_environment(),
    )
    report = json.loads(result.stdout.splitlines()[-1])
    guarded, control = report["guarded"], report["control"]
    assert guarded["faults"]["process pauses"] > 0 and control["faults"]["process pauses"] > 0
    assert min(guarded["applied"].values()) > 0, guarded
    assert guarded["stale"] == {"txn": 0, "token": 0}, guarded
    assert sum(control["stale"].values()) > 0, f"the control run showed no stale write: {control}"
    assert result.returncode == 0
