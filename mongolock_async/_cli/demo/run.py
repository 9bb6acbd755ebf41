"""``mongolock demo``: the library doing its job, with several OS processes, checked at the end.

1. Flash sale: worker processes buy from a limited stock, each purchase under a per-item lock; the
   demo checks that exactly the stock was sold and nothing was oversold.
2. Run-once job: schedulers race for one job; exactly one runs it, kept alive by the heartbeat for
   several TTLs; the others report who holds it.
3. Crash and takeover: the holder is SIGKILLed mid-job; a waiter takes over once the lease expires,
   with a higher fencing token.
4. Paused holder and fenced writes: a holder is stopped (SIGSTOP) past its TTL, another process
   takes over and posts to an account; the first resumes and tries to post too: its transaction
   tied to the lease and its token-checked write are refused, and the account shows only the new
   holder's posting.
5. Rate limit: processes of exporters call an API that allows ``--limit`` calls at once, each call
   under a permit of a semaphore; the API itself counts, and never sees more at once.
6. Leader election: three replicas campaign; the leader shuts down cleanly and hands leadership on
   at once, then the next is SIGKILLed and the last leads only once its term has expired, each in a
   higher term.
7. Once per period: three replicas fire a job four times per period of the server's clock; the
   run of one period hangs and its process is SIGKILLed, and another replica runs the job again in
   the same period once the dead run's lease has expired; every period's job ran to completion once.
8. ``mongolock check`` on the same server and lock collection: every check of the deployment
   passes (for locks of the library's default TTL), and its scratch locks are removed.

Everything happens in a database of its own (``mongolock_demo_<random>``), dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from ..._util.process import die_with_parent
from ...store import LockStore
from ..commandline import EXIT_FAILED, EXIT_USAGE, UserError, connect, explain, redact_uri
from .worker import (
    ACCOUNTS,
    API,
    DIGEST,
    DIGESTS,
    ELECTION,
    HANG,
    INVENTORY,
    JOB_LOCK,
    JOB_RUNS,
    LEDGER,
    LEDGER_LOCK,
    LOCKS,
    SALES,
)

DROP_SETTLE = 0.5
"""Seconds the demo's database must stay dropped, after workers were killed, before the demo ends."""


@dataclass
class Checks:
    """The demo's verdicts, in order."""

    results: list[tuple[str, bool]] = field(default_factory=list)

    def record(self, view: View, label: str, ok: bool) -> None:
        self.results.append((label, ok))
        view.check(label, ok)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok in self.results)


class View:
    """Plain-text output: a timeline of events and the checks (used when stdout is not a terminal)."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.started:6.2f}s]"

    def section(self, title: str) -> None:
        print(f"\n== {title} ==", flush=True)

    def event(self, text: str) -> None:
        print(f"{self.stamp()} {text}", flush=True)

    def progress(self, label: str, done: int, total: int) -> None:
        if total and (done == total or done % max(1, total // 4) == 0):
            self.event(f"{label}: {done}/{total}")

    def check(self, label: str, ok: bool) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {label}", flush=True)

    def lines(self, lines: list[str]) -> None:
        """Text shown as it is (another command's output)."""
        for line in lines:
            print(line, flush=True)

    def close(self) -> None:
        pass


class RichView(View):
    """The same on a terminal, with colour and a live progress bar (needs the ``rich`` extra)."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import Progress

        self.console = Console()
        self.bars = Progress(console=self.console, transient=False)
        self.tasks: dict[str, Any] = {}
        self.bars.start()

    def section(self, title: str) -> None:
        self.console.rule(f"[bold]{title}")

    def event(self, text: str) -> None:
        self.console.print(f"[dim]{self.stamp()}[/dim] {text}", highlight=False)

    def progress(self, label: str, done: int, total: int) -> None:
        if label not in self.tasks:
            self.tasks[label] = self.bars.add_task(label, total=total)
        self.bars.update(self.tasks[label], completed=done)

    def check(self, label: str, ok: bool) -> None:
        self.console.print(f"{'[green]PASS' if ok else '[red]FAIL'}[/]  {label}", highlight=False)

    def lines(self, lines: list[str]) -> None:
        for line in lines:
            self.console.print(line, highlight=False, markup=False)

    def close(self) -> None:
        self.bars.stop()


def make_view(plain: bool) -> View:
    if not plain and sys.stdout.isatty():
        with contextlib.suppress(ImportError):
            return RichView()
    return View()


def run_demo(arguments: argparse.Namespace) -> int:
    for option in ("workers", "tasks", "items", "stock", "schedulers"):
        if getattr(arguments, option) < 1:
            raise UserError(f"--{option} must be at least 1", EXIT_USAGE)
    if not 1 <= arguments.limit <= 100:
        raise UserError("--limit must be 1 to 100", EXIT_USAGE)
    if arguments.ttl <= 0.3 or arguments.job_ttls <= 0:
        raise UserError("--ttl must be above 0.3 s and --job-ttls positive", EXIT_USAGE)
    view = make_view(arguments.plain)
    try:
        # Started here, on the main thread, so that the server dies with this process however it ends.
        with _server(arguments.uri, view) as uri:
            return asyncio.run(_demo(uri, arguments, view))
    finally:
        view.close()


async def _demo(uri: str, arguments: argparse.Namespace, view: View) -> int:
    checks = Checks()
    client = connect(uri)
    database_name = f"mongolock_demo_{uuid.uuid4().hex[:8]}"
    try:
        try:
            await client.admin.command("ping")  # unreachable, credentials: one line, before anything starts
        except PyMongoError as error:
            raise await explain(error, uri, client) from None
        try:
            database = client[database_name]
            await flash_sale(uri, database, arguments, view, checks)
            await run_once_job(uri, database, arguments, view, checks)
            await crash_and_takeover(uri, database, arguments, view, checks)
            await paused_holder(uri, database, arguments, view, checks)
            await rate_limit(uri, database, arguments, view, checks)
            await leader_failover(uri, database, arguments, view, checks)
            await once_per_period(uri, database, view, checks)
            await deployment_check(uri, database, view, checks)
        finally:
            killed = await Worker.stop_all()
            await drop_for_good(client[database_name], settle=DROP_SETTLE if killed else 0.0)
    finally:
        await client.close()
    passed = sum(ok for _, ok in checks.results)
    print(f"\n{passed}/{len(checks.results)} checks passed", flush=True)
    return 0 if checks.passed else EXIT_FAILED


async def drop_for_good(database: Any, *, settle: float) -> None:
    """Drop ``database``, then drop it again each time it comes back within ``settle`` seconds.

    A killed worker's last request can still run after the worker is gone, and after a first drop:
    the server reads what was sent before the socket closed and runs it, since MongoDB interrupts an
    operation on its client's disconnect only for exhaust cursors (``WorkItem::initOperation`` in
    ``src/mongo/transport/session_workflow.cpp``). Such a write would bring the database back.
    """
    await database.client.drop_database(database.name)
    quiet_since = time.monotonic()
    for _ in range(100):
        if time.monotonic() - quiet_since >= settle:
            return
        await asyncio.sleep(settle / 10)
        if await database.list_collection_names():
            await database.client.drop_database(database.name)
            quiet_since = time.monotonic()


@contextlib.contextmanager
def _server(uri: str | None, view: View) -> Iterator[str]:
    if uri:
        view.event(f"using MongoDB at {redact_uri(uri)}")
        connect(uri)  # an invalid URI: one line, before anything starts
        yield uri
        return
    from ...testing.server import EmbeddedMongo, EmbeddedServerError

    try:
        server = EmbeddedMongo()
    except EmbeddedServerError as error:
        raise UserError(f"{error}, or pass --uri", EXIT_FAILED) from None
    view.event("starting an embedded MongoDB server (SecantusDB) ...")
    with server:
        view.event(f"embedded server listening on 127.0.0.1:{server.port}")
        yield server.uri


class Worker:
    """A demo worker process whose JSON events are read as they come."""

    started: ClassVar[list[asyncio.subprocess.Process]] = []
    """Every worker process started, for ``stop_all``."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def stop_all(cls) -> bool:
        """Kill the workers still running and wait for them: one still waiting for a lock would
        write it again after the demo dropped its database (as after Ctrl-C mid-scenario). Return
        whether any was still running."""
        killed = False
        for process in cls.started:
            if process.returncode is None:
                killed = True
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        cls.started.clear()
        return killed

    @classmethod
    async def start(cls, name: str, kind: str, uri: str, *arguments: str) -> Worker:
        """Start a worker. The URI goes to it on its stdin: a command line is visible to every user
        of the machine (``ps``), and a URI can carry a password."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mongolock_async._cli.demo.worker",
            kind,
            *arguments,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        cls.started.append(process)
        if process.stdin is None:
            raise RuntimeError(f"demo worker {name}: started without a pipe to its stdin")
        process.stdin.write(uri.encode() + b"\n")
        await process.stdin.drain()
        process.stdin.close()
        return cls(process, name)

    async def follow(self, on_event: Callable[[dict[str, Any]], None]) -> int:
        """Pass each event to ``on_event`` until the process exits; return its exit status."""
        if self.process.stdout is None or self.process.stderr is None:
            raise RuntimeError(f"demo worker {self.name}: started without pipes from its stdout and stderr")
        async for line in self.process.stdout:
            event = json.loads(line)
            self.events.append(event)
            on_event(event)
        status = await self.process.wait()
        if status not in (0, -signal.SIGKILL):
            error = (await self.process.stderr.read()).decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"demo worker {self.name} failed ({status}): {error[-1] if error else ''}")
        return status

    async def wait_for(self, kind: str) -> dict[str, Any]:
        while not any(event["event"] == kind for event in self.events):
            if self.process.returncode is not None:
                raise RuntimeError(f"demo worker {self.name} exited before {kind!r}")
            await asyncio.sleep(0.02)
        return next(event for event in self.events if event["event"] == kind)


async def flash_sale(uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks) -> None:
    items, stock = arguments.items, arguments.stock
    total = items * stock
    view.section(
        f"1. Flash sale: {arguments.workers} processes x {arguments.tasks} buyers, {items} products x {stock} units"
    )
    await database[INVENTORY].insert_many([{"_id": f"item-{i + 1}", "stock": stock} for i in range(items)])
    sold = 0

    def on_event(event: dict[str, Any]) -> None:
        nonlocal sold
        if event["event"] == "sold":
            sold += 1
            view.progress("units sold", sold, total)
        elif event["event"] == "done":
            view.event(f"{event['worker']} (pid {event['pid']}) done: bought {event['bought']}")

    workers = [
        await Worker.start(f"worker-{i + 1}", "sale", uri, database.name, f"worker-{i + 1}", str(arguments.tasks))
        for i in range(arguments.workers)
    ]
    await asyncio.gather(*(worker.follow(on_event) for worker in workers))
    remaining = {doc["_id"]: doc["stock"] async for doc in database[INVENTORY].find()}
    sales = await database[SALES].find().to_list(None)
    by_item = Counter(sale["item"] for sale in sales)
    fences_unique = all(
        len({sale["fence"] for sale in sales if sale["item"] == item}) == count for item, count in by_item.items()
    )
    view.event(f"sales per product: {dict(sorted(by_item.items()))}; stock left: {dict(sorted(remaining.items()))}")
    checks.record(view, f"stock is exactly zero for all {items} products", all(v == 0 for v in remaining.values()))
    checks.record(view, f"sales equal the stock ({len(sales)} of {total})", len(sales) == total)
    checks.record(view, "nobody oversold (no product sold more than its stock)", max(by_item.values()) <= stock)
    checks.record(view, "every purchase ran under its own acquisition (distinct fencing tokens)", fences_unique)


async def run_once_job(uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks) -> None:
    ttl, schedulers = arguments.ttl, arguments.schedulers
    job_seconds = ttl * arguments.job_ttls
    view.section(
        f"2. Run-once job: {schedulers} schedulers race for {JOB_LOCK!r}; the job lasts {job_seconds:g} s "
        f"= {arguments.job_ttls:g} TTLs, kept alive by the heartbeat"
    )

    def on_event(event: dict[str, Any]) -> None:
        kind, worker = event["event"], event["worker"]
        if kind == "started":
            view.event(f"{worker} (pid {event['pid']}) won the race and runs the job, fencing token {event['fence']}")
        elif kind == "skipped":
            holder = event.get("holder") or {}
            view.event(
                f"{worker} (pid {event['pid']}) skipped: held by {holder.get('label')} "
                f"(pid {holder.get('pid')}, fencing token {event.get('fence')})"
            )
        elif kind == "progress":
            view.progress("job progress (%)", round(event["fraction"] * 100), 100)
        elif kind == "finished":
            view.event(f"{worker} finished the job")
        elif kind == "lost":
            view.event(f"{worker} LOST the lock: {event['reason']}")

    workers = [
        await Worker.start(
            f"scheduler-{i + 1}", "job", uri, database.name, f"scheduler-{i + 1}", str(ttl), str(job_seconds)
        )
        for i in range(schedulers)
    ]
    await asyncio.gather(*(worker.follow(on_event) for worker in workers))
    kinds = Counter(event["event"] for worker in workers for event in worker.events)
    runs = await database[JOB_RUNS].find().to_list(None)
    checks.record(view, "exactly one scheduler ran the job", kinds["started"] == 1 and len(runs) == 1)
    checks.record(
        view, f"the other {schedulers - 1} reported the holder and skipped", kinds["skipped"] == schedulers - 1
    )
    checks.record(view, "the job finished with the lease never lost", kinds["finished"] == 1 and kinds["lost"] == 0)
    await database[JOB_RUNS].delete_many({})


async def crash_and_takeover(
    uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks
) -> None:
    ttl = arguments.ttl
    view.section(f"3. Crash and takeover: the holder is SIGKILLed mid-job; TTL {ttl:g} s")

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "started":
            view.event(f"{event['worker']} (pid {event['pid']}) holds {JOB_LOCK!r}, fencing token {event['fence']}")
        elif event["event"] == "finished":
            view.event(f"{event['worker']} finished the job")

    doomed = await Worker.start("doomed", "job", uri, database.name, "doomed", str(ttl), "600")
    doomed_done = asyncio.create_task(doomed.follow(on_event))
    first = await doomed.wait_for("started")
    successor = await Worker.start("successor", "job", uri, database.name, "successor", str(ttl), "-1")
    successor_done = asyncio.create_task(successor.follow(on_event))
    await successor.wait_for("ready")
    await asyncio.sleep(ttl / 2)
    os.kill(doomed.process.pid, signal.SIGKILL)
    killed_at = time.time()
    await doomed_done
    store = LockStore(database[LOCKS], WriteConcern(w="majority"))
    lease = await store.read(JOB_LOCK)  # read after the kill: no renewal can follow it
    if lease is None or lease.expires_at is None:
        raise RuntimeError(f"{JOB_LOCK!r}: no lease on record after the kill")
    view.event(
        f"SIGKILLed doomed (pid {doomed.process.pid}) mid-job; its lease runs until {lease.expires_at:%H:%M:%S.%f} UTC"
    )
    second = await successor.wait_for("started")
    taken = await store.read(JOB_LOCK)
    await successor_done
    view.event(
        f"takeover {second['t'] - killed_at:.2f} s after the kill; "
        f"fencing tokens {first['fence']} -> {second['fence']} (+{second['fence'] - first['fence']})"
    )
    if taken is None or taken.acquired_at is None:
        raise RuntimeError(f"{JOB_LOCK!r}: no lease on record after the takeover")
    checks.record(
        view,
        "the successor took over only after the lease expired (server time)",
        taken.acquired_at >= lease.expires_at,
    )
    checks.record(view, "the successor's fencing token is higher", second["fence"] > first["fence"])


async def paused_holder(uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks) -> None:
    ttl = arguments.ttl
    view.section(f"4. Paused holder and fenced writes: the holder is stopped (SIGSTOP) past its TTL of {ttl:g} s")

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "held":
            view.event(f"{event['worker']} (pid {event['pid']}) holds {LEDGER_LOCK!r}, fencing token {event['fence']}")
        elif event["event"] == "posted":
            balance = "applied" if event["balance_applied"] else "refused (a newer token is stored)"
            view.event(
                f"{event['worker']} posts with token {event['fence']}: ledger transaction {event['transaction']}; "
                f"balance update {balance}"
            )

    # The stale holder waits 3 s after taking the lock before posting; it is stopped at once.
    stale = await Worker.start("paused", "ledger", uri, database.name, "paused", str(ttl), "3")
    stale_done = asyncio.create_task(stale.follow(on_event))
    await stale.wait_for("held")
    os.kill(stale.process.pid, signal.SIGSTOP)
    view.event(f"SIGSTOPped paused (pid {stale.process.pid}) before it could post: a GC pause, a frozen VM")
    await asyncio.sleep(ttl + 0.5)
    successor = await Worker.start("successor", "ledger", uri, database.name, "successor", str(ttl), "0")
    await successor.follow(on_event)
    os.kill(stale.process.pid, signal.SIGCONT)
    view.event(f"SIGCONT: paused resumes {ttl + 0.5:g} s later, believing for a moment that it holds the lock")
    await stale_done
    posted = {worker.name: next(e for e in worker.events if e["event"] == "posted") for worker in (stale, successor)}
    entries = await database[LEDGER].find({}, {"_id": 0, "worker": 1}).to_list(None)
    account = await database[ACCOUNTS].find_one({"_id": 42})
    view.event(f"ledger: {[entry['worker'] for entry in entries]}; account 42: {account}")
    checks.record(
        view,
        "the paused holder's transaction tied to the lease was refused (LockLostError)",
        posted["paused"]["transaction"] == "refused: LockLostError",
    )
    checks.record(
        view,
        "its token-checked balance update was refused: the successor's token is newer",
        posted["paused"]["balance_applied"] is False and posted["successor"]["fence"] > posted["paused"]["fence"],
    )
    checks.record(
        view,
        "the account shows only the new holder's posting",
        entries == [{"worker": "successor"}]
        and account is not None
        and account["balance"] == 100
        and account["fence"] == posted["successor"]["fence"],
    )


async def rate_limit(uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks) -> None:
    limit, calls = arguments.limit, 3
    workers, tasks = arguments.workers, arguments.tasks
    total = workers * tasks * calls
    view.section(
        f"5. Rate limit: {workers} processes x {tasks} exporters call a partner API that allows {limit} calls at "
        f"once (a semaphore of {limit} permits)"
    )
    await database[API].insert_one({"_id": "quota", "inflight": 0, "most": 0})
    done = 0
    fences: list[int] = []

    def on_event(event: dict[str, Any]) -> None:
        nonlocal done
        if event["event"] == "call":
            done += 1
            fences.append(event["fence"])
            view.progress("API calls", done, total)

    options = (str(tasks), str(limit), str(calls))
    exporters = [
        await Worker.start(f"exporter-{i + 1}", "export", uri, database.name, f"exporter-{i + 1}", *options)
        for i in range(workers)
    ]
    await asyncio.gather(*(worker.follow(on_event) for worker in exporters))
    quota = await database[API].find_one({"_id": "quota"}) or {}
    most = quota.get("most", 0)
    view.event(f"{done} calls; the API saw at most {most} at once")
    checks.record(view, f"the API never saw more than {limit} calls at once ({most})", 0 < most <= limit)
    distinct = len(set(fences))
    label = f"every call held its own permit ({distinct} distinct fencing tokens for {done} calls)"
    checks.record(view, label, done == total and distinct == done)


async def leader_failover(uri: str, database: Any, arguments: argparse.Namespace, view: View, checks: Checks) -> None:
    ttl = arguments.ttl
    view.section(
        f"6. Leader election: 3 scheduler replicas; the leader shuts down cleanly, then the next one is "
        f"SIGKILLed; TTL {ttl:g} s"
    )

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "leading":
            view.event(f"{event['worker']} (pid {event['pid']}) leads, term {event['term']}")
        elif event["event"] == "resigned":
            view.event(f"{event['worker']} shut down and resigned")

    replicas = [
        await Worker.start(f"replica-{i + 1}", "replica", uri, database.name, f"replica-{i + 1}", str(ttl))
        for i in range(3)
    ]
    following = [asyncio.create_task(replica.follow(on_event)) for replica in replicas]
    for replica in replicas:
        await replica.wait_for("ready")

    async def next_leader(excluding: list[Worker]) -> tuple[Worker, dict[str, Any]]:
        while True:
            for replica in replicas:
                if replica not in excluding and any(e["event"] == "leading" for e in replica.events):
                    return replica, await replica.wait_for("leading")
            await asyncio.sleep(0.02)

    store = LockStore(database[LOCKS], WriteConcern(w="majority"))
    first, first_leading = await next_leader([])
    before = await store.read(ELECTION)  # the leader's term lasts at least until this expiry
    if before is None or not before.permits:
        raise RuntimeError(f"{ELECTION!r}: no term on record while a replica leads")
    first.process.send_signal(signal.SIGTERM)
    asked_at = time.time()
    second, second_leading = await next_leader([first])
    handover = second_leading["t"] - asked_at
    view.event(f"{second.name} leads {handover * 1000:.0f} ms after {first.name} was asked to shut down")
    handed = await store.read(ELECTION)
    if handed is None or not handed.permits or handed.permits[0].acquired_at is None:
        raise RuntimeError(f"{ELECTION!r}: no term on record after the hand-over")
    checks.record(
        view,
        f"the clean shutdown handed leadership on at once ({handover * 1000:.0f} ms, not at expiry), in a higher term",
        handed.permits[0].acquired_at < before.permits[0].expires_at and second_leading["term"] > first_leading["term"],
    )
    os.kill(second.process.pid, signal.SIGKILL)
    killed_at = time.time()
    term = await store.read(ELECTION)  # read after the kill: no renewal can follow it
    if term is None or not term.permits:
        raise RuntimeError(f"{ELECTION!r}: no term on record after the kill")
    expires_at = term.permits[0].expires_at
    view.event(f"SIGKILLed {second.name} (pid {second.process.pid}); its term runs until {expires_at:%H:%M:%S.%f} UTC")
    third, third_leading = await next_leader([first, second])
    taken = await store.read(ELECTION)
    if taken is None or not taken.permits:
        raise RuntimeError(f"{ELECTION!r}: no term on record after the takeover")
    view.event(f"{third.name} leads {third_leading['t'] - killed_at:.2f} s after the kill")
    checks.record(
        view,
        "after the SIGKILL the last replica led only once the dead leader's term expired, in a higher term",
        taken.permits[0].acquired_at is not None
        and taken.permits[0].acquired_at >= expires_at
        and third_leading["term"] > second_leading["term"],
    )
    third.process.send_signal(signal.SIGTERM)
    await asyncio.gather(*following)


PERIOD, PERIODS = 6.0, 4
"""Seconds per period (three times the replicas' 2 s TTL: the killed run's lease expires, and
another replica's next firing runs the period again, within it), and the periods run."""


async def once_per_period(uri: str, database: Any, view: View, checks: Checks) -> None:
    view.section(
        f"7. Once per period: 3 replicas fire {DIGEST!r} (due every {PERIOD:g} s of the server's clock) four times "
        "a period; one period's run hangs and is SIGKILLed"
    )
    killed: dict[str, Any] = {}
    replicas: list[Worker] = []
    marked: list[asyncio.Task[Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        kind, worker, period = event["event"], event["worker"], event.get("period", 0)
        shown = f"period from {datetime.fromtimestamp(period / 1000, UTC):%H:%M:%S}"
        if kind == "started":
            view.event(f"{shown}: {worker} runs it (attempt {event['attempt']})")
            if not marked:  # the first run of the period after next will hang
                killed["period"] = hung = period + round(2 * PERIOD * 1000)
                marked.append(asyncio.create_task(database[HANG].insert_one({"period": hung, "attempt": 1})))
        elif kind == "hanging":
            replica = next(replica for replica in replicas if replica.name == worker)
            os.kill(replica.process.pid, signal.SIGKILL)
            killed.update(worker=worker, at=time.time())
            view.event(f"{shown}: {worker}'s run hangs: SIGKILLed its process, pid {replica.process.pid}")
        elif kind == "finished" and period == killed.get("period"):
            view.event(f"{shown}: {worker} finished it, {time.time() - killed['at']:.2f} s after the kill")

    for i in range(3):
        name = f"replica-{i + 1}"
        replicas.append(await Worker.start(name, "periodic", uri, database.name, name, str(PERIOD), str(PERIODS)))
    await asyncio.gather(*(replica.follow(on_event) for replica in replicas))
    await asyncio.gather(*marked)  # started by the first event, after the line above began
    digests = await database[DIGESTS].find().to_list(None)
    runs = Counter(digest["period"] for digest in digests)
    retried = [digest for digest in digests if digest["period"] == killed.get("period")]
    checks.record(
        view,
        f"every period's job ran to completion exactly once ({len(runs)} periods)",
        len(runs) >= PERIODS - 1 and all(count == 1 for count in runs.values()),
    )
    checks.record(
        view,
        "the killed run's period was run again, by another replica, as its second attempt",
        "worker" in killed
        and len(retried) == 1
        and retried[0]["attempt"] == 2
        and retried[0]["by"] != killed["worker"],
    )


async def deployment_check(uri: str, database: Any, view: View, checks: Checks) -> None:
    """``mongolock check`` (without ``--perf``) on the demo's server and lock collection."""
    from ..check.run import CheckOptions, Scratch, run_checks
    from ..check.verdicts import as_text, exit_code, summary

    options = CheckOptions(uri=uri, database=database.name, collection=LOCKS)
    view.section(
        f"8. mongolock check: is this deployment fit for the locks? (on {database.name}.{LOCKS}, for locks of "
        f"the default TTL of {options.ttl:g} s)"
    )
    scratch = Scratch()
    run = await run_checks(options, scratch)
    view.lines(as_text(run.checks))
    checks.record(
        view,
        f"mongolock check: {summary(run.checks)}; its {scratch.removed} scratch documents removed",
        exit_code(run.checks) == 0 and not scratch.left,
    )
