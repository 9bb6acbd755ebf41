"""The library's exceptions. Every one of them is a [`LockError`][mongolock_async.LockError]."""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "LockAlreadyHeldError",
    "LockDataError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "ServerTooOldError",
    "ServerUnreachableError",
    "TransactionsUnsupportedError",
]


class LockError(Exception):
    """Base class of every error this library raises on purpose."""


class LockTimeoutError(LockError, TimeoutError):
    """A blocking acquire gave up: the lock stayed held by someone else until the timeout, or
    (``unreachable`` set, the driver's error as ``__cause__``) MongoDB could not be reached when
    the timeout passed."""

    def __init__(self, name: str, timeout: float | None, unreachable: str | None = None) -> None:
        self.name = name
        self.timeout = timeout
        self.unreachable = unreachable
        """Why MongoDB could not be reached when the timeout passed; None if it answered that the
        lock was held."""
        if unreachable is not None:
            within = "" if timeout is None else f" within {timeout:g} s"
            reason = f"MongoDB could not be reached ({unreachable})"
            super().__init__(f"lock {name!r} could not be acquired{within}: {reason}")
        elif timeout is None:
            super().__init__(f"lock {name!r} is held by another owner")
        else:
            super().__init__(f"lock {name!r} could not be acquired within {timeout:g} s")


class ServerUnreachableError(LockError):
    """MongoDB could not be reached for longer than the handle's ``unreachable_timeout`` while
    acquiring (or at all, for a non-blocking acquire). ``__cause__`` is the driver's last error;
    ``reason`` says in words what it ran into."""

    def __init__(self, name: str, reason: str, waited: float) -> None:
        self.name = name
        self.reason = reason
        self.waited = waited
        super().__init__(f"lock {name!r}: MongoDB could not be reached for {waited:.1f} s: {reason}")


class LockNotOwnedError(LockError):
    """An operation that needs a live lease found that this handle does not hold one."""

    def __init__(self, name: str, detail: str = "this handle does not hold a live lease on it") -> None:
        self.name = name
        super().__init__(f"lock {name!r}: {detail}")


class LockAlreadyHeldError(LockError, RuntimeError):
    """``acquire()`` was called on a handle that already holds (or is acquiring) its lock.

    A handle stands for one holder. Re-entry is refused rather than silently counted, because a
    second ``release()`` by the "inner" user would end the lease the "outer" user still relies on.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"this AsyncMongoLock handle already holds or is acquiring {name!r}; "
            "create one handle per task that needs the lock"
        )


class LockDataError(LockError):
    """A lock document holds a value this library never writes: edited by hand or by another tool.

    The library refuses to act on such a document rather than guess: no acquisition, renewal or
    hand-off happens on it. ``mongolock release NAME --force`` resets it.
    """

    def __init__(
        self, name: object, field: str, detail: str, remedy: str = "reset it with `mongolock release --force`"
    ) -> None:
        self.name = name
        self.field = field
        super().__init__(f"lock {name!r}: field {field!r} {detail}; {remedy}")


class ServerTooOldError(LockError):
    """The MongoDB server is older than 5.0, the oldest release this library supports."""


class TransactionsUnsupportedError(LockError):
    """[`guard_transaction`][mongolock_async.AsyncMongoLock.guard_transaction] needs multi-document transactions,
    which a standalone server does not have (a replica set or a sharded cluster does)."""


class LockLostError(LockError):
    """The lease ended while its holder still relied on it.

    Raised by ``async with lock:`` when the heartbeat could not renew the lease before the local
    deadline, or found that another owner holds the lock now. ``reason`` says which; ``lost_at``
    is the wall-clock time (UTC) at which this process stopped believing it held the lock.
    """

    def __init__(self, name: str, reason: str, lost_at: datetime) -> None:
        self.name = name
        self.reason = reason
        self.lost_at = lost_at
        super().__init__(f"lock {name!r} was lost at {lost_at.isoformat()}: {reason}")
