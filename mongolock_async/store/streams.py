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
    """Open a change stream of the writes that can end a wait: releases (of a lock, or of a
    semaphore's permit), deletions, and hand-offs to this process's places (whose owner tokens
    start with ``token_prefix``).

    Renewals, claims, queue updates, acquisitions and other processes' hand-offs are filtered out
    on the server, so a hand-off wakes only the process it goes to. Pipeline-style updates arrive as
    ``update`` events listing the changed fields, or as ``replace`` events where the server logs
    full documents (mongodb/mongo jstests/change_streams/pipeline_style_updates.js); replacements
    are all let through. Needs a replica set or a sharded cluster.
    """
    pipeline = [
        {
            "$match": {
                "$or": [
                    {"operationType": {"$nin": ["insert", "update", "replace"]}},
                    {"operationType": "update", "updateDescription.updatedFields.owner": {"$type": "null"}},
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
