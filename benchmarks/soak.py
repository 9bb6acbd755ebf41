"""The soak: several processes contend for a few names for minutes while the server is crashed,
restarted and paused and fail points fire; every critical section is recorded, and a resource that
refuses stale fencing tokens is written in each (but reads). Then: overlaps (per name; on a
read-write lock's name, any pair with a writer in it) and token regressions.

    python benchmarks/soak.py [--minutes 20] [--processes 4] [--tasks 8] [--names 4] [--rw-names 2]
                              [--control-seconds 30]

Runs on the embedded server (``--sync-on-commit``, so a SIGKILL loses no acknowledged write). A
control run of a deliberately broken lock, same detector, must show overlaps. Prints the
environment and a Markdown summary for docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import collect_counts, environment, start_worker  # benchmarks/ is the script's directory
from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo

WORKER = Path(__file__).resolve().with_name("soak_worker.py")
DATABASE = "soak"


@dataclass
class Faults:
    """The faults injected, by kind, and how long the server did not answer in all."""

    injected: Counter[str] = field(default_factory=Counter)
    down_seconds: float = 0.0
    log: list[tuple[datetime, str]] = field(default_factory=list)
    """When each fault began (UTC), for the description of an overlap."""


def inject_faults(server: EmbeddedMongo, until: float, faults: Faults) -> None:
    """Until ``until``: every 5-15 s, one fault at random."""
    while time.monotonic() < until:
        time.sleep(min(random.uniform(5, 15), max(0.0, until - time.monotonic())))
        if time.monotonic() >= until:
            return
        kind = random.choice(["crash", "restart", "pause", "pause", "network", "not-primary", "unacknowledged", "slow"])
        faults.injected[kind] += 1
        faults.log.append((datetime.now(UTC), kind))
        started = time.monotonic()
        if kind == "crash":
            server.kill()
            time.sleep(random.uniform(0.5, 3))
            server.start()
        elif kind == "restart":
            server.restart()
        elif kind == "pause":  # sometimes longer than the 3 s TTL: holders must lose their leases
            server.pause()
            time.sleep(random.uniform(0.5, 5))
            server.resume()
        else:
            data: dict[str, Any] = {"failCommands": ["findAndModify", "update"]}
            if kind == "network":
                data["closeConnection"] = True
            elif kind == "not-primary":
                data["errorCode"] = 10107
            elif kind == "unacknowledged":  # applied, then reported failed
                data["writeConcernError"] = {"code": 64, "errmsg": "waiting for replication timed out"}
            else:
                data.update(blockConnection=True, blockTimeMS=random.randint(200, 2000))
            with MongoClient(server.uri, serverSelectionTimeoutMS=10_000) as client:
                client.admin.command({"configureFailPoint": "failCommand", "mode": {"times": random.randint(1, 20)},
                                      "data": data})  # fmt: skip
            continue
        faults.down_seconds += time.monotonic() - started


def run(kind: str, server: EmbeddedMongo, arguments: argparse.Namespace, seconds: float, faults: Faults | None) -> Any:
    with MongoClient(server.uri) as client:
        client.drop_database(DATABASE)
        names = [f"name-{i}" for i in range(arguments.names)] + [f"rw-{i}" for i in range(arguments.rw_names)]
        client[DATABASE]["resource"].insert_many([{"_id": name, "fence": 0, "writes": 0} for name in names])
    directory = Path(tempfile.mkdtemp(prefix="mongolock-soak-"))
    start_at = time.monotonic() + 3.0
    outputs = [directory / f"sections-{i}.jsonl" for i in range(arguments.processes)]
    workers = [
        start_worker(WORKER, [kind, DATABASE, str(arguments.names), str(arguments.rw_names), str(arguments.tasks),
                              str(seconds), str(start_at), str(output)], server.uri)
        for output in outputs
    ]  # fmt: skip
    if faults is not None:
        inject_faults(server, start_at + seconds, faults)
    counts = collect_counts(workers)
    sections = [json.loads(line) for output in outputs for line in output.read_text().splitlines()]
    for output in outputs:
        output.unlink()
    directory.rmdir()
    if not server.running:
        server.start()
    with MongoClient(server.uri) as client:
        resource = {doc["_id"]: doc for doc in client[DATABASE]["resource"].find()}
    return counts, sections, resource


def judge(sections: list[list[Any]]) -> tuple[list[tuple[list[Any], list[Any]]], int]:
    """Overlapping sections (each with the section it overlapped; two reads may overlap) and
    fencing-token regressions (a lock's or a writer's token not above every token before it, a
    read's not above the last writer's), per name, in the order sections began."""
    by_name: dict[str, list[list[Any]]] = defaultdict(list)
    for section in sections:
        by_name[section[0]].append(section)
    overlaps: list[tuple[list[Any], list[Any]]] = []
    regressions = 0
    for name_sections in by_name.values():
        name_sections.sort(key=lambda section: section[1])
        inside: list[list[Any]] = []  # sections not yet left when the next one began
        highest = last_exclusive = 0
        for section in name_sections:
            inside = [other for other in inside if other[2] > section[1]]
            overlaps += [(other, section) for other in inside if (other[7], section[7]) != ("read", "read")]
            inside.append(section)
            token = section[3]
            regressions += token <= (last_exclusive if section[7] == "read" else highest)
            highest = max(highest, token)
            if section[7] != "read":
                last_exclusive = token
    return overlaps, regressions


def describe(overlap: tuple[list[Any], list[Any]], server: EmbeddedMongo, faults: Faults) -> str:
    """The two sections, the faults injected around them, and every write to their name in the
    server's oplog from a few seconds before the first one's token to the second one's."""
    earlier, later = overlap
    lines = [
        f"  {earlier[0]}: token {earlier[3]} left {earlier[2] - later[1]:.3f} s after token {later[3]} entered; "
        f"it left {earlier[6]:+.3f} s from its local deadline (lost: {earlier[5]}, its fenced write refused: "
        f"{earlier[4]}); the later section's write refused: {later[4]}"
    ]
    # Tokens are the server's clock in microseconds when they were handed out (or just above it).
    begin = datetime.fromtimestamp(earlier[3] / 1e6 - 5, UTC)
    end = datetime.fromtimestamp(later[3] / 1e6 + 1, UTC)
    lines += [f"    fault {moment:%H:%M:%S.%f}: {kind}" for moment, kind in faults.log if begin <= moment <= end]
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=10_000) as client:
            entries = client.local["oplog.rs"].find(
                {"$or": [{"o._id": earlier[0]}, {"o2._id": earlier[0]}], "wall": {"$gte": begin, "$lte": end}}
            )
            for entry in entries:
                document = entry.get("o", {})
                fields = {key: document.get(key) for key in ("owner", "expiresAt", "fence", "releasedOwner")}
                lines.append(f"    oplog {entry.get('wall')} {entry.get('op')} {fields} {str(document)[:300]}")
    except Exception as error:  # diagnostics only: the overlap is reported either way
        lines.append(f"    (the oplog could not be read: {error})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--names", type=int, default=4)
    parser.add_argument("--rw-names", type=int, default=2)
    parser.add_argument("--control-seconds", type=float, default=30.0)
    arguments = parser.parse_args()
    print(environment(None), flush=True)
    print(f"{arguments.processes} processes x {arguments.tasks} tasks, {arguments.names} lock names (odd ones fair) "
          f"and {arguments.rw_names} read-write lock names (one hold in four a write), TTL 3 s, one section in "
          f"fifty long with the heartbeat", flush=True)  # fmt: skip
    # An overlap's report reads the oplog of the seconds around it: keep more of it than tests do.
    with EmbeddedMongo(test_commands=True, oplog_entries=20_000) as server:
        faults = Faults()
        counts, sections, resource = run("real", server, arguments, arguments.minutes * 60, faults)
        overlap_list, regressions = judge(sections)
        overlaps = len(overlap_list)
        applied = sum(doc["writes"] for doc in resource.values())
        accepted = sum(1 for section in sections if section[4] is False)
        modes = Counter(section[7] for section in sections)
        print(
            f"\nreal locks, {arguments.minutes:g} min: {len(sections)} critical sections ({modes['lock']} of locks, "
            f"{modes['read']} reads and {modes['write']} writes of read-write locks), {overlaps} overlaps, "
            f"{regressions} fencing-token regressions; lost leases {counts['lost']}, acquire/release errors "
            f"{counts['errors']}; fenced writes accepted {accepted}, refused as stale {counts['refused']}, "
            f"applied at the resource {applied}",
            flush=True,
        )
        print(f"faults: {dict(faults.injected)}; server down or paused {faults.down_seconds:.0f} s in all", flush=True)
        print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        late = sorted(section[6] for section in sections)
        print(
            f"section exits after the lease's local deadline: {sum(1 for x in late if x > 0)}; the latest "
            f"{late[-1]:+.3f} s (a section is cancelled at its deadline once its event loop runs)",
            flush=True,
        )
        for overlap in overlap_list:
            print(describe(overlap, server, faults), flush=True)
        control_counts, control_sections, _ = run("broken", server, arguments, arguments.control_seconds, None)
        control_overlap_list, control_regressions = judge(control_sections)
        control_overlaps = len(control_overlap_list)
        print(
            f"control (check-then-set lock, {arguments.control_seconds:g} s, no faults): {len(control_sections)} "
            f"sections, {control_overlaps} overlaps, {control_regressions} token regressions, "
            f"stale writes refused {control_counts['refused']}",
            flush=True,
        )
    ok = overlaps == 0 and regressions == 0 and control_overlaps > 0
    print("\nPASS" if ok else "\nFAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
