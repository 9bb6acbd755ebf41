"""``AsyncMongoRWLock``: many readers or one writer of one name, across processes."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Unpack

from .._util import validation
from .._util.collection_types import AsyncCollectionLike
from ..store import Permits
from ..store.documents import MAX_PERMITS
from .lock import RWLOCK_OPTIONS, AsyncMongoLock, RWLockKeywords
from .options import LeaseOptions

MAX_READERS = MAX_PERMITS
"""Readers a read-write lock lets in at once (its holders share one document)."""


class AsyncMongoRWLock:
    """A distributed read-write lock: many readers, or one writer, of one name at once.

    ``rw = AsyncMongoRWLock(collection, "index", ttl=30)``, then ``async with rw.read(): ...`` in
    tasks that only read and ``async with rw.write(): ...`` in those that change what the lock
    protects. Each call of [`read`][mongolock_async.AsyncMongoRWLock.read] or
    [`write`][mongolock_async.AsyncMongoRWLock.write] makes a new handle (one per task), with every
    promise of [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]: a lease on the server's clock,
    released only by its holder, renewed by the shared heartbeat, its loss cancelling the block.
    The keyword arguments are a lock's (checked here, before any I/O), but ``fair``.

    Waiting readers and writers are served first come, first served, across processes: a writer
    waits for the readers in before it, and readers that come after a waiting writer wait for it
    (*writer preference*: a stream of readers cannot starve a writer). When a writer releases, the
    lock goes to the next waiter, and if that is a reader, to every reader place queued before the
    next writer, in the same write: a stream of writers cannot starve readers either, since each
    reader is served in its turn.

    Fencing: every grant gets its own token from the one counter of the name; a writer's is above
    every token handed out before it, to readers and writers alike. At most 10,000 readers at once.
    """

    def __init__(
        self, collection: AsyncCollectionLike, name: str, ttl: float = 30.0, **options: Unpack[RWLockKeywords]
    ) -> None:
        if "fair" in options:
            raise TypeError("a read-write lock always serves its waiters in turn: it takes no 'fair'")
        LeaseOptions.checked("AsyncMongoRWLock", RWLOCK_OPTIONS, ttl=ttl, **options)  # no I/O
        self._collection = validation.async_collection(collection)
        self._name = validation.lock_name(name)
        self._keywords: dict[str, Any] = {"ttl": ttl, **options}

    @property
    def name(self) -> str:
        return self._name

    def read(self, **overrides: Unpack[RWLockKeywords]) -> RWLockHandle:
        """A new handle for reading (``overrides`` set handle options for it)."""
        return RWLockHandle(self._collection, self._name, "read", **{**self._keywords, **overrides})

    def write(self, **overrides: Unpack[RWLockKeywords]) -> RWLockHandle:
        """A new handle for writing (``overrides`` set handle options for it)."""
        return RWLockHandle(self._collection, self._name, "write", **{**self._keywords, **overrides})


class RWLockHandle(AsyncMongoLock):
    """One reader's or one writer's hold on a read-write lock; made by
    [`AsyncMongoRWLock.read`][mongolock_async.AsyncMongoRWLock.read] and
    [`write`][mongolock_async.AsyncMongoRWLock.write]. ``locked()`` says whether this handle would
    have to wait now: for a reader, whether a writer holds the lock; for a writer, whether anyone
    does."""

    def __init__(
        self,
        collection: AsyncCollectionLike,
        name: str,
        mode: Literal["read", "write"],
        ttl: float = 30.0,
        **options: Unpack[RWLockKeywords],
    ) -> None:
        if mode not in ("read", "write"):
            raise ValueError(f"mode must be 'read' or 'write', not {mode!r}")
        checked = LeaseOptions.checked("RWLockHandle", RWLOCK_OPTIONS, ttl=ttl, **options)
        self._mode: Literal["read", "write"] = mode
        permits = Permits("rwlock", MAX_READERS, 1 if mode == "read" else MAX_READERS)
        self._init(collection, name, dataclasses.replace(checked, fair=True), permits)

    @property
    def mode(self) -> Literal["read", "write"]:
        return self._mode
