"""The kinds of lock document and what a request asks of them: a place in a queue, a permit, a
renewal; which queries serve a kind (``queries_for``), and the check that a document is of the kind
asked for (``of_kind``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..documents import JOB_KIND, LockState
from ..errors import LockDataError
from .mutex import MutexQueries
from .permits import PermitQueries


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
