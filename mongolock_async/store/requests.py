"""What a request asks of a lock document (a place in a queue, a permit, a renewal) and the shapes of
what is sent for it (filters, stages, pipelines). Imports nothing from the rest of the store, so
that every query module can use these and ``kinds`` can pick among the query modules."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import bson
from bson.raw_bson import RawBSONDocument

Expression = Any
"""An aggregation expression: a field path (``"$owner"``), a literal, or an operator document."""
Stage = Mapping[str, Any]
"""One stage of an update pipeline (``{"$set": {...}}``): a dict, or one encoded already (see
``encoded_once``)."""
Pipeline = list[Stage]
"""An update pipeline: the stages one ``findAndModify`` or ``update`` applies, in order."""
Filter = dict[str, Any]
"""A query filter: which document a request matches (always by ``_id`` on the hot path)."""


def encoded_once(build: Callable[..., tuple[Stage, ...]]) -> functools._lru_cache_wrapper[tuple[Stage, ...]]:
    """``build`` (the fixed stages of a pipeline, by its shape's keyword arguments) cached per shape,
    its stages encoded to BSON once: as ``RawBSONDocument``, whose bytes the driver copies into the
    command as they are (``write_raw_doc``, bson/_cbsonmodule.c). Else every request encodes them
    again, 5 to 6 KB a request: 53 us of an acquire and release's client CPU in a tight loop here,
    7 us with them encoded once; among the driver's own work, the store's two requests went from
    1.12-1.15x of a raw replay's CPU to 0.97-0.98x (benchmarks/README.md). The bytes are those the
    driver would write: the stages hold only strings, numbers, booleans, null, arrays and
    documents, which no codec option encodes differently."""

    @functools.cache
    @functools.wraps(build)
    def encoded(**shape: Any) -> tuple[Stage, ...]:
        return tuple(RawBSONDocument(bson.encode(stage)) for stage in build(**shape))

    return encoded


class PlaceRequest(NamedTuple):
    """What a waiting process asks to be handed: its token, the lease length and who it is.

    ``follower`` is the place for the process's next waiting task: whichever write gives this
    place the lease queues the follower last in the same write, so the process stays in line
    without another request.
    """

    token: str
    ttl_ms: int
    holder: Mapping[str, Any]
    follower: PlaceRequest | None = None
    weight: int = 1
    """What the place asks for of a semaphore's or read-write lock's limit (see ``Permits``)."""
    keep_expiry: bool = False
    """Claim a lease (a permit) handed to the place, or taken for it, without moving its expiry:
    the place's last request went unanswered, and took or claimed it perhaps. A claim that
    restarted the expiry, cut off in turn, would keep a lease nobody hears of alive; one after
    another (each next waiter's, each cut off by its patience), for as long as they came. The
    claimer counts the lease from the unanswered request's send time instead (its expiry is
    later than that plus the TTL)."""


class Permits(NamedTuple):
    """What a request for a permit is for: a semaphore's (``kind`` "semaphore", one permit of
    ``limit``), a read-write lock's (``kind`` "rwlock": a reader weighs 1, a writer the whole
    ``limit``) or an election's leadership (``kind`` "election", the one permit of a limit of 1).
    Holders' weights add up to at most ``limit``."""

    kind: str
    limit: int
    weight: int = 1


class Renewal(NamedTuple):
    """A lease (or a permit, with ``permits``) for ``LockStore.renew`` to renew for ``ttl_ms``."""

    name: str
    owner: str
    ttl_ms: int
    permits: Permits | None = None
