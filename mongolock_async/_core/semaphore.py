"""``AsyncMongoSemaphore``: at most ``limit`` holders of one name at once, across processes."""

from __future__ import annotations

from typing import Unpack

from .._util.collection_types import AsyncCollectionLike
from ..store import Permits
from ..store.documents import MAX_PERMITS
from .lock import LOCK_OPTIONS, AsyncMongoLock, LockKeywords
from .options import LeaseOptions


class AsyncMongoSemaphore(AsyncMongoLock):
    """A distributed semaphore: at most ``limit`` holders of one name at once, stored in one
    MongoDB document.

    A handle stands for one holder of one permit, as a lock's handle does (one handle per task),
    and keeps every promise of [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]: the permit is a
    lease on the server's clock, released only by its holder, renewed by the shared heartbeat, and
    its loss cancels the ``async with`` block. ``fencing_token`` is the permit's own token: tokens
    of one semaphore only go up, each permit's above every token handed out before it. All the
    arguments but ``limit`` are a lock's.

    - ``limit``: how many permits may be held at once (1 to 10,000). Every acquire writes its
      ``limit`` into the document, so the last acquirer's limit is in force; handles of one
      semaphore should agree on it. Lowering it revokes no permit: new acquisitions (and hand-offs)
      wait until fewer than the new limit are held.

    One document holds the holders and the queue of waiting processes, so: one semaphore's
    acquisitions and releases are bounded by the write rate of one document (each is one write),
    and its holders by MongoDB's 16 MB document limit (a holder takes some hundred bytes plus its
    label), which the 10,000 cap keeps far off. A release hands its permit to the next waiter in
    the same write, as a lock's release does.

    ``locked()`` says whether every permit is taken (as ``asyncio.Semaphore.locked``). A name is
    of one kind (a lock, a semaphore or a read-write lock): using it as another raises
    [`LockDataError`][mongolock_async.LockDataError].
    """

    def __init__(
        self,
        collection: AsyncCollectionLike,
        name: str,
        limit: int,
        ttl: float = 30.0,
        **options: Unpack[LockKeywords],
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {type(limit).__name__}")
        if not 1 <= limit <= MAX_PERMITS:
            raise ValueError(
                f"limit must be 1 to {MAX_PERMITS} (the holders share one document, which MongoDB caps "
                f"at 16 MB), got {limit}"
            )
        checked = LeaseOptions.checked("AsyncMongoSemaphore", LOCK_OPTIONS, ttl=ttl, **options)
        self._init(collection, name, checked, Permits("semaphore", limit))

    @property
    def limit(self) -> int:
        """How many permits this handle lets be held at once."""
        return limit_of(self._permits)


def limit_of(permits: Permits | None) -> int:
    if permits is None:
        raise TypeError("not a handle of a semaphore or read-write lock")
    return permits.limit
