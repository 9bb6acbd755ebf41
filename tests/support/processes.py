"""The worker scripts (tests/workers/) and how tests start them as OS processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.run_settings import child_environment

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root, where child processes run."""
WORKERS = ROOT / "tests" / "workers"
"""The scripts tests start as OS processes (each imports its neighbours by module name)."""


def run_workers(worker: Path, arguments: list[str], processes: int) -> list[list[str]]:
    """Run ``processes`` copies of the ``worker`` script with ``arguments`` at once (from the
    repository's root) and return each one's output lines; a worker that fails fails the test with
    its stderr."""
    started = [
        subprocess.Popen(
            [sys.executable, str(worker), *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_environment(),
        )
        for _ in range(processes)
    ]
    outputs = []
    for process in started:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs.append(out.splitlines())
    return outputs
