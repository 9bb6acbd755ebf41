"""A short run of the lease chaos (``make soak`` runs a long one): tasks of two processes contend for
one name through a fail point every 150 ms. No lease may stay live, held by nobody, longer than a
TTL, and none may be owned by a token its process was done with (withdrawn, or released); the
control run, a holder that renews what it let go and puts a released token back, must trip both
detectors. It runs on the server under test, as every fault test (``fault_server``): given a server
(``MONGODB_URI``, testcontainers), on that one."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.fail_points import FaultServer
from tests.support.run_settings import child_environment

CHAOS = Path(__file__).resolve().parents[2] / "benchmarks" / "lease_chaos.py"


@pytest.mark.safety
def test_no_lease_outlives_its_ttl_held_by_nobody_and_the_control_shows_the_detectors_work(
    fault_server: FaultServer,
) -> None:
    # The chaos arms the server's one failCommand fail point for its workers' appName, during the
    # fault server's turn at it (other workers' fault tests wait), in a database of its own, which
    # it drops at the end. The URI goes in the environment, never on a command line (ps shows those).
    database = f"lease_chaos_{uuid.uuid4().hex[:10]}"
    try:
        result = subprocess.run(
            [sys.executable, str(CHAOS), "--seconds", "5", "--control-seconds", "4", "--database", database, "--json"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=CHAOS.parent.parent,
            env=child_environment(MONGODB_URI=fault_server.uri),
        )
    finally:
        fault_server.admin.drop_database(database)
    assert result.stdout, result.stderr[-3000:]
    assert "server MongoDB at --uri" in result.stdout.splitlines()[0], "the chaos started a server of its own"
    report = json.loads(result.stdout.splitlines()[-1])
    real, control, bound = report["real"], report["control"], report["bound"]
    assert real["leases held"] > 0 and real["fail points armed"] > 10, real
    longest = real["longest unheld leases"]
    assert not longest or longest[0]["seconds"] <= bound, f"a lease outlived its TTL, held by nobody: {real}"
    assert real["reads of a lease held by a token done with"] == 0, real
    assert control["released tokens put back"] > 0, control
    assert control["longest unheld leases"][0]["seconds"] > bound, f"the control showed nothing: {control}"
    assert control["reads of a lease held by a token done with"] > 0, f"the control showed nothing: {control}"
    assert result.returncode == 0
