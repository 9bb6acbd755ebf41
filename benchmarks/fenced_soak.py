"""The fenced-writes soak: processes take one lock and write two resource documents under it while
they are paused at random (SIGSTOP, often past the 1 s TTL: their leases end while they cannot know)
and the server is crashed and restarted. Counts, at the resource, writes that landed with a token
below one already applied (stale writes). Then a control run, the same without the guard and the
token check, must show stale writes landing, or the detector proves nothing.

    python benchmarks/fenced_soak.py [--minutes 5] [--processes 3] [--tasks 3] [--control-seconds 60]
                                     [--uri URI] [--database fenced_soak] [--json]

Runs on an embedded server it starts (``--sync-on-commit``), which it crashes and restarts; or on
the server at ``--uri`` (default ``MONGODB_URI``), a replica set or a sharded cluster, in the
database ``--database`` (dropped before each run and at the end), with the processes' pauses but
without the restarts: a server given is never restarted. Exit status 0 when the guarded run has no
stale write and the control run has some.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import collect_counts, environment, start_worker  # benchmarks/ is the script's directory
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from mongolock_async.testing import EmbeddedMongo

WORKER = Path(__file__).resolve().with_name("fenced_soak_worker.py")


def run(
    mode: str,
    uri: str,
    own: EmbeddedMongo | None,
    arguments: argparse.Namespace,
    seconds: float,
    *,
    until_stale: bool = False,
) -> dict[str, Any]:
    """One run: workers started, faults injected until the end, the resource's counters read. The
    server is crashed and restarted now and then only if it is the soak's ``own``."""
    database = arguments.database
    with MongoClient(uri) as client:
        client.drop_database(database)
        client[database]["resource"].insert_many([{"_id": "txn"}, {"_id": "token"}])
    start_at = time.monotonic() + 3.0
    workers = [
        start_worker(WORKER, [mode, database, str(arguments.tasks), str(seconds), str(start_at)], uri)
        for _ in range(arguments.processes)
    ]
    faults: Counter[str] = Counter()
    time.sleep(max(0.0, start_at - time.monotonic()))
    stop_at = start_at + seconds
    next_restart = time.monotonic() + random.uniform(15, 30)
    while time.monotonic() < stop_at - 1:
        if until_stale and _stale_writes(uri, database) > 0:
            _stop_workers(uri, database)  # the detector fired: the control has shown what it must
            break
        time.sleep(random.uniform(0.3, 1.5))
        if own is not None and time.monotonic() >= next_restart:
            own.restart(crash=random.random() < 0.5)
            faults["server restarts"] += 1
            next_restart = time.monotonic() + random.uniform(15, 30)
            continue
        victim = random.choice(workers)
        os.kill(victim.pid, signal.SIGSTOP)
        time.sleep(random.uniform(0.2, 2.5))  # past the 1 s TTL more often than not
        os.kill(victim.pid, signal.SIGCONT)
        faults["process pauses"] += 1
    counts = collect_counts(workers)
    with MongoClient(uri) as client:
        resource = {doc["_id"]: doc for doc in client[database]["resource"].find()}
        elapsed = time.monotonic() - start_at
    return {
        "mode": mode,
        "seconds": round(min(seconds, elapsed), 1),
        **counts,
        "faults": dict(faults),
        "applied": {key: doc.get("writes", 0) for key, doc in resource.items()},
        "stale": {key: doc.get("stale", 0) for key, doc in resource.items()},
    }


def _stale_writes(uri: str, database: str) -> int:
    """Stale writes landed so far (0 while the server cannot be read: it may be restarting)."""
    try:
        with MongoClient(uri, serverSelectionTimeoutMS=1000) as client:
            return sum(doc.get("stale", 0) for doc in client[database]["resource"].find())
    except PyMongoError:
        return 0


def _stop_workers(uri: str, database: str) -> None:
    """Ask the workers to end now (they look for this document between sections)."""
    with MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        client[database]["control"].insert_one({"_id": "stop"})


@contextlib.contextmanager
def server(uri: str | None, database: str) -> Iterator[tuple[str, EmbeddedMongo | None]]:
    """The server given (its database dropped at the end), or an embedded one of the soak's own."""
    if uri:
        try:
            yield uri, None
        finally:
            with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
                client.drop_database(database)
        return
    with EmbeddedMongo(test_commands=True) as own:
        yield own.uri, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--control-seconds", type=float, default=60.0)
    parser.add_argument(
        "--control-until-stale",
        action="store_true",
        help="end the control run at its first stale write (--control-seconds is then the most it takes)",
    )
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"), help="a server to run on (never restarted)")
    parser.add_argument("--database", default="fenced_soak", help="dropped before each run and at the end")
    parser.add_argument("--json", action="store_true", help="print the two runs' results as one JSON line")
    arguments = parser.parse_args()
    ran_on = environment(arguments.uri)
    if not arguments.json:
        print(ran_on, flush=True)
        print(f"{arguments.processes} processes x {arguments.tasks} tasks, one lock, TTL 1 s, no heartbeat", flush=True)
    with server(arguments.uri, arguments.database) as (uri, own):
        guarded = run("guarded", uri, own, arguments, arguments.minutes * 60)
        until_stale = arguments.control_until_stale
        control = run("control", uri, own, arguments, arguments.control_seconds, until_stale=until_stale)
    ok = sum(guarded["stale"].values()) == 0 and sum(control["stale"].values()) > 0
    if arguments.json:
        print(json.dumps({"environment": ran_on, "guarded": guarded, "control": control, "ok": ok}))
    else:
        for result in (guarded, control):
            print(
                f"\n{result['mode']}, {result['seconds']:g} s: {result['sections']} sections; writes applied "
                f"{result['applied']}, stale writes applied {result['stale']}; refused {result.get('refused', 0)}; "
                f"leases lost {result['lost']}, errors {result['errors']}; faults {result['faults']}",
                flush=True,
            )
        print("\nPASS" if ok else "\nFAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
