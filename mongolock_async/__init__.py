"""Asyncio-native distributed locks on MongoDB.

>>> lock = AsyncMongoLock(collection, "nightly-report", ttl=30.0, heartbeat=True)
>>> async with lock:
...     await run_report(fencing_token=lock.fencing_token)
"""

from .errors import (
    LockAlreadyHeldError,
    LockDataError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    ServerTooOldError,
)
from .indexes import ensure_idle_cleanup_index
from .lock import AsyncMongoLock, OnLost

__all__ = [
    "AsyncMongoLock",
    "LockAlreadyHeldError",
    "LockDataError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "OnLost",
    "ServerTooOldError",
    "ensure_idle_cleanup_index",
]
