"""Token-checked writes: a MongoDB document takes a write only from a holder whose fencing token is
not older than the one stored on it, and records the writer's token, in one request.

```python
async with lock:
    result = await fenced_update_one(stock, {"_id": sku}, {"$inc": {"sold": 1}}, token=lock)
    if not result.applied:
        ...  # a newer holder wrote this document: our lease ended, whatever we believe
```

This protects a document even from a holder that does not know its lease ended (a process paused
past its TTL, a long GC pause, a partition): once a newer holder has written the document, the old
holder's writes no longer match. The check is per document; to protect several documents together,
use [`guard_transaction`][mongolock_async.AsyncMongoLock.guard_transaction] in a transaction.

The token is stored in the field ``fence`` (``field=`` to choose another). Tokens of one lock only go
up; every document protected this way should be written under one lock name, since tokens of two
names are not ordered with each other. A stored value that is not a number (or a number above the
token) refuses the write; a document without the field takes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo.errors import DuplicateKeyError

from ._core.lock import AsyncMongoLock
from .errors import LockNotOwnedError

__all__ = ["FencedWriteResult", "fenced_insert_one", "fenced_replace_one", "fenced_update_one"]

DEFAULT_FIELD = "fence"


@dataclass(frozen=True, slots=True)
class FencedWriteResult:
    """What a token-checked write did."""

    applied: bool
    """True if a document took the write (updated, replaced or inserted). False if none did: the
    document matching the filter holds a newer token, or (without upsert) no document matches."""
    upserted_id: Any = None
    """The ``_id`` of the document the write inserted, if it inserted one."""


async def fenced_update_one(
    collection: Any,
    filter: Mapping[str, Any],
    update: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    token: int | AsyncMongoLock,
    field: str = DEFAULT_FIELD,
    upsert: bool = False,
    session: Any = None,
) -> FencedWriteResult:
    """Apply ``update`` (update operators, or a pipeline) to one document matching ``filter`` whose
    stored token is at most ``token``, and store ``token`` on it. One ``update`` request.

    ``token`` is a fencing token or a lock handle (its current token;
    [`LockNotOwnedError`][mongolock_async.LockNotOwnedError], before any I/O, if it holds no live
    lease as far as this process knows). With ``upsert=True``, ``filter`` must select by ``_id``: a
    document holding a newer token then refuses the write (the insert collides with it) instead of a
    second document being inserted. ``TypeError`` or ``ValueError`` for bad arguments, before any
    I/O, among them an update that sets ``field``.
    """
    checked_token = _token(token)
    _check_field(field)
    _check_upsert(filter, upsert)
    fenced_update: Any
    if isinstance(update, Mapping):
        if not update or not all(key.startswith("$") for key in update):
            raise ValueError("update must be update operators ($set, $inc, ...) or a pipeline; use fenced_replace_one")
        for fields in update.values():
            if isinstance(fields, Mapping) and any(_touches(path, field) for path in fields):
                raise ValueError(f"the update must not write {field!r}: it holds the fencing token")
        fenced_update = {**update, "$set": {**update.get("$set", {}), field: checked_token}}
    elif isinstance(update, Sequence) and not isinstance(update, str | bytes):
        fenced_update = [*update, {"$set": {field: checked_token}}]
    else:
        raise TypeError(f"update must be a mapping of update operators or a pipeline, not {type(update).__name__}")
    fenced_filter = _fenced_filter(filter, field, checked_token)
    return await _write_one(
        lambda: collection.update_one(fenced_filter, fenced_update, upsert=upsert, session=session)
    )


async def fenced_replace_one(
    collection: Any,
    filter: Mapping[str, Any],
    replacement: Mapping[str, Any],
    *,
    token: int | AsyncMongoLock,
    field: str = DEFAULT_FIELD,
    upsert: bool = False,
    session: Any = None,
) -> FencedWriteResult:
    """Replace one document matching ``filter`` whose stored token is at most ``token`` by
    ``replacement`` with ``token`` stored in it. One ``update`` request; arguments and errors as
    [`fenced_update_one`][mongolock_async.fencing.fenced_update_one] (``replacement`` must not hold
    ``field`` nor update operators)."""
    checked_token = _token(token)
    _check_field(field)
    _check_upsert(filter, upsert)
    document = _replacement(replacement, field, checked_token)
    fenced_filter = _fenced_filter(filter, field, checked_token)
    return await _write_one(lambda: collection.replace_one(fenced_filter, document, upsert=upsert, session=session))


async def fenced_insert_one(
    collection: Any,
    document: Mapping[str, Any],
    *,
    token: int | AsyncMongoLock,
    field: str = DEFAULT_FIELD,
    session: Any = None,
) -> FencedWriteResult:
    """Insert ``document`` (which must have an ``_id``) with ``token`` stored in it; if a document
    with that ``_id`` exists, replace it only if its stored token is at most ``token``. One request.
    ``applied`` is False when the existing document holds a newer token."""
    if "_id" not in document:
        raise ValueError("fenced_insert_one needs the document's _id: the token is checked on the document with it")
    return await fenced_replace_one(
        collection, {"_id": document["_id"]}, document, token=token, field=field, upsert=True, session=session
    )


def _token(token: int | AsyncMongoLock) -> int:
    if isinstance(token, AsyncMongoLock):
        current = token.fencing_token
        if current is None:
            raise LockNotOwnedError(token.name, "this handle holds no live lease, so it has no token to write with")
        return current
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int fencing token or an AsyncMongoLock, not {type(token).__name__}")
    if not 0 <= token < 2**63:
        raise ValueError(f"token must be a fencing token (0 to 2**63 - 1), got {token}")
    return token


def _check_field(field: str) -> None:
    if not isinstance(field, str) or not field or field.startswith("$") or "." in field or field == "_id":
        raise ValueError(f"field must be a top-level field name (not _id, no '$' or '.'), got {field!r}")


def _check_upsert(filter: Mapping[str, Any], upsert: bool) -> None:
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a mapping, not {type(filter).__name__}")
    if upsert and "_id" not in filter:
        raise ValueError(
            "upsert=True needs a filter on _id: otherwise a document holding a newer token would not stop the "
            "write, and a second document would be inserted"
        )


def _touches(path: str, field: str) -> bool:
    return path == field or path.startswith(field + ".")


def _replacement(replacement: Mapping[str, Any], field: str, token: int) -> dict[str, Any]:
    if not isinstance(replacement, Mapping):
        raise TypeError(f"replacement must be a mapping, not {type(replacement).__name__}")
    if any(key.startswith("$") for key in replacement):
        raise ValueError("a replacement holds no update operators; use fenced_update_one")
    if field in replacement:
        raise ValueError(f"the replacement must not hold {field!r}: it holds the fencing token")
    return {**replacement, field: token}


def _fenced_filter(filter: Mapping[str, Any], field: str, token: int) -> dict[str, Any]:
    # {field: None} matches a missing field (and null); {"$lte": token} only numbers, so a stored
    # value of another type refuses the write (MongoDB compares across types only by type order,
    # and query operators like $lte match only values of the same type bracket).
    return {"$and": [dict(filter), {"$or": [{field: {"$lte": token}}, {field: None}]}]}


async def _write_one(send: Callable[[], Awaitable[Any]]) -> FencedWriteResult:
    """Send the write; on a duplicate key on ``_id``, send it once more before calling it refused.

    An upsert whose filter found no document inserts one, and a writer that loses the race to
    create that document gets a duplicate key error. MongoDB retries that error itself only when
    the filter is nothing but equality predicates (src/mongo/db/ops/write_ops_exec.cpp,
    ``shouldRetryDuplicateKeyException`` and ``matchContainsOnlyAndedEqualityNodes``); the fenced
    filter has an ``$or``, so the loser would be refused even when its token is the newer one. Sent
    again, the write finds the document that now exists: it matches, or its token truly refuses it.
    """
    try:
        result = await send()
    except DuplicateKeyError as error:
        _raise_unless_on_id(error)
        try:
            result = await send()
        except DuplicateKeyError as again:
            _raise_unless_on_id(again)
            return FencedWriteResult(applied=False)  # the document of that _id holds a newer token
    if result.upserted_id is not None:
        return FencedWriteResult(applied=True, upserted_id=result.upserted_id)
    return FencedWriteResult(applied=result.matched_count == 1)


def _raise_unless_on_id(error: DuplicateKeyError) -> None:
    pattern = (error.details or {}).get("keyPattern")
    if pattern is not None and set(pattern) != {"_id"}:
        raise error  # another unique index refused the document: not a question of tokens
