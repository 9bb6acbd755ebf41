"""Mutual exclusion across OS processes: 4 processes x 8 tasks, an overlap detector, and a control.

The control runs the same detector on a deliberately broken lock and must find overlaps; otherwise a
zero from the real lock would prove nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mongolock_async.testing.clients import TEST_DATABASE

PROCESSES = 4
TASKS = 8
SECONDS = 4.0
WORKER = Path(__file__).with_name("mutex_worker.py")


def run_contention(uri: str, kind: str) -> list[list[tuple[float, float]]]:
    """Each process's critical sections, as (enter, exit) on the shared monotonic clock."""
    collection = f"mutex_{kind}_{uuid.uuid4().hex[:8]}"
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                uri,
                TEST_DATABASE,
                collection,
                kind,
                str(TASKS),
                str(SECONDS),
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=WORKER.parent.parent,
        )
        for _ in range(PROCESSES)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        results.append([tuple(json.loads(line)) for line in out.splitlines()])
    return results


def overlaps(per_process: list[list[tuple[float, float]]]) -> int:
    """How many critical sections began before an earlier-begun one had ended."""
    sections = sorted(section for sections in per_process for section in sections)
    count, latest_exit = 0, float("-inf")
    for entered, left in sections:
        if entered < latest_exit:
            count += 1
        latest_exit = max(latest_exit, left)
    return count


def test_detector_counts_overlaps() -> None:
    assert overlaps([[(0.0, 1.0), (2.0, 3.0)], [(1.5, 1.9)]]) == 0
    assert overlaps([[(0.0, 1.0)], [(0.5, 2.0)], [(1.5, 1.6)]]) == 2


@pytest.mark.parametrize("kind", ["real", "broken"])
def test_mutual_exclusion_across_processes(mongodb_uri: str, kind: str) -> None:
    per_process = run_contention(mongodb_uri, kind)
    sections = sum(len(sections) for sections in per_process)
    assert all(per_process), "every process got the lock at least once"
    assert sections >= 40, f"too little contention to judge ({sections} critical sections)"
    found = overlaps(per_process)
    if kind == "real":
        assert found == 0, f"{found} overlapping critical sections out of {sections}"
    else:
        assert found > 0, f"the detector found no overlap in {sections} sections of a broken lock"
