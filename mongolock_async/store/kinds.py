"""Which queries serve each kind of lock document: ``KindQueries``, the protocol both kinds'
queries implement (a lock's, ``MutexQueries``; a document of permits', ``PermitQueries``: a
semaphore's, a read-write lock's or an election's), ``queries_for`` that picks them, and the
check that a document is of the kind asked for (``of_kind``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from ..errors import LockDataError
from . import expressions, mutex, permit_release, permits
from .documents import JOB_KIND, LockState
from .expressions import LEASE_LIVE
from .requests import Expression, Filter, Permits, Pipeline, PlaceRequest

# Every filter here starts from an equality on ``_id`` (the name), so MongoDB answers each request
# from the ``_id`` index whatever the collection's size (mongodb/mongo, recent revisions):
# - ``_id`` alone (acquire, withdrawal: ``LockStore``): ``isSimpleIdQuery``
#   (src/mongo/db/query/query_utils.cpp) holds, ``ParsedUpdateBase::parseQuery``
#   (src/mongo/db/query/write_ops/parsed_update_base.cpp) skips canonicalising it, and
#   ``getExecutorUpdate`` (src/mongo/db/query/get_executor.cpp) runs it without planning, through
#   ``InternalPlanner::updateWithIdHack`` (an ``IDHackStage``) for an upsert; a ``findAndModify``
#   that returns ``fields`` is canonicalised and still gets an ``IDHackStage`` from
#   ``ClassicPrepareExecutionHelper::buildIdHackPlan`` (same file; ``isIdHackEligibleQuery``).
# - ``_id`` with more predicates (the owner, an ``$or`` of owner fields, ``$elemMatch``): planned;
#   ``QueryPlannerIXSelect::rateIndices`` (src/mongo/db/query/planner_ixselect.cpp) tags the
#   equality with the ``_id`` index, and ``QueryPlanner::plan`` (src/mongo/db/query/query_planner.cpp)
#   adds a collection scan only when no index applies; the other predicates filter the one document.
# - The update being a pipeline changes none of it: ``ParsedUpdateBase::parseUpdate`` parses it
#   apart from the query. tests/handles/test_request_shapes.py checks every request we send keeps this rule.


class KindQueries(Protocol):
    """The queries ``LockStore`` sends for one kind of document: each returns what to send (a
    pipeline, or a filter and a pipeline or an expression), never sends it."""

    @property
    def kind(self) -> str:
        """The ``kind`` stored in the document (``lock`` for a lock's)."""
        ...

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> Pipeline:
        """The pipeline that gives ``place`` the lease (or a permit) if it is free and its turn,
        else queues it (with ``enqueue``); used with an ``_id`` filter and ``upsert``."""
        ...

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[Filter, Pipeline]:
        """The filter and pipeline of ``owner``'s release (see ``LockStore.release``)."""
        ...

    def leave(self, tokens: Sequence[str], *, fair: bool) -> Pipeline:
        """The pipeline that takes the places of ``tokens`` out of the line (waiters that gave up)."""
        ...

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[Filter, Pipeline]:
        """The filter and update that renew ``owner``'s live lease on ``name``."""
        ...

    def guard(self, name: str, owner: str, fence: int) -> tuple[Filter, Expression]:
        """The filter of ``owner``'s lease with its fencing token, and whether it is live."""
        ...

    def held(self, name: str, owner: str | None) -> tuple[Filter, Expression]:
        """The match of ``name``'s document held (by ``owner``), and whether its lease is live."""
        ...


class MutexQueries:
    """The queries of a lock's document (see ``KindQueries``)."""

    kind = "lock"

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> Pipeline:
        return mutex.acquire_pipeline(place, enqueue=enqueue, fair=fair)

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[Filter, Pipeline]:
        """The filter and pipeline of ``owner``'s release (see ``LockStore.release``)."""
        query = {"_id": name, "$or": [{"owner": owner}, {"releasedOwner": owner}, {"recentReleases.o": owner}]}
        return query, mutex.release_pipeline(owner, successor, fair=fair, successor_first=successor_first)

    def leave(self, tokens: Sequence[str], *, fair: bool) -> Pipeline:
        return mutex.release_pipeline(None, None, fair=fair, successor_first=False, leaving=tokens)

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[Filter, Pipeline]:
        """The filter and update that renew ``owner``'s live lease on ``name``."""
        return {"_id": name, "owner": owner}, mutex.renewal_pipeline(ttl_ms, stamp)

    def guard(self, name: str, owner: str, fence: int) -> tuple[Filter, Expression]:
        """The filter of ``owner``'s lease with its fencing token, and whether it is live."""
        return {"_id": name, "owner": owner, "fence": fence}, LEASE_LIVE

    def held(self, name: str, owner: str | None) -> tuple[Filter, Expression]:
        """The match of ``name``'s document held (by ``owner``), and whether its lease is live."""
        return {"_id": name, "owner": {"$type": "string"} if owner is None else owner}, LEASE_LIVE


class PermitQueries:
    """The queries of a document of permits, for what ``permits`` asks (one of its permits, or a
    writer's whole limit); see ``KindQueries``."""

    def __init__(self, permits: Permits) -> None:
        self.permits = permits
        self.kind = permits.kind

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> Pipeline:
        return permits.acquire_pipeline(place, self.permits, enqueue=enqueue, fair=fair)

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[Filter, Pipeline]:
        query = {"_id": name, "$or": [{"holders.o": owner}, {"releasedOwners": owner}]}
        pipeline = permit_release.release_pipeline(
            owner, successor, self.permits, fair=fair, successor_first=successor_first
        )
        return query, pipeline

    def leave(self, tokens: Sequence[str], *, fair: bool) -> Pipeline:
        return permit_release.release_pipeline(
            None, None, self.permits, fair=fair, successor_first=False, leaving=tokens
        )

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[Filter, Pipeline]:
        return {"_id": name, "kind": self.kind, "holders.o": owner}, permits.renewal_pipeline(owner, ttl_ms, stamp)

    def guard(self, name: str, owner: str, fence: int) -> tuple[Filter, Expression]:
        mine = {"$and": [{"$eq": ["$$this.o", owner]}, {"$eq": ["$$this.fence", fence]}]}
        holders = permits.live_holders(expressions.SERVER_NOW)
        live = {"$gt": [{"$size": {"$filter": {"input": holders, "cond": mine}}}, 0]}
        return {"_id": name, "holders": {"$elemMatch": {"o": owner, "fence": fence}}}, live

    def held(self, name: str, owner: str | None) -> tuple[Filter, Expression]:
        """With ``owner``: whether it holds a live permit; without: whether the live holders leave
        no room for a permit of this weight (as ``asyncio.Semaphore.locked``)."""
        match: Filter = {"_id": name, "kind": self.kind}
        holders = permits.live_holders(expressions.SERVER_NOW)
        if owner is None:
            limit = {"$ifNull": ["$limit", self.permits.limit]}
            return match, {"$gt": [{"$add": [permits.weight_of(holders), self.permits.weight]}, limit]}
        match["holders.o"] = owner
        return match, {"$in": [owner, permits.holder_tokens(holders)]}

    def put_first(self, name: str, owner: str, label: str) -> tuple[Filter, Pipeline]:
        return permits.put_first_pipeline(self.kind, name, owner, label)


_MUTEX: KindQueries = MutexQueries()


def queries_for(permits: Permits | None) -> KindQueries:
    """The queries of the kind of document ``permits`` asks of: a lock's without, else a semaphore's,
    a read-write lock's or an election's."""
    return _MUTEX if permits is None else _permit_queries(permits)


@functools.cache
def _permit_queries(permits: Permits) -> KindQueries:
    return PermitQueries(permits)


_KIND_NAMES = {
    "lock": "a lock",
    "semaphore": "a semaphore",
    "rwlock": "a read-write lock",
    "election": "an election",
    JOB_KIND: "a job",
}


def of_kind(state: LockState, permits: Permits | None, *, kind: str | None = None) -> LockState:
    """``state``, if it is of the kind the caller asked for: ``kind``, else a lock without
    ``permits``, else the permits' kind."""
    wanted_kind = kind or ("lock" if permits is None else permits.kind)
    if state.kind != wanted_kind:
        kind, wanted = _KIND_NAMES.get(state.kind, state.kind), _KIND_NAMES[wanted_kind]
        detail = f"says this name is {kind}, not {wanted}"
        raise LockDataError(state.name, "kind", detail, "a name is of one kind: use another name")
    return state
