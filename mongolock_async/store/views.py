"""The operators' live views (``mongolock watch``, the dashboard, ``LockWatch``): the change stream
of every write to the lock documents, the server's clock they time expiries on, whether the lock
collection exists, and how to tell a deployment without change streams (or a user without the
right to open one) from any other refusal.

Every query here reads; none writes, so the views work for a user with MongoDB's built-in ``read``
role (``find``, ``listCollections`` and ``changeStream``). What the views show of each document is
read with ``reports``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pymongo.errors import OperationFailure

from .._util.collection_types import AsyncClient, AsyncCollection
from .sending import maybe_await

CHANGE_STREAMS_UNSUPPORTED = (40573, 20)
"""Codes of a refused ``$changeStream`` where the deployment has no change streams: 40573 on a
standalone mongod (mongodb/mongo's jstests assert it as ``notReplicaSetErrorCode`` for
``{$changeStream: {}}`` and ``{$changeStream: {fullDocument: "updateLookup"}}`` alike), and 20
(IllegalOperation), which servers that have no oplog answer."""
UNAUTHORIZED = 13


async def collection_exists(collection: AsyncCollection) -> bool:
    """Whether ``collection`` exists (``listCollections`` on its database, by name)."""
    names = await collection.database.list_collection_names(filter={"name": collection.name})
    return collection.name in names


async def watch_every_write(reads: Any, *, prefix: str, max_await_ms: int) -> Any:
    """Open a change stream on ``reads`` (the collection with read concern majority) of every write
    to the lock documents whose name starts with ``prefix`` (every document for an empty prefix),
    each event with the document as it is now.

    ``fullDocument: "updateLookup"`` gives an update's event "the current majority-committed
    document or null if it no longer exists" (MongoDB's ``$changeStream`` reference): the viewer
    needs no read of its own per change, and a document deleted since shows as null (its delete
    event follows). Pipeline-style updates arrive as ``update`` events (the embedded server, and
    mongod where it can describe the change) or as ``replace`` events carrying the whole document
    (mongodb/mongo jstests/change_streams/pipeline_style_updates.js); both carry ``fullDocument``.
    Names are strings, so a range on ``documentKey._id`` selects the prefix (a range of one BSON
    type matches only that type: MongoDB's query comparison brackets types). Events other than
    writes to documents (``drop``, ``rename``, ``invalidate``) pass too: the viewer reads everything
    again on them. Needs a replica set or a sharded cluster (else ``OperationFailure`` with one of
    ``CHANGE_STREAMS_UNSUPPORTED``).
    """
    writes = ["insert", "update", "replace", "delete"]
    documents: dict[str, Any] = {"operationType": {"$in": writes}}
    if prefix:
        documents["documentKey._id"] = {"$gte": prefix, "$lt": prefix + "\U0010ffff"}
    pipeline = [{"$match": {"$or": [documents, {"operationType": {"$nin": writes}}]}}]
    stream = await maybe_await(reads.watch(pipeline, full_document="updateLookup", max_await_time_ms=max_await_ms))
    # PyMongo's stream is open once awaited; Motor's opens on first use, or on entering it: open now,
    # so that a read after this returns sees nothing the stream will not report.
    await stream.__aenter__()
    return stream


def change_streams_unsupported(error: BaseException) -> bool:
    """Whether ``error`` says this deployment has no change streams (a standalone server)."""
    return isinstance(error, OperationFailure) and error.code in CHANGE_STREAMS_UNSUPPORTED


def change_streams_refused(error: BaseException) -> bool:
    """Whether ``error`` says this user may not open a change stream (no ``changeStream`` action)."""
    return isinstance(error, OperationFailure) and error.code == UNAUTHORIZED


async def server_time(client: AsyncClient) -> datetime:
    """The server's clock now: ``hello``'s ``localTime`` (a read of nothing, allowed to every user;
    on a mongos, the mongos's clock, which is also the one its ``$$NOW`` reads)."""
    reply = await client.admin.command("hello")
    moment = reply.get("localTime")
    if not isinstance(moment, datetime):
        return datetime.now(UTC)  # a server that does not say: this machine's clock, for a view only
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
