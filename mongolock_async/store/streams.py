"""Change streams and sessions: how waiters learn of releases and hand-offs, how observers see an
election change, and the session whose ``operationTime`` a stream starts at."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

from .._util.collection_types import AsyncClient, AsyncCollection
from .sending import maybe_await


@contextlib.asynccontextmanager
async def session(client: AsyncClient) -> AsyncIterator[Any]:
    """A client session, to learn the ``operationTime`` of a request sent in it."""
    started = await maybe_await(client.start_session(causal_consistency=False))
    try:
        yield started
    finally:
        await maybe_await(started.end_session())


async def watch(collection: AsyncCollection, *, token_prefix: str, max_await_ms: int, start_at: Any = None) -> Any:
    """Open a change stream of the writes that can end a wait: hand-offs to this process's places
    (whose owner tokens start with ``token_prefix``), semaphore permits freed, deletions, and
    owners cleared by anything but a release of this library (an operator's forced release).

    A release of a lock hands the lease to the first live place in its queue in the same write
    (``mutex.release_pipeline``), and every waiter that was told the lock is held has a place there
    (stored by the attempt that was told so). A release that clears the owner (it also records
    ``releasedOwner``, a new token each time) therefore had no waiter of any other process to wake:
    it is filtered out, or every process with a stream open would be sent every release in the
    collection. The waiters it could concern see it otherwise: a place that expired unrefreshed is
    found gone by the heartbeat, an attempt in flight reads the document, one that failed in
    transit backs off and looks again. A forced release (``mutex.force_release_pipeline``) keeps
    the queue and writes no ``releasedOwner``: it is let through and wakes the first waiter.

    Renewals, claims, queue updates, acquisitions and other processes' hand-offs are filtered out
    on the server too, so a hand-off wakes only the process it goes to. On MongoDB an event the
    ``$match`` drops does not even end a waiting ``getMore`` early (jstests/change_streams/
    only_wake_getmore_for_relevant_changes.js); the embedded test server ends it with an empty batch.
    Pipeline-style updates arrive as ``update`` events listing the fields whose values changed
    (a diff of the document before and after: ``computeDocDiff`` in
    src/mongo/db/update/document_diff_calculator.cpp; a top-level string such as ``owner`` or
    ``releasedOwner`` is listed whole), or as ``replace`` events where the server logs full
    documents (mongodb/mongo jstests/change_streams/pipeline_style_updates.js); replacements are
    all let through. Needs a replica set or a sharded cluster.
    """
    pipeline = [
        {
            "$match": {
                "$or": [
                    {"operationType": {"$nin": ["insert", "update", "replace"]}},
                    {
                        "operationType": "update",
                        "updateDescription.updatedFields.owner": {"$type": "null"},
                        "updateDescription.updatedFields.releasedOwner": {"$exists": False},
                    },
                    # A semaphore's permit freed without a hand-off.
                    {"operationType": "update", "updateDescription.updatedFields.freed": {"$exists": True}},
                    {
                        "operationType": "update",
                        # One token, or (a read-write lock's readers) several separated by spaces.
                        "updateDescription.updatedFields.handedOffTo": {"$regex": f"(^| ){re.escape(token_prefix)}"},
                    },
                    {"operationType": "replace"},
                ]
            }
        }
    ]
    return await maybe_await(
        collection.watch(pipeline, max_await_time_ms=max_await_ms, start_at_operation_time=start_at)
    )


async def watch_name(collection: AsyncCollection, name: str, *, max_await_ms: int) -> Any:
    """Open a change stream of every write to ``name``'s document (its observers read the document
    again on each). Needs a replica set or a sharded cluster."""
    pipeline = [{"$match": {"documentKey._id": name}}]
    return await maybe_await(collection.watch(pipeline, max_await_time_ms=max_await_ms))
