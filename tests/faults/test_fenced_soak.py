"""A short run of the fenced-writes soak (``make soak`` runs the long one): processes paused at random
past their TTL and, on a server of its own, a server restart; no stale write may land at the
resource under the guard and the token check, and the control run without them must show stale
writes landing (the detector works)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from mongolock_async.testing import ServerChoice
from tests.support.run_settings import child_environment

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "fenced_soak.py"


@pytest.mark.safety
def test_no_stale_write_lands_under_the_guard_and_some_do_without_it(
    mongolock_server: ServerChoice, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    """Private server: where no server is given, the soak crashes and restarts its server, so it
    starts an embedded server of its own; given one (``MONGODB_URI``, testcontainers), it runs there,
    pausing its processes but never restarting that server."""
    given = mongolock_server.kind != "embedded"
    database = f"fenced_soak_{uuid.uuid4().hex[:10]}"
    # The control ends at its first stale write, within 90 s even on a loaded machine.
    command = [sys.executable, str(SOAK), "--minutes", "0.4", "--control-seconds", "90", "--control-until-stale"]
    # The URI goes in the environment, never on a command line (ps shows those).
    settings = {"MONGODB_URI": mongolock_server.uri} if given else {}
    try:
        result = subprocess.run(
            [*command, "--database", database, "--json"],
            capture_output=True,
            text=True,
            timeout=280,
            cwd=SOAK.parent.parent,
            env=child_environment(**settings),
        )
    finally:
        if given:
            mongolock_admin_client.drop_database(database)
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert ("server MongoDB at --uri" in report["environment"]) is given, report["environment"]
    guarded, control = report["guarded"], report["control"]
    assert guarded["faults"]["process pauses"] > 0 and control["faults"]["process pauses"] > 0
    if given:
        assert "server restarts" not in guarded["faults"], "the soak restarted the server under test"
    assert min(guarded["applied"].values()) > 0, guarded
    assert guarded["stale"] == {"txn": 0, "token": 0}, guarded
    assert sum(control["stale"].values()) > 0, f"the control run showed no stale write: {control}"
    assert result.returncode == 0
