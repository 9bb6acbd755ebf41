"""One acquisition of a lock: what the holder knows about it, and how its loss is signalled."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from .errors import LockLostError
from .store import LockStore

logger = logging.getLogger("mongolock_async")

# Async on_lost callbacks run as tasks; keep them referenced until they finish.
_callback_tasks: set[asyncio.Task[Any]] = set()


@dataclass(eq=False, slots=True)
class Lease:
    """A lease this process holds (or held) on ``name``.

    ``deadline`` is the local monotonic time until which the lease is known to be valid: the time
    the acquire or renew request was *sent*, plus the TTL, minus the safety margin. The server's
    expiry is counted from when it *received* the request, so it is always later.
    """

    store: LockStore
    name: str
    owner: str
    fencing_token: int
    ttl: float
    safety_margin: float | None
    """The configured margin, or None for :func:`default_safety_margin` of the TTL."""
    deadline: float
    heartbeat_interval: float | None
    lost: asyncio.Event
    on_lost: Callable[[LockLostError], None]
    lost_error: LockLostError | None = None
    ended: bool = False
    cancel_scope: anyio.CancelScope | None = field(default=None)

    @property
    def believed_held(self) -> bool:
        return not self.ended and self.lost_error is None and time.monotonic() < self.deadline

    def confirm(self, sent_at: float, ttl: float | None = None) -> None:
        """Record a renewal the server applied to a request sent at monotonic ``sent_at``."""
        if ttl is not None:
            self.ttl = ttl
        self.deadline = local_deadline(sent_at, self.ttl, self.safety_margin)

    def mark_lost(self, reason: str) -> None:
        """Signal loss once: set the event, cancel the protected block, call the callback."""
        if self.ended or self.lost_error is not None:
            return
        self.lost_error = LockLostError(self.name, reason, datetime.now(UTC))
        logger.warning("%s", self.lost_error)
        self.lost.set()
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()
        self.on_lost(self.lost_error)


def default_safety_margin(ttl: float) -> float:
    """10 % of the TTL, at most one second: far above clock-rate drift, and it absorbs scheduling jitter."""
    return min(0.1 * ttl, 1.0)


def local_deadline(sent_at: float, ttl: float, safety_margin: float | None) -> float:
    margin = default_safety_margin(ttl) if safety_margin is None else safety_margin
    return sent_at + ttl - margin


def call_on_lost(callback: Callable[..., Any], argument: object) -> None:
    """Run a user's sync or async ``on_lost`` callback without letting it stall the caller."""
    try:
        result = callback(argument)
    except Exception:
        logger.exception("on_lost callback failed")
        return
    if inspect.isawaitable(result):
        task = asyncio.ensure_future(result)
        _callback_tasks.add(task)
        task.add_done_callback(_finish_callback)


def _finish_callback(task: asyncio.Task[Any]) -> None:
    _callback_tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("on_lost callback failed", exc_info=task.exception())
