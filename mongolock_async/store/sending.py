"""Sending requests and judging their failures: every request bounded and finished whatever
happens to its caller (``send``), the ``findAndModify`` of acquires and releases, the version check,
and which errors a retry may fix.

While the client knows no server to write to, a request still waiting after
``NO_SERVER_WARNING_AFTER`` seconds logs a warning saying so, once per client and outage: no silent
waits; and one cut off is reported as the driver reports a request it never sent: a server
selection timeout, with what its monitoring ran into.

A request whose cut can be lost (see ``_shield``: on Python 3.11, in a timed wait of the driver's)
carries the driver's own deadline as well, just after its bound, so that the driver ends it there by
itself: one sent while no server is known (server selection waits), and every request of a client
whose pool waits for a connection under a deadline (``timeoutMS`` or ``waitQueueTimeoutMS`` set).
Not the others: without a deadline, PyMongo waits for a pooled connection in a plain await
(``asyncio.wait_for`` with no timeout awaits directly), which loses no cancellation, and a deadline
would cost every request the driver's per-command bookkeeping (``benchmarks/client_cost.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from pymongo.errors import (
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
)
from pymongo.server_type import SERVER_TYPE
from pymongo.topology_description import TOPOLOGY_TYPE

from .._util.collection_types import AsyncClient, AsyncCollection
from .._util.diagnosis import cause_of, retrying_cannot_fix
from .._util.shield import DRIVER_DEADLINE_AFTER_CUT, RequestTimeout, run_shielded
from .._util.weak import WeakIdentityMap
from ..errors import ServerTooOldError
from .requests import Pipeline

logger = logging.getLogger("mongolock_async")
T = TypeVar("T")

# MongoDB 5.0 (wire version 13): the oldest release the library is tested and supported on.
_MIN_WIRE_VERSION = 13
_RELEASES = {6: "3.6", 7: "4.0", 8: "4.2", 9: "4.4"}
_WRITABLE = (SERVER_TYPE.RSPrimary, SERVER_TYPE.Mongos, SERVER_TYPE.Standalone)
_checked_clients: WeakIdentityMap[Any, bool] = WeakIdentityMap()
# Racing upserts of a new name can fail with a duplicate key; the retry then finds the document.
_UPSERT_RACE_RETRIES = 10
# What acquires and releases read back: the fields their callers decide on (less to send back,
# decode and check than the whole document).
DECIDING_FIELDS = {"owner": 1, "expiresAt": 1, "fence": 1, "queue": 1, "kind": 1, "limit": 1, "holders": 1, "job": 1}


async def send(
    client: AsyncClient,
    request: Coroutine[Any, Any, T],
    *,
    bound: float,
    waits: DriverWaits,
    on_cancelled: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """Run ``request`` (a request of ``client``, whose ``driver_waits`` are ``waits``) to completion
    within ``bound`` seconds, whatever happens to the caller (see ``run_shielded``); past the bound it
    raises ``RequestTimeout``, or a ``ServerSelectionTimeoutError`` while no server is known."""
    warning = None
    known = _writable_server_known(client)
    if not known and bound > NO_SERVER_WARNING_AFTER:
        loop = asyncio.get_running_loop()
        warning = loop.call_later(NO_SERVER_WARNING_AFTER, _warn_no_server, client, bound)
    # The driver's own deadline where a cut can be lost and the driver would wait on past the bound.
    driver_deadline = bound + DRIVER_DEADLINE_AFTER_CUT < (waits.server_known if known else waits.no_server)
    try:
        return await run_shielded(request, bound=bound, on_cancelled=on_cancelled, driver_deadline=driver_deadline)
    except PyMongoError as error:
        # Under the deadline given here, the driver's own timeout says what a cut says: no answer in time.
        if not isinstance(error, RequestTimeout) and not (driver_deadline and error.timeout):
            raise
        if _writable_server_known(client):
            if isinstance(error, RequestTimeout):
                raise
            raise RequestTimeout(f"MongoDB did not answer within {bound:.3g} s") from None
        # Still no server to send it to: what the driver itself reports as a server selection
        # timeout (a request it never sent), with what its monitoring ran into.
        cause = _what_the_servers_ran_into(client) or "no server answered"
        message = f"no MongoDB server to write to within {bound:.3g} s: {cause}"
        raise ServerSelectionTimeoutError(message) from None
    finally:
        if warning is not None:
            warning.cancel()


class DriverWaits(NamedTuple):
    """The longest the driver itself waits where a cut can be lost, in seconds: for a server (while
    none is known), and for a pooled connection (while one is; 0 where that wait is a plain await,
    which loses nothing). A request bounded shorter gets the driver's deadline, which replaces these
    limits: so it never lengthens one."""

    no_server: float
    server_known: float


def driver_waits(options: Any) -> DriverWaits:
    """The ``DriverWaits`` of a client's ``options`` (a client's options never change: a store
    reckons them once).

    ``timeoutMS`` is the driver's deadline for every operation, its wait for a server included
    (``get_server_selection_timeout``, pymongo/topology_shared.py). Without it, a server is waited
    for ``serverSelectionTimeoutMS``, and a pooled connection ``waitQueueTimeoutMS``, if set; if not,
    in a plain await (``_get_conn``, pymongo/asynchronous/pool.py: no deadline, no timeout).
    """
    if options.timeout:  # 0 means none, as in the driver
        return DriverWaits(options.timeout, options.timeout)
    selection = options.server_selection_timeout
    queue = options.pool_options.wait_queue_timeout
    # The deadline replaces serverSelectionTimeoutMS too, should the server be lost meanwhile.
    return DriverWaits(selection, 0.0 if queue is None else min(queue, selection))


async def check_server(client: AsyncClient, full_name: str) -> None:
    """Refuse a server older than MongoDB 5.0, once per client, with a clear error.

    Judged by the wire version each server announced to the driver's monitoring, after a ``ping``
    (a command every version knows; ``hello`` is unknown before 4.4.2) has made sure the server
    this client writes to is known.
    """
    if _checked_clients.get(client):
        return
    await client.admin.command("ping")
    description = client.topology_description
    # A load balancer hides the servers' versions; MongoDB supports load-balanced mode from 5.0.
    if description.topology_type != TOPOLOGY_TYPE.LoadBalanced:
        wire_version = oldest_wire_version(description.server_descriptions().values())
        if wire_version is not None and wire_version < _MIN_WIRE_VERSION:
            release = _RELEASES.get(wire_version)
            raise ServerTooOldError(
                f"mongolock-async needs MongoDB 5.0 or newer; the server at {full_name} speaks wire "
                f"version {wire_version}{f' (MongoDB {release})' if release else ''}, and 5.0 is "
                f"{_MIN_WIRE_VERSION}"
            )
    _checked_clients.setdefault(client, lambda: True)


async def find_and_modify(
    collection: AsyncCollection,
    command: dict[str, Any],
    codec_options: Any,
    *,
    session: Any = None,
) -> Mapping[str, Any] | None:
    """Send the ``findAndModify`` ``command`` (see ``find_and_modify_command``); the document after
    the write (its deciding fields), or None if nothing matched.

    Sent with ``database.command`` rather than ``find_one_and_update``: the collection method's
    retryable-write bookkeeping costs about a tenth of an acquire + release in client CPU, and adds
    nothing here, where every request is safe to send again with the same owner token (an acquire
    claims what an earlier copy took, a release recognises its own ``releasedOwner``). A plain
    command does not raise a write concern error by itself (``Database.command`` leaves
    ``writeConcernError`` in the reply), so this does.
    """
    reply = await collection.database.command(command, codec_options=codec_options, session=session)
    error = reply.get("writeConcernError")
    if error is not None:
        raise WriteConcernError(error.get("errmsg", "write concern error"), error.get("code"), reply)
    value: Mapping[str, Any] | None = reply.get("value")
    return value


def find_and_modify_command(
    collection_name: str,
    write_concern: Mapping[str, Any],
    query: Mapping[str, Any],
    pipeline: Pipeline,
    *,
    upsert: bool = False,
) -> dict[str, Any]:
    return {
        "findAndModify": collection_name,
        "query": query,
        "update": pipeline,
        "fields": DECIDING_FIELDS,
        "new": True,
        "upsert": upsert,
        "writeConcern": write_concern,
    }


async def upsert(
    collection: AsyncCollection, command: dict[str, Any], codec_options: Any, *, session: Any = None
) -> Mapping[str, Any]:
    """``find_and_modify`` of an upserting ``command``, sent again when racing upserts of a new
    name collide (a duplicate key on ``_id``)."""
    for _ in range(_UPSERT_RACE_RETRIES):
        try:
            doc = await find_and_modify(collection, command, codec_options, session=session)
        except DuplicateKeyError as error:
            if (error.details or {}).get("keyPattern", {"_id": 1}) != {"_id": 1}:
                raise  # another unique index of the user's: not the upsert race
            continue
        if doc is not None:  # the embedded server may return None on the same race
            return doc
    raise RuntimeError(f"acquire of {command['query']['_id']!r} kept racing with concurrent upserts")


def oldest_wire_version(servers: Iterable[Any]) -> int | None:
    """The lowest maximum wire version among the servers that take writes (a replica set's primary,
    every mongos, a standalone), from the driver's server descriptions; None if none is known."""
    versions = [server.max_wire_version for server in servers if server.server_type in _WRITABLE]
    return min(versions, default=None)


async def maybe_await(value: Any) -> Any:
    # PyMongo's async API returns coroutines where Motor returns cursors or sessions directly.
    if hasattr(value, "__await__"):
        return await value
    return value


NO_SERVER_WARNING_AFTER = 2.0
"""Seconds a request may wait for a server before a warning says so (no silent waits)."""


def _what_the_servers_ran_into(client: AsyncClient) -> str | None:
    """The cause of the last error the driver's monitoring recorded for any server, if any."""
    errors = [server.error for server in client.topology_description.server_descriptions().values()]
    seen = [error for error in errors if error is not None]
    return cause_of(*seen) if seen else None


_NO_SERVER_WARNING_INTERVAL = 10.0
_warned_no_server: WeakIdentityMap[Any, list[float]] = WeakIdentityMap()


def _warn_no_server(client: AsyncClient, bound: float) -> None:
    # Once per client and outage (every request of an acquire that retries would say it again).
    warned = _warned_no_server.setdefault(client, lambda: [-_NO_SERVER_WARNING_INTERVAL])
    now = time.monotonic()
    if now - warned[0] < _NO_SERVER_WARNING_INTERVAL:
        return
    warned[0] = now
    servers = client.topology_description.server_descriptions()
    # An SRV URI's host has no port until its lookup succeeds.
    hosts = ", ".join(host if port is None else f"{host}:{port}" for host, port in servers)
    cause = _what_the_servers_ran_into(client)
    seen = f": {cause}" if cause else ""
    waits = min(bound, client.options.server_selection_timeout)
    logger.warning(
        "no MongoDB server to write to has answered at %s for %.0f s%s; waiting up to %.0f s more",
        hosts or "the URI's hosts",
        NO_SERVER_WARNING_AFTER,
        seen,
        waits - NO_SERVER_WARNING_AFTER,
    )


_WRITABLE_OR_BALANCED = (*_WRITABLE, SERVER_TYPE.LoadBalancer)
_last_seen: WeakIdentityMap[Any, list[Any]] = WeakIdentityMap()


def _writable_server_known(client: AsyncClient) -> bool:
    """Whether the client's monitoring knows a server it can write to (cached per description: the
    driver replaces the immutable description object whenever something changes)."""
    description = client.topology_description
    seen = _last_seen.get(client) or _last_seen.setdefault(client, lambda: [None, False])
    if seen[0] is not description:
        servers = description.server_descriptions().values()
        seen[:] = [description, any(server.server_type in _WRITABLE_OR_BALANCED for server in servers)]
    return bool(seen[1])


def is_transient(error: PyMongoError) -> bool:
    """Whether ``error`` may pass when the request is sent again: network errors and timeouts,
    server selection, elections (NotWritablePrimary and kin), write-concern waits, and what the
    server labels retryable; not configuration that retrying cannot fix (a TLS certificate that
    does not verify, a missing client certificate, rejected credentials)."""
    return (
        isinstance(error, ConnectionFailure | WriteConcernError | ExecutionTimeout)
        or bool(getattr(error, "timeout", False))
        or error.has_error_label("RetryableWriteError")
    ) and not retrying_cannot_fix(error)
