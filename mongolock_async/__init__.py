"""Asyncio-native distributed locks on MongoDB.

>>> lock = AsyncMongoLock(collection, "nightly-report", ttl=30.0, heartbeat=True)
>>> async with lock:
...     await run_report(fencing_token=lock.fencing_token)
"""

from ._core.election import AsyncMongoElection
from ._core.jobs import AsyncMongoJob, JobResult, JobState
from ._core.lock import AsyncMongoLock, OnLost
from ._core.manager import LockManager
from ._core.rwlock import AsyncMongoRWLock, RWLockHandle
from ._core.semaphore import AsyncMongoSemaphore
from ._util.collection_types import AsyncCollectionLike
from ._version import __version__
from .admin.indexes import ensure_idle_cleanup_index
from .errors import (
    LockAlreadyHeldError,
    LockDataError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    ServerTooOldError,
    ServerUnreachableError,
    TransactionsUnsupportedError,
)
from .hooks import LockHooks
from .store.documents import Leadership

__all__ = [
    "AsyncCollectionLike",
    "AsyncMongoElection",
    "AsyncMongoJob",
    "AsyncMongoLock",
    "AsyncMongoRWLock",
    "AsyncMongoSemaphore",
    "JobResult",
    "JobState",
    "LockHooks",
    "LockManager",
    "LockAlreadyHeldError",
    "LockDataError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "Leadership",
    "OnLost",
    "RWLockHandle",
    "ServerTooOldError",
    "ServerUnreachableError",
    "TransactionsUnsupportedError",
    "__version__",
    "ensure_idle_cleanup_index",
]
