"""Opt-in maintenance of the lock collection."""

from __future__ import annotations

from pymongo.write_concern import WriteConcern

from .._util import validation
from .._util.collection_types import AsyncCollectionLike
from ..store import LockStore

MIN_IDLE_AFTER = 3600


async def ensure_idle_cleanup_index(collection: AsyncCollectionLike, idle_after: int = 86_400) -> str:
    """Create a TTL index that deletes lock documents idle for ``idle_after`` seconds (default a
    day, at least an hour); if it exists with another period, change it (``collMod``).

    A document is idle once its lease has ended (released or expired); live leases are never
    deleted. Deleting an idle document does not reset fencing tokens: a new document starts from
    the server clock in microseconds, which has passed every earlier token during the idle time,
    provided the servers' clocks never step back by that much; hence the hour's minimum. MongoDB's
    TTL monitor runs about once a minute, so deletion can lag. Returns the index name.
    """
    collection = validation.async_collection(collection)
    if isinstance(idle_after, bool) or not isinstance(idle_after, int):
        raise TypeError(f"idle_after must be an int number of seconds, not {type(idle_after).__name__}")
    if idle_after < MIN_IDLE_AFTER:
        raise ValueError(
            f"idle_after must be at least {MIN_IDLE_AFTER} s: fencing tokens of a purged lock restart from the "
            f"server clock, which must have moved well past every earlier token; got {idle_after}"
        )
    return await LockStore(collection, WriteConcern(w="majority")).ensure_idle_cleanup_index(idle_after)
