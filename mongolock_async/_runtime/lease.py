"""One acquisition of a lock: what the holder knows about it, and how its loss is signalled."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ..errors import LockLostError
from ..hooks import LockHooks, notify
from ..store import LockStore, Permits

logger = logging.getLogger("mongolock_async")

# Deadline timers run in one empty context instead of a copy of the arming caller's (a renewal's, or
# an acquire's): what runs at a deadline owes nothing to either, and a copy per arming costs memory
# per lease and CPU per renewal. Timer callbacks never nest, so sharing one context is safe; a loss
# runs the holder's callbacks in a fresh one, so nothing they set lingers in it.
_TIMER_CONTEXT = contextvars.Context()

# Async on_lost callbacks run as tasks; keep them referenced until they finish.
_callback_tasks: set[asyncio.Task[Any]] = set()


class BodyGuard:
    """Cancels the task running an ``async with`` body when its lease is lost, like ``asyncio.timeout``.

    A plain ``Task.cancel()`` marks the task at once, so the body's very next step raises
    ``CancelledError`` even if that step was already scheduled (after a process pause, the body's
    timer and the lease's deadline timer fire in the same loop iteration). ``uncancel`` counting
    tells this cancellation apart from one requested by anyone else.
    """

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling() if self._task is not None else 0
        self.fired = False
        self.closed = False

    def fire(self) -> None:
        if not self.fired and not self.closed and self._task is not None and not self._task.done():
            self.fired = True
            self._task.cancel(msg="mongolock_async: the lease was lost")

    def close(self, exc_type: type[BaseException] | None) -> bool:
        """The block has ended: fire no more. Returns whether it ended by our cancellation alone,
        which the caller turns into ``LockLostError``."""
        self.closed = True
        if not self.fired or self._task is None:
            return False
        return self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError


class LeaseHolder(Protocol):
    def _lease_lost(self, lease: Lease) -> None:
        """Signal the loss of ``lease`` (already recorded in ``lease.lost_error``) to the holder's users."""


@dataclass(eq=False, slots=True)
class Lease:
    """A lease this process holds (or held) on ``name``.

    ``deadline`` is the local monotonic time until which the lease is known to be valid: the time
    the acquire or renew request was *sent*, plus the TTL, minus the safety margin. The server's
    expiry is counted from when it *received* the request, so it is always later. A loop timer
    fires at the deadline; if no renewal moved it by then, the lease is lost, else the timer waits
    on for the new deadline (one timer per lease, re-armed about once a TTL, not per renewal).
    """

    store: LockStore
    name: str
    owner: str
    fencing_token: int
    ttl: float
    safety_margin: float | None
    """The configured margin, or None for ``default_safety_margin`` of the TTL."""
    deadline: float
    heartbeat_interval: float | None
    holder: weakref.ref[LeaseHolder]
    """The handle holding the lease (weakly: a dropped handle releases its lease)."""
    loop: asyncio.AbstractEventLoop
    lost_error: LockLostError | None = None
    ended: bool = False
    body: BodyGuard | None = None
    renewal_error: str | None = None
    """Why the last renewal attempt failed, for the loss reason."""
    hooks: LockHooks | None = None
    permits: Permits | None = None
    """What a semaphore's or read-write lock's permit is; None for a lock's lease."""
    taken_at: float = field(default_factory=time.monotonic)
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def server_expiry_floor(self) -> float:
        """A monotonic time before which the server cannot have let the lease expire."""
        margin = default_safety_margin(self.ttl) if self.safety_margin is None else self.safety_margin
        return self.deadline + margin

    @property
    def believed_held(self) -> bool:
        return not self.ended and self.lost_error is None and time.monotonic() < self.deadline

    def arm(self) -> None:
        """(Re)start the deadline timer; ``time.monotonic`` is the asyncio loop's clock."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(self.deadline, self._deadline_passed, context=_TIMER_CONTEXT)

    def confirm(self, sent_at: float, ttl: float | None = None) -> None:
        """Record a renewal the server applied to a request sent at monotonic ``sent_at``."""
        if self.ended or self.lost_error is not None:
            return
        if ttl is not None:
            self.ttl = ttl
        self.deadline = local_deadline(sent_at, self.ttl, self.safety_margin)
        self.renewal_error = None
        # A later deadline leaves the timer as it is: at the earlier one it finds the deadline moved
        # and re-arms for it (``_deadline_passed``). Re-arming at every renewal would cost each one
        # a new timer, and leave the loop's heap a cancelled one per lease until it came due.
        if self._timer is None or self._timer.when() > self.deadline:
            self.arm()
        notify(self.hooks, "renewed", self.name, fencing_token=self.fencing_token)

    def end(self) -> None:
        """The holder is done with the lease (released, or forgotten): stop watching its deadline."""
        self.ended = True
        self.body = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def mark_lost(self, reason: str) -> None:
        """Signal loss once: set the event, cancel the protected block, call the callback."""
        if self.ended or self.lost_error is not None:
            return
        self.lost_error = LockLostError(self.name, reason, datetime.now(UTC))
        # Logged as text: a log record that kept the error would keep, once it is raised, its
        # traceback's frames (and the client they hold) for as long as the record lives.
        message = str(self.lost_error)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.body is not None:
            # The block raises the error itself: log at debug only, so it is not reported twice.
            logger.debug("%s", message)
            self.body.fire()
        else:
            logger.warning("%s", message)
        notify(self.hooks, "lost", self.name, fencing_token=self.fencing_token, held=self.held, reason=reason)
        holder = self.holder()
        if holder is not None:
            holder._lease_lost(self)

    @property
    def held(self) -> float:
        """Seconds since the lease was taken."""
        return time.monotonic() - self.taken_at

    def _deadline_passed(self) -> None:
        self._timer = None
        if time.monotonic() < self.deadline:  # confirmed meanwhile
            self.arm()
            return
        if self.heartbeat_interval is None:
            reason = (
                f"the lease reached its local deadline (ttl {self.ttl:g} s) without renewal; "
                "use heartbeat=True for work that can outlast the TTL"
            )
        else:
            reason = (
                "the lease could not be renewed before its local deadline "
                f"({self.renewal_error or 'no renewal completed in time'})"
            )
        contextvars.Context().run(self.mark_lost, reason)  # users' callbacks: not in the shared context


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
