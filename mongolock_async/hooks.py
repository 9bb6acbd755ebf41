"""Observing locks: a callback per event, for metrics, traces or logs of your own.

Subclass [`LockHooks`][mongolock_async.LockHooks], override what you need, and pass an instance as
``hooks=`` to [`AsyncMongoLock`][mongolock_async.AsyncMongoLock] or
[`LockManager`][mongolock_async.LockManager]. The OpenTelemetry integration
([`mongolock_async.opentelemetry`][mongolock_async.opentelemetry.OpenTelemetryHooks]) is one such
subclass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

__all__ = ["LockHooks"]

if TYPE_CHECKING:
    from .store.documents import Period

logger = logging.getLogger("mongolock_async")


class LockHooks:
    """Callbacks for what happens to a lock; each one does nothing unless overridden.

    They are called synchronously by the task or timer that saw the event, so keep them cheap. An
    exception a hook raises is logged and otherwise ignored: observing never breaks the lock.
    Times are in seconds, measured on the local monotonic clock.
    """

    def acquired(self, name: str, *, fencing_token: int, waited: float) -> None:
        """The lock was taken after ``waited`` seconds (0 when it was free)."""

    def not_acquired(self, name: str, *, waited: float) -> None:
        """An acquire gave up: held by someone else (non-blocking) or past its timeout."""

    def renewed(self, name: str, *, fencing_token: int) -> None:
        """The heartbeat (or ``extend``) renewed the lease."""

    def released(self, name: str, *, fencing_token: int, held: float) -> None:
        """The holder released its live lease after holding it ``held`` seconds."""

    def lost(self, name: str, *, fencing_token: int, held: float, reason: str) -> None:
        """The lease was lost while held (not renewed in time, or taken over); ``reason`` says how."""

    def job_ran(self, name: str, *, outcome: str, duration: float, period: Period | None, attempt: int) -> None:
        """A run of the job ``name`` ended after ``duration`` seconds: ``outcome`` is ``succeeded``,
        ``failed``, ``cancelled`` or ``lost``; ``period`` is the period it ran in, its start and
        end on the server's clock (None without ``every``), and ``attempt`` its number in it."""

    def job_skipped(self, name: str, *, reason: str, period: Period | None) -> None:
        """A call of the job ``name`` did not run it: ``reason`` is ``running`` (a run holds it),
        ``held`` (kept after a run, ``hold_at_least``), ``done`` (a run that started in ``period``,
        or later, succeeded), ``failed`` (the period's attempts are used up), ``too_soon``
        (``min_interval``) or ``lost`` (taken, but the reply came too late to run)."""


def notify(hooks: LockHooks | None, event: str, name: str, **details: Any) -> None:
    """Call ``hooks.<event>(name, **details)``, logging (not raising) what it raises."""
    if hooks is None:
        return
    try:
        getattr(hooks, event)(name, **details)
    except Exception:
        logger.exception("the %s hook for lock %r failed", event, name)
