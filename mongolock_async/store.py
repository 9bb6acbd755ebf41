"""Every MongoDB query the library sends, and nothing else.

One document per lock name::

    {_id: <name>, owner: <token> | null, expiresAt: <server date>, fence: <int64>, ttlMs: <int>,
     holder: {host, pid, label}, acquiredAt, renewedAt, releasedAt}

Time is always the server's: expiry is written and compared with ``$$NOW`` inside the query, never
with a client clock. ``$$NOW`` goes through ``{$toDate: {$toLong: "$$NOW"}}``, which is the identity
on MongoDB and works around an embedded test server that compares raw ``$$NOW`` with stored dates
wrongly.

Release clears ``owner`` instead of deleting the document, so ``fence`` survives. Fencing tokens are
``max(previous + 1, server clock in microseconds)``: the floor keeps them increasing even after an
idle document was purged and re-created (a purge needs at least one idle second, in which the floor
grows by a million).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pymongo import ReadPreference, ReturnDocument
from pymongo.errors import DuplicateKeyError
from pymongo.write_concern import WriteConcern

SERVER_NOW: dict[str, Any] = {"$toDate": {"$toLong": "$$NOW"}}
_EPOCH = datetime(1970, 1, 1)
_LEASE_IS_LIVE: dict[str, Any] = {"$gt": [{"$ifNull": ["$expiresAt", _EPOCH]}, SERVER_NOW]}
IDLE_CLEANUP_INDEX = "mongolock_idle_cleanup"
# Racing upserts of a new name can fail with a duplicate key; the retry then finds the document.
_UPSERT_RACE_RETRIES = 10
# How long a measurement of the server's clock is trusted for wait scheduling (never for safety).
_CLOCK_SAMPLE_TTL = 60.0


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock document as a waiter or an operator sees it."""

    name: str
    owner: str | None
    expires_at: datetime | None
    fencing_token: int
    ttl_ms: int | None
    holder: Mapping[str, Any]

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> LockState:
        return cls(
            name=doc["_id"],
            owner=doc.get("owner"),
            expires_at=doc.get("expiresAt"),
            fencing_token=int(doc.get("fence") or 0),
            ttl_ms=doc.get("ttlMs"),
            holder=doc.get("holder") or {},
        )


@dataclass(frozen=True, slots=True)
class LockReport:
    """A lock document with the server's view of its remaining lease, for operators."""

    state: LockState
    remaining_ms: int | None
    """Milliseconds until the lease expires on the server's clock; None when the lock is free."""
    acquired_at: datetime | None
    renewed_at: datetime | None
    released_at: datetime | None


class LockStore:
    """The lock collection, with the write concern and read preference the promises need.

    ``collection`` is a PyMongo ``AsyncCollection`` or a Motor collection: only the awaitable
    methods the two share are used.
    """

    def __init__(self, collection: Any, write_concern: WriteConcern) -> None:
        self._collection = collection.with_options(write_concern=write_concern, read_preference=ReadPreference.PRIMARY)
        self.full_name: str = collection.full_name
        # Leases that can be renewed together by one update_many share this key.
        self.group_key: tuple[int, str, str] = (
            id(collection.database.client),
            self.full_name,
            repr(write_concern.document),
        )
        self._clock_sample: tuple[datetime, float] | None = None

    async def try_acquire(self, name: str, owner: str, ttl_ms: int, holder: Mapping[str, Any]) -> LockState:
        """Take ``name`` for ``owner`` if it is free or expired; return the document either way.

        One round trip: an upserting ``findAndModify`` whose pipeline decides on the server.
        """
        take = "$_take"
        pipeline = [
            {
                "$set": {
                    "_take": {
                        "$or": [
                            {"$eq": [{"$ifNull": ["$owner", None]}, None]},
                            {"$not": [_LEASE_IS_LIVE]},
                        ]
                    }
                }
            },
            {
                "$set": {
                    "owner": {"$cond": [take, {"$literal": owner}, "$owner"]},
                    "expiresAt": {"$cond": [take, _server_now_plus(ttl_ms), "$expiresAt"]},
                    "fence": {
                        "$cond": [
                            take,
                            {
                                "$max": [
                                    {"$add": [{"$toLong": {"$ifNull": ["$fence", 0]}}, 1]},
                                    {"$multiply": [{"$toLong": "$$NOW"}, 1000]},
                                ]
                            },
                            "$fence",
                        ]
                    },
                    "ttlMs": {"$cond": [take, ttl_ms, "$ttlMs"]},
                    "holder": {"$cond": [take, {"$literal": dict(holder)}, "$holder"]},
                    "acquiredAt": {"$cond": [take, SERVER_NOW, "$acquiredAt"]},
                    "renewedAt": {"$cond": [take, SERVER_NOW, "$renewedAt"]},
                }
            },
            {"$unset": "_take"},
        ]
        for _ in range(_UPSERT_RACE_RETRIES):
            try:
                doc = await self._collection.find_one_and_update(
                    {"_id": name}, pipeline, upsert=True, return_document=ReturnDocument.AFTER
                )
            except DuplicateKeyError:
                continue
            if doc is not None:  # the embedded server may return None on the same race
                return LockState.from_document(doc)
        raise RuntimeError(f"acquire of {name!r} kept racing with concurrent upserts")

    async def release(self, name: str, owner: str) -> bool:
        """End ``owner``'s lease on ``name``; True only if it was still live."""
        result = await self._collection.update_one(
            _live_lease(name, owner),
            [{"$set": {"owner": None, "expiresAt": SERVER_NOW, "releasedAt": SERVER_NOW}}],
        )
        return bool(result.matched_count)

    async def extend(self, name: str, owner: str, ttl_ms: int) -> bool:
        """Give ``owner``'s live lease a new expiry ``ttl_ms`` from now; False if it is not live."""
        result = await self._collection.update_one(
            _live_lease(name, owner),
            [
                {
                    "$set": {
                        "expiresAt": _server_now_plus(ttl_ms),
                        "ttlMs": ttl_ms,
                        "renewedAt": SERVER_NOW,
                    }
                }
            ],
        )
        return bool(result.matched_count)

    async def renew_all(self, leases: Sequence[tuple[str, str]]) -> int:
        """Renew every live lease among ``(name, owner)`` pairs by its own ``ttlMs``.

        One ``update_many`` for all of them; returns how many matched. Owner tokens are unique per
        acquisition, so matching names and owners as two sets cannot renew a foreign lease.
        """
        result = await self._collection.update_many(
            _live_leases(leases),
            [
                {
                    "$set": {
                        "expiresAt": _server_now_plus("$ttlMs"),
                        "renewedAt": SERVER_NOW,
                    }
                }
            ],
        )
        return int(result.matched_count)

    async def live_owners(self, leases: Sequence[tuple[str, str]]) -> set[str]:
        """The owner tokens among ``leases`` whose lease is still live on the server."""
        cursor = self._collection.find(_live_leases(leases), {"owner": 1})
        return {doc["owner"] for doc in await cursor.to_list(None)}

    async def is_held(self, name: str) -> bool:
        """Whether anyone holds a live lease on ``name``."""
        doc = await self._collection.find_one(
            {"_id": name, "owner": {"$ne": None}, "$expr": _LEASE_IS_LIVE}, {"_id": 1}
        )
        return doc is not None

    async def is_held_by(self, name: str, owner: str) -> bool:
        """Whether ``owner`` holds a live lease on ``name``."""
        return await self._collection.find_one(_live_lease(name, owner), {"_id": 1}) is not None

    async def read(self, name: str) -> LockState | None:
        """The document for ``name`` as stored, or None if there is none."""
        doc = await self._collection.find_one({"_id": name})
        return None if doc is None else LockState.from_document(doc)

    async def report(self, names: Iterable[str] | None = None) -> list[LockReport]:
        """Lock documents (all, or those named) with their remaining lease on the server's clock."""
        match: dict[str, Any] = {} if names is None else {"_id": {"$in": list(names)}}
        pipeline = [
            {"$match": match},
            {"$sort": {"_id": 1}},
            {
                "$addFields": {
                    "_remainingMs": {
                        "$cond": [
                            {"$and": [{"$ne": [{"$ifNull": ["$owner", None]}, None]}, _LEASE_IS_LIVE]},
                            {"$subtract": ["$expiresAt", SERVER_NOW]},
                            None,
                        ]
                    }
                }
            },
        ]
        cursor = await _maybe_await(self._collection.aggregate(pipeline))
        return [
            LockReport(
                state=LockState.from_document(doc),
                remaining_ms=None if doc.get("_remainingMs") is None else int(doc["_remainingMs"]),
                acquired_at=doc.get("acquiredAt"),
                renewed_at=doc.get("renewedAt"),
                released_at=doc.get("releasedAt"),
            )
            for doc in await cursor.to_list(None)
        ]

    async def force_release(self, name: str) -> LockState | None:
        """Break whatever live lease ``name`` has, whoever owns it; return the lease that was broken."""
        doc = await self._collection.find_one_and_update(
            {"_id": name, "owner": {"$ne": None}, "$expr": _LEASE_IS_LIVE},
            [{"$set": {"owner": None, "expiresAt": SERVER_NOW, "releasedAt": SERVER_NOW}}],
            return_document=ReturnDocument.BEFORE,
        )
        return None if doc is None else LockState.from_document(doc)

    async def ensure_idle_cleanup_index(self, idle_after: int) -> str:
        """Create the TTL index that deletes lock documents idle for ``idle_after`` seconds."""
        name: str = await self._collection.create_index(
            "expiresAt", expireAfterSeconds=idle_after, name=IDLE_CLEANUP_INDEX
        )
        return name

    async def watch_releases(self) -> ReleaseStream:
        """Open a change stream of this collection's writes (needs a replica set or sharded cluster)."""
        # Renewals update only expiresAt/renewedAt; the server lets through only what can free a lock.
        pipeline = [
            {
                "$match": {
                    "$or": [
                        {"operationType": "delete"},
                        {"operationType": "update", "updateDescription.updatedFields.owner": {"$type": "null"}},
                        {"operationType": "replace", "fullDocument.owner": {"$type": "null"}},
                    ]
                }
            }
        ]
        return ReleaseStream(await _maybe_await(self._collection.watch(pipeline)))

    async def estimated_server_time(self) -> datetime | None:
        """The server's current time, estimated from a recent ``hello`` and the monotonic clock.

        Used only to decide how long a waiter sleeps, never to judge expiry. None if the server's
        ``hello`` reply carries no clock.
        """
        sample = self._clock_sample
        if sample is None or time.monotonic() - sample[1] > _CLOCK_SAMPLE_TTL:
            sent = time.monotonic()
            reply = await self._collection.database.client.admin.command("hello")
            received = time.monotonic()
            server_time = reply.get("localTime")
            if not isinstance(server_time, datetime):
                return None
            sample = (server_time.replace(tzinfo=None), (sent + received) / 2)
            self._clock_sample = sample
        return sample[0] + timedelta(seconds=time.monotonic() - sample[1])


class ReleaseStream:
    """A change stream on the lock collection that reports names whose lease was released."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def next_released(self) -> str:
        """The name of the next lock released or deleted by anyone."""
        while True:
            change = await self._stream.next()
            name = (change.get("documentKey") or {}).get("_id")
            if isinstance(name, str):
                return name

    async def close(self) -> None:
        await self._stream.close()


def _server_now_plus(ttl_ms: int | str) -> dict[str, Any]:
    return {"$dateAdd": {"startDate": SERVER_NOW, "unit": "millisecond", "amount": ttl_ms}}


def _live_lease(name: str, owner: str) -> dict[str, Any]:
    return {"_id": name, "owner": owner, "$expr": _LEASE_IS_LIVE}


def _live_leases(leases: Sequence[tuple[str, str]]) -> dict[str, Any]:
    return {
        "_id": {"$in": sorted({name for name, _ in leases})},
        "owner": {"$in": [owner for _, owner in leases]},
        "$expr": _LEASE_IS_LIVE,
    }


async def _maybe_await(value: Any) -> Any:
    # PyMongo's AsyncCollection.aggregate is a coroutine; Motor's returns a cursor directly.
    if hasattr(value, "__await__"):
        return await value
    return value
