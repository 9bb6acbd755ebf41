"""What ``mongolock check`` reads of a replica set's health and of the lock collection's options,
at the depth of ``rs.status()``, ``rs.conf()`` and ``rs.printReplicationInfo()``.

Each is a read. The replica set's commands need MongoDB's ``clusterMonitor`` role
(``replSetGetStatus`` and ``replSetGetConfig`` on the cluster, ``find`` and ``collStats`` on
``local.oplog.rs``); a refusal raises ``OperationFailure`` for the caller to report as not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bson import Timestamp
from pymongo.errors import PyMongoError

from .._util.collection_types import AsyncClient
from .sending import maybe_await


@dataclass(frozen=True, slots=True)
class OplogSpan:
    """The oplog of the member the client reads from: its first and last entries' times, and how
    full it is (``used_bytes`` of ``max_bytes``; None where its size could not be read)."""

    first: datetime
    last: datetime
    used_bytes: int | None = None
    max_bytes: int | None = None


async def replica_set_status(client: AsyncClient) -> dict[str, Any]:
    """``replSetGetStatus``: ``members`` (``name``, ``health``, ``stateStr``, ``optimeDate``,
    ``self``), ``writeMajorityCount`` (4.4+), ``heartbeatIntervalMillis``, and on a primary that
    won an election ``electionCandidateMetrics`` (with ``electionTimeoutMillis``)."""
    reply: dict[str, Any] = await client.admin.command("replSetGetStatus")
    return reply


async def replica_set_config(client: AsyncClient) -> dict[str, Any]:
    """``replSetGetConfig``'s ``config``: ``members`` (``arbiterOnly``, ``votes``, ``priority``),
    ``settings`` (``electionTimeoutMillis``, ``heartbeatIntervalMillis``, ``catchUpTimeoutMillis``)
    and ``writeConcernMajorityJournalDefault``."""
    reply = await client.admin.command("replSetGetConfig")
    config: dict[str, Any] = reply.get("config") or {}
    return config


async def oplog_span(client: AsyncClient) -> OplogSpan | None:
    """The oplog's first and last entries in natural (insertion) order, as
    ``db.getReplicationInfo()`` reads them (mongosh's ``getReplicationInfo``:
    ``find().sort({$natural: 1}).limit(1)`` and ``{$natural: -1}``, no index needed), and its size
    from ``$collStats`` where that is allowed and supported. None if the oplog holds nothing."""
    oplog = client.local["oplog.rs"]
    ends = []
    for direction in (1, -1):
        cursor = oplog.find({}, {"ts": 1, "wall": 1}).sort("$natural", direction).limit(1)
        found = await cursor.to_list(1)
        if not found:
            return None
        ends.append(_entry_time(found[0]))
    used = maximum = None
    try:
        stats = await (await maybe_await(oplog.aggregate([{"$collStats": {"storageStats": {}}}]))).to_list(1)
    except PyMongoError:  # refused or unsupported: the span is still known, its fullness not
        stats = []
    if stats:
        storage = stats[0].get("storageStats") or {}
        used, maximum = _integer(storage.get("size")), _integer(storage.get("maxSize"))
    return OplogSpan(ends[0], ends[1], used, maximum)


async def collection_options(database: Any, name: str) -> dict[str, Any] | None:
    """The lock collection's ``listCollections`` entry (``type`` and ``options``: ``collation``,
    ``validator``, ``capped``...), or None if it does not exist."""
    cursor = await maybe_await(database.list_collections(filter={"name": name}))
    entries = await cursor.to_list(None)
    return dict(entries[0]) if entries else None


def _entry_time(entry: dict[str, Any]) -> datetime:
    # ``wall`` (a date, 4.0+) where the entry has it, else the seconds of its ``ts`` timestamp.
    wall = entry.get("wall")
    if isinstance(wall, datetime):
        return wall if wall.tzinfo is not None else wall.replace(tzinfo=UTC)
    stamp = entry.get("ts")
    seconds = stamp.time if isinstance(stamp, Timestamp) else 0
    return datetime.fromtimestamp(seconds, UTC)


def _integer(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
