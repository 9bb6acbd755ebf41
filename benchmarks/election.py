"""Leader election, reported as times and counts measured in one run on one machine.

1. Failover after a clean resignation: two candidate processes take turns (each leads 0.2 s, then
   resigns). The gap from a resignation being sent to the other process leading (p50, p99),
   against one findAndModify round trip in the same processes (p50, as the driver timed it); the
   goal is a p50 within 100 ms plus one round trip.
2. Observers: a third process watches with ``changes()``; the gap from a resignation being sent to
   the observer seeing the new term (p50, p99), beside the gap to the new leader leading.
3. Failover after SIGKILL: a leader process (TTL 2 s) is killed while a candidate process waits;
   how long after the kill the candidate leads, per round, against TTL + 1 s.
4. The cost of a standing leadership: one process leads and holds 20 locks, all with a heartbeat
   every 0.5 s; renewal requests (``update`` commands) per heartbeat tick (the goal: one, shared).

    python benchmarks/election.py [--uri URI] [--seconds 10] [--kills 3]

Without ``--uri``/``MONGODB_URI`` it starts an embedded server per part. It prints the environment first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import environment, mongodb, start_worker  # benchmarks/ is on sys.path when this runs as a script
from bench import _percentile
from hot_lock_worker import Requests
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoElection, AsyncMongoLock

WORKER = Path(__file__).resolve().with_name("election_worker.py")
KILL_TTL = 2.0


def lines_of(worker: subprocess.Popen[str]) -> list[dict[str, Any]]:
    assert worker.stdout is not None
    out = worker.stdout.read()
    if worker.wait(timeout=300) != 0:
        raise RuntimeError(f"election worker {worker.args[2]} failed (exit {worker.returncode})")
    return [json.loads(line) for line in out.splitlines()]


def ms(seconds: list[float], percentile: int) -> str:
    return f"{_percentile(sorted(seconds), percentile) * 1000:.1f} ms"


def resignations(uri: str, seconds: float) -> None:
    observer = start_worker(WORKER, ["observer", "handover", str(seconds + 3)], uri)
    time.sleep(1.0)  # the observer's stream is open before the first term
    candidates = [start_worker(WORKER, ["candidate", "handover", "30", str(seconds), "0.2"], uri) for _ in range(2)]
    outputs = [lines_of(worker) for worker in candidates]
    seen = [line for line in lines_of(observer) if "seen" in line]
    round_trips = [rt for out in outputs for line in out for rt in line.get("find_and_modify_seconds", ())]
    takeovers, observed = [], []
    for mine, theirs in ((outputs[0], outputs[1]), (outputs[1], outputs[0])):
        for resign in (line for line in mine if "resign" in line):
            led = min((line for line in theirs if "led" in line and line["led"] > resign["resign"]),
                      key=lambda line: line["led"], default=None)  # fmt: skip
            if led is None:
                continue
            takeovers.append(led["led"] - resign["resign"])
            saw = next((line["seen"] for line in seen if line["term"] == led["term"]), None)
            if saw is not None:
                observed.append(saw - resign["resign"])
    round_trip = statistics.median(round_trips)
    print(
        f"{len(takeovers)} resignations | next leader leads after p50 {ms(takeovers, 50)} p99 {ms(takeovers, 99)} | "
        f"findAndModify round trip p50 {round_trip * 1000:.1f} ms | goal p50 <= 100 ms + one round trip = "
        f"{100 + round_trip * 1000:.1f} ms"
    )
    print(
        f"an observer sees the new term {len(observed)} times of {len(takeovers)}: after p50 {ms(observed, 50)} "
        f"p99 {ms(observed, 99)} from the resignation"
    )


def kills(uri: str, rounds: int) -> None:
    gaps = []
    for n in range(rounds):
        name = f"killed-{n}"
        leader = start_worker(WORKER, ["leader", name, str(KILL_TTL)], uri)
        assert leader.stdout is not None
        json.loads(leader.stdout.readline())  # it leads
        waiting = start_worker(WORKER, ["candidate", name, str(KILL_TTL), "0.1", "0"], uri)
        time.sleep(1.5)  # the candidate has started and stored its place
        leader.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        leader.wait()
        led = next(line for line in lines_of(waiting) if "led" in line)
        gaps.append(led["led"] - killed_at)
    print(
        f"SIGKILLed leader (TTL {KILL_TTL:g} s, heartbeat every {KILL_TTL / 3:.2f} s): the candidate leads "
        f"{', '.join(f'{gap:.2f}' for gap in gaps)} s after the kill | goal <= TTL + 1 s = {KILL_TTL + 1:g} s"
    )


async def standing_cost(uri: str) -> None:
    requests = Requests()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, event_listeners=[requests])
    collection = client["bench"]["standing"]
    interval, window = 0.5, 5.0
    election = AsyncMongoElection(collection, "standing", ttl=3.0, heartbeat=interval)
    locks = [AsyncMongoLock(collection, f"lock-{n}", ttl=3.0, heartbeat=interval) for n in range(20)]
    await election.campaign()
    for lock in locks:
        assert await lock.acquire()
    await asyncio.sleep(interval)
    requests.reset()
    await asyncio.sleep(window)
    updates = requests.sent.get("update", 0)
    print(
        f"a leader holding 20 locks, all renewed every {interval:g} s: {updates} renewal requests in {window:g} s "
        f"= {updates / (window / interval):.2f} per heartbeat tick (goal: 1, shared)"
    )
    await election.resign()
    for lock in locks:
        await lock.release()
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the resignation run")
    parser.add_argument("--kills", type=int, default=3, help="leaders SIGKILLed, one per round")
    arguments = parser.parse_args()
    print(environment(arguments.uri))
    print("\n== failover after a clean resignation, and observers ==")
    with mongodb(arguments.uri) as uri:
        resignations(uri, arguments.seconds)
    print("\n== failover after SIGKILL ==")
    with mongodb(arguments.uri) as uri:
        kills(uri, arguments.kills)
    print("\n== the cost of a standing leadership ==")
    with mongodb(arguments.uri) as uri:
        asyncio.run(standing_cost(uri))


if __name__ == "__main__":
    main()
