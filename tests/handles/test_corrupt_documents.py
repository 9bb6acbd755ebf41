"""Hostile or corrupted lock documents (edited by hand, written by something else): refused with a
clear error naming the field, never written over, reported to operators and repairable; malformed
queue places are ignored."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
import pytest
from bson import DatetimeMS, Int64, MaxKey, Timestamp
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoLock,
    LockDataError,
)
from mongolock_async.store import LockStore
from mongolock_async.store.documents import LockState

CORRUPT: list[tuple[dict[str, Any], str]] = [
    ({"fence": "12"}, "fence"),
    ({"fence": 1.5}, "fence"),
    ({"fence": math.nan}, "fence"),
    ({"fence": -1}, "fence"),
    ({"fence": Int64(2**63 - 1)}, "fence"),
    ({"owner": 42, "expiresAt": datetime(2030, 1, 1)}, "owner"),
    ({"owner": {"$gt": ""}, "expiresAt": datetime(2030, 1, 1)}, "owner"),
    ({"owner": "someone", "expiresAt": "tomorrow"}, "expiresAt"),
    ({"owner": "someone", "expiresAt": Timestamp(2**31 - 1, 1)}, "expiresAt"),
    ({"owner": "someone", "expiresAt": MaxKey()}, "expiresAt"),
    ({"owner": "someone", "expiresAt": datetime(9999, 12, 31)}, "expiresAt"),
    ({"owner": "someone"}, "expiresAt"),
    ({"queue": "everyone"}, "queue"),
]


@pytest.mark.timing(margin=4.5)  # the neighbour's 5 s lease live until released
@pytest.mark.parametrize(("fields", "field"), CORRUPT, ids=[f"{field}-{i}" for i, (_, field) in enumerate(CORRUPT)])
async def test_a_corrupt_document_is_refused_with_a_clear_error(
    mongolock_collection: Any, fields: dict[str, Any], field: str
) -> None:
    await mongolock_collection.insert_one({"_id": "edited", **fields})
    before = await mongolock_collection.find_one({"_id": "edited"})
    lock = AsyncMongoLock(mongolock_collection, "edited", ttl=5.0)
    for blocking in (False, True):
        with pytest.raises(LockDataError, match=f"'edited'.*{field}") as raised:
            await lock.acquire(blocking=blocking, timeout=1.0 if blocking else None)
        assert raised.value.name == "edited" and raised.value.field == field
    after = await mongolock_collection.find_one({"_id": "edited"})
    assert bson.encode(after) == bson.encode(before), "the corrupt document was written"
    assert lock.fencing_token is None
    # Operators see it without the other locks disappearing, and can reset it.
    neighbour = AsyncMongoLock(mongolock_collection, "neighbour", ttl=5.0)
    assert await neighbour.acquire()
    operator = LockStore(mongolock_collection, WriteConcern(w="majority"))
    reports = {report.name: report for report in await operator.report()}
    assert reports["edited"].error is not None and reports["edited"].state is None
    assert reports["neighbour"].remaining_ms is not None
    assert await operator.force_release("edited") is not None
    assert await lock.acquire(blocking=False), "the repaired lock can be taken"
    assert await lock.release() and await neighbour.release()


def test_a_date_beyond_pythons_range_is_reported_as_corrupt() -> None:
    # The store decodes dates with DATETIME_AUTO, so one beyond year 9999 arrives as DatetimeMS.
    # (The embedded server cannot hold such a document itself; MongoDB can.)
    with pytest.raises(LockDataError, match="expiresAt"):
        LockState.from_document({"_id": "edited", "owner": "someone", "expiresAt": DatetimeMS(2**62)})


@pytest.mark.parametrize(("fields", "field"), CORRUPT, ids=[f"{field}-{i}" for i, (_, field) in enumerate(CORRUPT)])
def test_a_reply_is_checked_as_strictly_as_a_stored_document(fields: dict[str, Any], field: str) -> None:
    # Acquires and releases parse their reply with from_reply, which skips the operators' fields.
    for parse in (LockState.from_document, LockState.from_reply):
        with pytest.raises(LockDataError) as raised:
            parse({"_id": "edited", **fields})
        assert raised.value.field == field, parse


def test_a_reply_reads_every_deciding_field_as_a_stored_document_does() -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    place = {"t": "p", "ttlMs": 5000, "exp": soon, "at": soon, "holder": {"host": "h"}}
    permit = {"o": "a", "fence": 3, "exp": soon, "ttlMs": 5000, "at": soon}
    documents = [
        {"_id": "lock", "owner": "me", "expiresAt": soon, "fence": 7, "queue": [place, "junk"]},
        {"_id": "free", "owner": None, "fence": 2, "queue": []},
        {"_id": "sem", "kind": "semaphore", "limit": 2, "holders": [permit], "fence": 3, "queue": [place]},
        {"_id": "job", "fence": 1, "kind": "job", "job": {"lastSuccess": soon}},
    ]
    for document in documents:
        stored = LockState.from_document({**document, "holder": {"host": "h"}, "ttlMs": 5000, "acquiredAt": soon})
        reply = LockState.from_reply(document)
        assert stored.holder and stored.ttl_ms == 5000 and stored.acquired_at == soon
        assert reply == stored._replace(holder={}, ttl_ms=None, acquired_at=None), document["_id"]


async def test_malformed_queue_places_are_ignored(mongolock_collection: Any) -> None:
    malformed = [{"t": 5}, "junk", {"t": "x", "exp": "soon", "ttlMs": 1}]
    await mongolock_collection.insert_one({"_id": "q", "queue": malformed})
    lock = AsyncMongoLock(mongolock_collection, "q", ttl=5.0, fair=True)
    assert await lock.acquire(blocking=False), "malformed places do not count as waiters"
    assert await lock.release()
