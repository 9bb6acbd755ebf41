"""Asyncio-native distributed locks on MongoDB.

>>> lock = AsyncMongoLock(collection, "nightly-report", ttl=30.0, heartbeat=True)
>>> async with lock:
...     await run_report(fencing_token=lock.fencing_token)
"""

from ._collection import AsyncCollectionLike
from ._options import OnLost
from ._version import __version__
from .documents import Leadership
from .election import AsyncMongoElection
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
from .indexes import ensure_idle_cleanup_index
from .jobs import AsyncMongoJob, JobResult, JobState
from .lock import AsyncMongoLock
from .manager import LockManager
from .rwlock import AsyncMongoRWLock, RWLockHandle
from .semaphore import AsyncMongoSemaphore

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
