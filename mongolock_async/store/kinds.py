"""The kinds of lock document and what a request asks of them: a place in a queue, a permit, a
renewal; which queries serve a kind (``queries_for``: a lock's, or a document of permits', with the
same methods), and the check that a document is of the kind asked for (``of_kind``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..documents import JOB_KIND, LockState
from ..errors import LockDataError
from . import expressions, mutex, permit_release, permits
from .expressions import _LEASE_LIVE


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


class MutexQueries:
    """The queries of a lock's document, as ``kinds.queries_for`` hands them out (the permits' have
    the same methods)."""

    kind = "lock"

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> list[dict[str, Any]]:
        return mutex.acquire_pipeline(place, enqueue=enqueue, fair=fair)

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The filter and pipeline of ``owner``'s release (see ``LockStore.release``)."""
        query = {"_id": name, "$or": [{"owner": owner}, {"releasedOwner": owner}, {"recentReleases.o": owner}]}
        return query, mutex.release_pipeline(owner, successor, fair=fair, successor_first=successor_first)

    def leave(self, tokens: Sequence[str], *, fair: bool) -> list[dict[str, Any]]:
        return mutex.release_pipeline(None, None, fair=fair, successor_first=False, leaving=tokens)

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The filter and update that renew ``owner``'s live lease on ``name``."""
        return {"_id": name, "owner": owner}, mutex._renewal(ttl_ms, stamp)

    def guard(self, name: str, owner: str, fence: int) -> tuple[dict[str, Any], Any]:
        """The filter of ``owner``'s lease with its fencing token, and whether it is live."""
        return {"_id": name, "owner": owner, "fence": fence}, _LEASE_LIVE

    def held(self, name: str, owner: str | None) -> tuple[dict[str, Any], Any]:
        """The match of ``name``'s document held (by ``owner``), and whether its lease is live."""
        return {"_id": name, "owner": {"$type": "string"} if owner is None else owner}, _LEASE_LIVE


class PermitQueries:
    """The queries of a document of permits, for what ``permits`` asks (one of its permits, or a
    writer's whole limit): the same methods as ``mutex.MutexQueries``."""

    def __init__(self, permits: Permits) -> None:
        self.permits = permits
        self.kind = permits.kind

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> list[dict[str, Any]]:
        return permits.acquire_pipeline(place, self.permits, enqueue=enqueue, fair=fair)

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        query = {"_id": name, "$or": [{"holders.o": owner}, {"releasedOwners": owner}]}
        pipeline = permit_release.release_pipeline(
            owner, successor, self.permits, fair=fair, successor_first=successor_first
        )
        return query, pipeline

    def leave(self, tokens: Sequence[str], *, fair: bool) -> list[dict[str, Any]]:
        return permit_release.release_pipeline(
            None, None, self.permits, fair=fair, successor_first=False, leaving=tokens
        )

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return {"_id": name, "kind": self.kind, "holders.o": owner}, permits._permit_renewal(owner, ttl_ms, stamp)

    def guard(self, name: str, owner: str, fence: int) -> tuple[dict[str, Any], Any]:
        mine = {"$and": [{"$eq": ["$$this.o", owner]}, {"$eq": ["$$this.fence", fence]}]}
        holders = permits._live_holders(expressions.SERVER_NOW)
        live = {"$gt": [{"$size": {"$filter": {"input": holders, "cond": mine}}}, 0]}
        return {"_id": name, "holders": {"$elemMatch": {"o": owner, "fence": fence}}}, live

    def held(self, name: str, owner: str | None) -> tuple[dict[str, Any], Any]:
        """With ``owner``: whether it holds a live permit; without: whether the live holders leave
        no room for a permit of this weight (as ``asyncio.Semaphore.locked``)."""
        match: dict[str, Any] = {"_id": name, "kind": self.kind}
        holders = permits._live_holders(expressions.SERVER_NOW)
        if owner is None:
            limit = {"$ifNull": ["$limit", self.permits.limit]}
            return match, {"$gt": [{"$add": [permits._weight_of(holders), self.permits.weight]}, limit]}
        match["holders.o"] = owner
        return match, {"$in": [owner, permits._holder_tokens(holders)]}

    def put_first(self, name: str, owner: str, label: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return permits.put_first_pipeline(self.kind, name, owner, label)


_MUTEX = MutexQueries()


def queries_for(permits: Permits | None) -> MutexQueries | PermitQueries:
    """The queries of the kind of document ``permits`` asks of: a lock's without, else a semaphore's,
    a read-write lock's or an election's (the same methods)."""
    return _MUTEX if permits is None else _permit_queries(permits)


@functools.cache
def _permit_queries(permits: Permits) -> PermitQueries:
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
