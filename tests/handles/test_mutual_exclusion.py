"""Mutual exclusion across OS processes: 4 processes x 8 tasks, an overlap detector, and a control.

The lock runs in its default mode (local hand-offs within a process, places across processes) and
with ``fair=True``. The control runs the same detector on a deliberately broken lock and must find
overlaps; otherwise a zero from the real lock would prove nothing. Fencing tokens must rise in the
order the critical sections ran, on every hand-off path.

A critical section is what its task believed the way the library promises it (``belief.Belief``):
from an entry observed while its handle said the lease was live to its exit or that lease's local
deadline, whichever came first. So no pause of any process (a worker, the server) can make a
correct lock fail this test, and no failure of it runs again.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Any

import pytest

from mongolock_async.testing.clients import TEST_DATABASE
from tests.support.processes import WORKERS, run_workers

PROCESSES = 4
TASKS = 8
SECONDS = 4.0
WORKER = WORKERS / "mutex_worker.py"


Section = tuple[float, float, int]


def run_contention(uri: str, kind: str) -> tuple[list[list[Section]], list[dict[str, Any]]]:
    """Each process's critical sections, as (enter, exit, fencing token) on the shared monotonic
    clock, and each process's command counts."""
    collection = f"mutex_{kind}_{uuid.uuid4().hex[:8]}"
    start_at = time.monotonic() + 3.0  # time for every process to start and connect
    arguments = [uri, TEST_DATABASE, collection, kind, str(TASKS), str(SECONDS), str(start_at)]
    results, counts = [], []
    for *sections, summary in run_workers(WORKER, arguments, PROCESSES):
        results.append([tuple(json.loads(line)) for line in sections])
        counts.append(json.loads(summary))
    return results, counts


def overlaps(per_process: list[list[Section]]) -> int:
    """How many critical sections began before an earlier-begun one had ended."""
    sections = sorted(section for sections in per_process for section in sections)
    count, latest_exit = 0, float("-inf")
    for entered, left, _ in sections:
        if entered < latest_exit:
            count += 1
        latest_exit = max(latest_exit, left)
    return count


def test_detector_counts_overlaps() -> None:
    assert overlaps([[(0.0, 1.0, 1), (2.0, 3.0, 3)], [(1.5, 1.9, 2)]]) == 0
    assert overlaps([[(0.0, 1.0, 1)], [(0.5, 2.0, 2)], [(1.5, 1.6, 3)]]) == 2


@pytest.mark.safety
@pytest.mark.parametrize("kind", ["real", "fair", "broken"])
def test_mutual_exclusion_across_processes(mongolock_uri: str, kind: str) -> None:
    per_process, counts = run_contention(mongolock_uri, kind)
    sections = sum(len(sections) for sections in per_process)
    assert all(per_process), "every process got the lock at least once"
    assert sections >= 40, f"too little contention to judge ({sections} critical sections)"
    found = overlaps(per_process)
    if kind == "broken":
        assert found > 0, f"the detector found no overlap in {sections} sections of a broken lock"
        return
    assert found == 0, f"{found} overlapping critical sections out of {sections}"
    tokens = [token for _, _, token in sorted(section for process in per_process for section in process)]
    assert all(earlier < later for earlier, later in itertools.pairwise(tokens)), "a fencing token went down"
    # Requests per acquisition, counting every change-stream getMore that delivered an event (the
    # embedded server also answers idle getMores early with empty batches, which MongoDB does not).
    # By design an acquisition costs the write of the release that hands it over; handed to
    # another process's place, one change event to that process, and one claim when the hand-off
    # comes later than the place's last write plus its safety margin (1 s here), as it does on a
    # loaded machine whose processes lag. Measured here: 1.2 to 1.4 in the default mode (mostly
    # local hand-offs), 2.1 to 2.3 in fair mode (every hand-off to another process's place), also
    # with workers stopped for up to 1 s; one limit of 3.2 for both failed when a worker lagged
    # (issue 50). Still caught: a release that wakes every waiting task (31 here), and, in fair
    # mode, one that wakes the head of every waiting process (3 more attempts and 3 more events).
    requests = sum(
        count
        for process in counts
        for name, count in process["sent"].items()
        if name in ("findAndModify", "update", "find", "aggregate", "killCursors")
    ) + sum(process["events_delivered"] for process in counts)
    limit = {"real": 3.2, "fair": 4.5}[kind]
    assert requests <= limit * sections, f"{requests} requests for {sections} acquisitions: {counts}"
