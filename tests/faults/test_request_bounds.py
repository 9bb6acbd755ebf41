"""A request ends within its bound plus one round trip, even where the cancellation that cuts it is
lost inside the driver; and the driver's deadline that sees to it never lengthens the client's own.

On Python 3.11, PyMongo's timed waits run in ``asyncio.wait_for``, which returns normally when what
it waits for is ready in the loop iteration that cancels it (CPython gh-86296). The sweep: the
client's pool has one connection, held as another request would hold it, and an acquire request
waits for it; the connection is given back at a moment swept across the acquire's cut, and the loop
is then kept busy for 5 ms, as on a loaded machine (where an acquire was seen to give up 8.6 s late).
On 3.11, without the driver's deadline, a cut that fell after the connection came back and before
the woken request ran was lost when the client's pool waits under a deadline (``timeoutMS``,
``waitQueueTimeoutMS``): the request went on to send its command, which the fail point keeps on the
server for a second, and waited for the answer. A client with neither waits in a plain await, which
loses nothing.

The connection is held and given back through the pool itself (PyMongo's ``pool.checkout()``, as
its requests take one): a reply from the server comes back some milliseconds later or earlier from
run to run, and the moment to hit is a few loop iterations wide. PyMongo only: Motor runs a request
in a thread, and the cut cancels the future that thread completes, which loses nothing.

``MONGOLOCK_SWEEP_RUNS`` sets the cuts per client (default 40; ``make soak`` runs 200).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from pymongo.server_selectors import writable_server_selector
from pymongo.write_concern import WriteConcern

from mongolock_async.store import sending, store_for
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.fail_points import FaultServer, set_fail_point

HELD_MS = 1000
"""How long the fail point keeps the swept client's ``findAndModify`` on the server: a request whose
cut is lost waits that long for its answer."""
WAITING = 0.02
"""Each acquire's bound: time enough to be waiting for the pool's connection when it is cut."""
RUNS = int(os.environ.get("MONGOLOCK_SWEEP_RUNS", "40"))
BUSY = 0.005
"""How long the loop is kept busy once the connection is given back (seconds)."""
EARLIEST, LATEST = -2 * BUSY, 0.0
"""When the held connection is given back, in seconds from the acquire's cut (swept)."""

# How the pool waits for a connection: in a plain await by default (which loses nothing, and gets
# no deadline of ours); under a deadline with either option.
CLIENTS = {
    "default": {},
    "timeoutMS": {"timeoutMS": 10_000},
    "waitQueueTimeoutMS": {"waitQueueTimeoutMS": 10_000},
}


@dataclass(frozen=True)
class Cut:
    """One swept request: seconds from when the loop got to its cut (a busy loop gets there late) to
    its end and to the answer of a probe sent then (one round trip), from its cut to the connection
    coming back, and what the request raised ("answered" if nothing)."""

    ended: float
    connection_back: float
    round_trip: float
    outcome: str


# A pause of this process between a probe's answer and the request's end adds to the one, not the
# other: the margin is the allowance, about a round trip.
@pytest.mark.timing(margin=0.05)
@pytest.mark.parametrize("options", CLIENTS.values(), ids=CLIENTS.keys())
async def test_a_request_cut_while_it_waits_for_a_pooled_connection_ends_within_a_round_trip(
    fault_server: FaultServer, options: dict[str, Any]
) -> None:
    swept = fault_server.client("pymongo", maxPoolSize=1, **options)
    prober = fault_server.client("pymongo", app_name=f"{fault_server.app_name}-probe")
    try:
        collection = swept[TEST_DATABASE][fault_server.collection]
        probes = prober[TEST_DATABASE][fault_server.collection]
        store = store_for(collection, WriteConcern(w="majority"))
        await store.try_acquire("warm", uuid.uuid4().hex, 30_000, {}, bound=10.0)  # version check, connection
        await answered_at(probes)  # the probe's connection
        topology = await swept._get_topology()
        pool = (await topology.select_server(writable_server_selector, "test")).pool
        await set_fail_point(
            collection, "alwaysOn", failCommands=["findAndModify"], blockConnection=True, blockTimeMS=HELD_MS
        )
        cuts = [await cut_once(store, pool, probes, offset) for offset in offsets(RUNS)]
    finally:
        await close_client(swept)
        await close_client(prober)
    # One round trip: the slowest of the probes, each sent as its cut fell, so that a loaded
    # machine's stall around a cut lengthens the allowance as much as the request; plus the quickest,
    # for the order in which the loop finishes the request and a probe that waited out one stall.
    round_trips = sorted(cut.round_trip for cut in cuts)
    allowance = round_trips[-1] + round_trips[0]
    # The window a cut can be lost in: the connection came back, and the loop was still busy.
    in_the_window = [cut for cut in cuts if -BUSY < cut.connection_back <= 0]
    worst = max(cuts, key=lambda cut: cut.ended)
    print(
        f"\n{options or 'default'}: {len(cuts)} cuts, {len(in_the_window)} just after the connection came "
        f"back; latest end {worst.ended * 1000:.2f} ms after its cut ({worst.outcome}), median "
        f"{statistics.median(cut.ended for cut in cuts) * 1000:.2f} ms; round trips: slowest "
        f"{round_trips[-1] * 1000:.1f} ms, median {statistics.median(round_trips) * 1000:.1f} ms, quickest "
        f"{round_trips[0] * 1000:.1f} ms"
    )
    late = [cut for cut in cuts if cut.ended > allowance]
    assert not late, f"{len(late)} of {len(cuts)} requests ended more than a round trip after their cut: {late}"
    # Not a sweep that missed the moment the wait for the connection ends.
    assert len(in_the_window) >= len(cuts) // 8, f"only {len(in_the_window)} cuts in the window: {cuts}"


def offsets(runs: int) -> list[float]:
    """When the connection is given back in each run, from ``EARLIEST`` to ``LATEST`` after the cut."""
    return [EARLIEST + (LATEST - EARLIEST) * run / max(runs - 1, 1) for run in range(runs)]


async def cut_once(store: Any, pool: Any, probes: Any, offset: float) -> Cut:
    """Hold the pool's only connection, send an acquire meanwhile, and give the connection back
    ``offset`` seconds from the acquire's cut."""
    loop = asyncio.get_running_loop()
    held = pool.checkout()
    await held.__aenter__()

    async def give_back() -> float:
        await held.__aexit__(None, None, None)  # checks the connection in and wakes the waiting request
        back = loop.time()
        time.sleep(BUSY)  # noqa: ASYNC251 - the loop kept busy before the woken request runs
        return back

    cut_at = loop.time() + WAITING
    given: asyncio.Future[asyncio.Task[float]] = loop.create_future()
    loop.call_at(cut_at + offset, lambda: given.set_result(asyncio.create_task(give_back())))
    probe: asyncio.Future[tuple[float, asyncio.Task[float]]] = loop.create_future()
    loop.call_at(cut_at, lambda: probe.set_result((loop.time(), asyncio.create_task(answered_at(probes)))))
    try:
        await store.try_acquire(f"swept-{uuid.uuid4().hex}", uuid.uuid4().hex, 30_000, {}, bound=WAITING)
        outcome = "answered"
    except PyMongoError as error:
        outcome = type(error).__name__
    ended = loop.time()
    back = await (await given)
    cut_fell, probing = await probe
    return Cut(ended - cut_fell, back - cut_at, await probing - cut_fell, outcome)


async def answered_at(probes: Any) -> float:
    """Send one ``findAndModify`` with a majority write concern, as the acquire sends, from a client
    the fail point leaves alone; when its answer came (the loop's clock)."""
    await probes.database.command(
        {
            "findAndModify": probes.name,
            "query": {"_id": "probe"},
            "update": {"$inc": {"n": 1}},
            "upsert": True,
            "writeConcern": {"w": "majority"},
        }
    )
    return asyncio.get_running_loop().time()


@pytest.mark.timing(margin=1.4)  # within 2 s of the client's 0.5 s
async def test_a_request_keeps_the_clients_shorter_timeout_ms_while_no_server_is_known(mongolock_driver: str) -> None:
    # The driver's deadline given a request replaces the client's timeoutMS: given one of 3 s, this
    # request, which the client's own 0.5 s would end first, waited for a server for 3 s.
    client = make_client(mongolock_driver, "mongodb://127.0.0.1:1/", timeoutMS=500)  # nothing listens on port 1

    async def ping() -> Any:
        return await client[TEST_DATABASE].command("ping")

    try:
        started = time.monotonic()
        with pytest.raises(ServerSelectionTimeoutError):
            await sending.send(client, ping(), bound=3.0, waits=sending.driver_waits(client.options))
        took = time.monotonic() - started
    finally:
        await close_client(client)
    assert took < 2.0, f"{took:.1f} s: the client's timeoutMS is 0.5 s"
