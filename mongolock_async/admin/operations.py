"""The implementation of ``mongolock_async.operations`` (its public path; the user guide is there)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pymongo.write_concern import WriteConcern

from .._util import validation
from .._util.collection_types import AsyncCollectionLike
from .._util.inert import printable
from ..errors import LockDataError
from ..store import ForcedRelease, LockStore, store_for
from ..store.documents import JOB_KIND, LockReport, LockState, Permit
from ..store.job_state import JobState
from ..store.reports import report_at as reports_at

__all__ = [
    "ForcedRelease",
    "Holder",
    "LockInfo",
    "Waiter",
    "force_release",
    "inspect_lock",
    "list_locks",
    "lock_info",
    "judged_report",
    "report_at",
]

audit = logging.getLogger("mongolock_async.audit")
"""Where every forced release is logged, at WARNING."""
_MAJORITY = WriteConcern(w="majority")


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lease (a lock's, or one permit of a semaphore, read-write lock or election)."""

    owner: str | None
    """Its owner token (what ``release --force --holder`` selects by); None where it was not stored."""
    host: str | None
    pid: int | None
    label: str | None
    fencing_token: int | None
    """The token of its lease (an election's term)."""
    acquired_at: datetime | None
    renewed_at: datetime | None
    expires_at: datetime | None
    """When its lease ends on the server's clock, unless renewed."""
    ttl_ms: int | None
    weight: int = 1
    """1, or a read-write lock's whole limit for its writer."""
    role: str = "holder"
    """``holder``, ``reader``, ``writer`` or ``leader``."""

    def describe(self) -> str:
        """Who it is in a few words: ``label (host pid N)``, or ``host pid N``."""
        where = f"{self.host or '?'} pid {'?' if self.pid is None else self.pid}"
        return f"{self.label} ({where})" if self.label else where


@dataclass(frozen=True, slots=True)
class Waiter:
    """A process waiting in a lock's queue (one place per process, however many of its tasks wait)."""

    token: str
    """The owner token the lease will be handed to."""
    host: str | None
    pid: int | None
    label: str | None
    weight: int
    role: str
    """``waiter``, ``reader``, ``writer`` (a read-write lock's) or ``candidate`` (an election's)."""
    queued_at: datetime | None
    """Server time of the place's last write (it is refreshed while its process waits)."""
    expires_at: datetime
    """When the place stops counting unless refreshed (its process died or gave up)."""

    def describe(self) -> str:
        """Who it is in a few words, as [`Holder.describe`][mongolock_async.operations.Holder.describe]."""
        where = f"{self.host or '?'} pid {'?' if self.pid is None else self.pid}"
        return f"{self.label} ({where})" if self.label else where


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One lock, semaphore, read-write lock, election or job, as ``mongolock inspect`` shows it,
    judged on the server's clock at ``server_time``."""

    name: str
    kind: str
    """``lock``, ``semaphore``, ``rwlock``, ``election`` or ``job`` (``lock`` for an unreadable one)."""
    status: str
    """``held`` (a live lease or permit), ``released``, ``released by force``, ``expired`` (its
    holder never released it), ``free`` (never taken) or ``unreadable`` (see ``error``)."""
    holders: tuple[Holder, ...]
    """The live holders: a lock's one, a semaphore's permits, a read-write lock's readers or writer,
    an election's leader."""
    waiting: tuple[Waiter, ...]
    """The places queued, oldest first, as stored (each counts until its ``expires_at``)."""
    fencing_token: int | None
    """The latest fencing token handed out for the name."""
    limit: int | None
    """A semaphore's permits (a read-write lock's most readers); None for a lock, job or election."""
    ttl_ms: int | None
    last_holder: Holder | None
    """A lock's or job's stored holder while nobody holds it: who held it last."""
    released_at: datetime | None
    """When it was last released (None while held: the stored time is the previous lease's)."""
    server_time: datetime | None
    """The server's clock when this was read."""
    report: LockReport
    """Everything read, as the command's own output is made from it."""
    job: JobState | None = None
    """A job's schedule and runs (None for other kinds)."""
    error: LockDataError | None = None
    """Why an unreadable document could not be read (``mongolock release --force`` repairs it)."""

    @property
    def held(self) -> bool:
        """Whether a lease or permit is live."""
        return bool(self.holders)

    @property
    def time_left(self) -> timedelta | None:
        """Until the last live lease or permit ends, unless renewed; None when none is live."""
        remaining = self.report.remaining_ms
        return None if remaining is None or not self.holders else timedelta(milliseconds=remaining)

    @property
    def summary(self) -> str:
        """The state in a word or two, as ``mongolock list`` shows it: ``held``, ``2/3 held``,
        ``read by 2``, ``written``, ``led``, ``running``, ``released``, ``force-released``,
        ``expired``, ``free`` or ``unreadable``."""
        if self.kind == "election" and self.holders:
            return "led"
        if self.kind == "rwlock" and self.holders:
            return "written" if self.holders[0].role == "writer" else f"read by {len(self.holders)}"
        if self.limit is not None and self.holders:
            return f"{len(self.holders)}/{self.limit} held"
        if self.job is not None and self.job.running is not None:
            return "running"
        return "force-released" if self.status == "released by force" else self.status


def status_of(report: LockReport) -> str:
    """held, released, released by force, expired, free (never taken), or unreadable."""
    state = report.state
    if state is None:
        return "unreadable"
    if report.remaining_ms is not None:
        return "held"
    if state.owner is not None:
        return "expired"
    if state.released_at is None:
        return "free"
    if state.forced_release_at is not None and state.forced_release_at == state.released_at:
        return "released by force"
    return "released"


def lock_info(report: LockReport) -> LockInfo:
    """A report (``LockStore.report``, [`report_at`][mongolock_async.operations.report_at]) as a
    [`LockInfo`][mongolock_async.operations.LockInfo]; a job whose record cannot be judged is
    ``unreadable`` (see [`judged_report`][mongolock_async.operations.judged_report])."""
    job, report = _judged(report)
    state = report.state
    if state is None:
        name = report.name if isinstance(report.name, str) else repr(report.name)
        return LockInfo(
            name=name, kind="lock", status="unreadable", holders=(), waiting=(), fencing_token=None, limit=None,
            ttl_ms=None, last_holder=None, released_at=None, server_time=report.server_time, report=report,
            error=report.error,
        )  # fmt: skip
    held = report.remaining_ms is not None
    if state.limit is not None:
        holders = tuple(permit_holder(state, permit) for permit in report.live_permits)
        last = None
    else:
        stored = stored_holder(state, owner=state.owner)
        holders, last = ((stored,), None) if held else ((), stored if state.holder else None)
    waiting = tuple(
        Waiter(
            token=place.token,
            host=_text(place.holder.get("host")),
            pid=_integer(place.holder.get("pid")),
            label=_text(place.holder.get("label")),
            weight=place.weight,
            role=_waiter_role(state, place.weight),
            queued_at=place.refreshed_at,
            expires_at=place.expires_at,
        )
        for place in state.queue
    )
    return LockInfo(
        name=state.name,
        kind=state.kind,
        status=status_of(report),
        holders=holders,
        waiting=waiting,
        fencing_token=state.fencing_token,
        limit=state.limit if state.kind != "election" else None,
        ttl_ms=state.ttl_ms,
        last_holder=last,
        released_at=None if held else state.released_at,
        server_time=report.server_time,
        report=report,
        job=job,
    )


def judged_report(report: LockReport) -> LockReport:
    """``report``, or, for a job whose record cannot be judged on the server's clock (a corrupt
    ``job.every``, or a ``min_interval`` that puts its next run past the year 9999), the same
    document reported as unreadable, with why: one odd document is shown as such, and never stops
    a listing or a view of the others."""
    return _judged(report)[1]


def _judged(report: LockReport) -> tuple[JobState | None, LockReport]:
    state = report.state
    if state is None or state.kind != JOB_KIND or report.server_time is None:
        return None, report
    try:
        return JobState.from_report(report), report
    except (ArithmeticError, ValueError, TypeError) as error:  # OverflowError: a date past 9999
        detail = f"cannot be judged on the server's clock ({type(error).__name__}: {error})"
        remedy = "correct or unset its schedule in the document (`mongolock release --force` resets only the lease)"
        unreadable = LockDataError(state.name, "job", detail, remedy)
        return None, LockReport(state.name, None, None, error=unreadable, server_time=report.server_time)


def report_at(document: Mapping[str, Any] | LockState, server_time: datetime) -> LockReport:
    """A lock document (or its parsed state) as ``LockStore.report`` would report it at
    ``server_time`` (a time on the server's clock): for a view that gets documents from a change
    stream and keeps the server's time itself. A corrupt document is reported with its error, as
    there."""
    return reports_at(document, server_time)


async def list_locks(
    collection: AsyncCollectionLike, *, prefix: str | None = None, held: bool = False
) -> list[LockInfo]:
    """Every lock document of ``collection`` (or those whose name starts with ``prefix``), by name;
    with ``held``, only those with a live lease or permit. A corrupt document is listed with
    status ``unreadable`` and its ``error``; the others are listed as usual."""
    store = _store(collection)
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, not {type(prefix).__name__}")
    validation.flag(held, "held")
    infos = [lock_info(report) for report in await store.report(prefix=prefix or None)]
    return [info for info in infos if info.held] if held else infos


async def iterate_locks(
    collection: AsyncCollectionLike,
    *,
    prefix: str | None = None,
    held: bool = False,
    after: str | None = None,
    limit: int | None = None,
) -> AsyncGenerator[LockInfo, None]:
    """The locks [`list_locks`][mongolock_async.operations.list_locks] lists, by name, read from the server a batch
    at a time: a listing of 100,000 locks never holds them all. ``after`` starts after that name
    (the last one of a page), ``limit`` stops after that many (counted after ``held``). Arguments
    are checked before any I/O."""
    store = _store(collection)
    for argument, value in (("prefix", prefix), ("after", after)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{argument} must be a str or None, not {type(value).__name__}")
    validation.flag(held, "held")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, not {limit!r}")
    shown = 0
    # Without held, the server stops at the limit; with it, this stops reading once it has enough.
    reports = store.iterate_reports(prefix=prefix or None, after=after, limit=None if held else limit)
    async with contextlib.aclosing(reports):
        async for report in reports:
            info = lock_info(report)
            if held and not info.held:
                continue
            yield info
            shown += 1
            if limit is not None and shown >= limit:
                return


async def inspect_lock(collection: AsyncCollectionLike, name: str) -> LockInfo | None:
    """The lock (or semaphore, read-write lock, election, job) ``name``; None if it has no document."""
    store = _store(collection)
    validation.lock_name(name)
    reports = await store.report([name])
    return lock_info(reports[0]) if reports else None


async def force_release(
    collection: AsyncCollectionLike, name: str, *, holder: str | None = None, by: str | None = None
) -> ForcedRelease | None:
    """Break the one lease of ``name`` that ``holder`` names (``mongolock release --force``), and
    only that one: ``holder`` is its owner token
    ([`Holder.owner`][mongolock_async.operations.Holder.owner], the ``owner`` that ``mongolock
    inspect`` shows), or the start of it that no other live holder's token shares. Return what was
    broken, or None if that lease ended between the read that selected it and the write (released,
    expired, or broken already): then nothing is broken, whoever holds ``name`` now.

    The write itself matches the owner token, so a lease that changed hands after the caller
    looked is never the one broken. On a semaphore, read-write lock or election it is one
    holder's permit. Without ``holder``, it only repairs a document whose lock fields are corrupt
    (``unreadable``: they are reset, if still corrupt when the write lands) and never breaks a
    live lease. The broken holder still believes it holds the lease until its own deadline: fence
    what it protects. Each break is logged at WARNING on the ``mongolock_async.audit`` logger,
    with ``by`` (who asked, for the record: a user name, an address).

    :raises TypeError: an argument has the wrong type (before any I/O).
    :raises ValueError: ``name`` or ``holder`` is empty or too long (before any I/O); several
        live holders' owner tokens start with ``holder``; or ``holder`` is None and ``name`` has a
        live lease (the message lists its holders' owner tokens).
    :raises LookupError: ``holder`` selects no live holder (its lease had ended already; the
        message lists the live ones), or ``name`` has no document.
    """
    store = _store(collection)
    validation.lock_name(name)
    if holder is not None and not isinstance(holder, str):
        raise TypeError(f"holder must be a str (an owner token, or its start) or None, not {type(holder).__name__}")
    if by is not None and not isinstance(by, str):
        raise TypeError(f"by must be a str or None, not {type(by).__name__}")
    if holder is not None:
        broken = await store.force_release(name, holder=holder)
    else:
        broken = await _repair(store, name)
    if broken is not None:
        who = (
            "; ".join(
                f"{_describe(entry_holder)} (owner {owner}, fencing token {token})"
                for owner, entry_holder, token in broken.permits
            )
            or f"{_describe(broken.holder)} (owner {broken.owner}, fencing token {broken.fencing_token})"
        )
        # One line per break whatever the labels hold: a newline in one could forge the next record.
        audit.warning(
            "forced release of %r in %s by %s: broke %s", name, store.full_name, printable(by or "an API call"),
            printable(who),
        )  # fmt: skip
    return broken


async def _repair(store: LockStore, name: str) -> ForcedRelease | None:
    """Reset ``name``'s document if it is unreadable; a ``ValueError`` naming the live leases if it
    has any (a forced release names the one it breaks)."""
    found = await store.report([name])
    if not found:
        raise LookupError(f"no lock named {name!r} in {store.full_name}")
    info = lock_info(found[0])
    if info.holders:
        owners = ", ".join(f"{holder.owner} ({holder.describe()})" for holder in info.holders)
        raise ValueError(
            f"{name!r} has a live lease: name the one to break with holder=<its owner token> (live: {owners})"
        )
    return await store.repair(name) if info.status == "unreadable" else None


def _store(collection: object) -> LockStore:
    return store_for(validation.async_collection(collection), _MAJORITY)


def stored_holder(state: LockState, *, owner: str | None) -> Holder:
    """The holder a lock's document names: its current one, or (``owner`` None) its last."""
    return Holder(
        owner=owner,
        host=_text(state.holder.get("host")),
        pid=_integer(state.holder.get("pid")),
        label=_text(state.holder.get("label")),
        fencing_token=state.fencing_token,
        acquired_at=state.acquired_at,
        renewed_at=state.renewed_at,
        expires_at=state.expires_at,
        ttl_ms=state.ttl_ms,
    )


def permit_holder(state: LockState, permit: Permit) -> Holder:
    """The holder of one permit of a semaphore, read-write lock or election."""
    return Holder(
        owner=permit.token,
        host=_text(permit.holder.get("host")),
        pid=_integer(permit.holder.get("pid")),
        label=_text(permit.holder.get("label")),
        fencing_token=permit.fencing_token,
        acquired_at=permit.acquired_at,
        renewed_at=permit.renewed_at,
        expires_at=permit.expires_at,
        ttl_ms=permit.ttl_ms,
        weight=permit.weight,
        role=_holder_role(state, permit.weight),
    )


def _holder_role(state: LockState, weight: int) -> str:
    if state.kind == "election":
        return "leader"
    if state.kind == "rwlock":
        return "writer" if weight == state.limit else "reader"
    return "holder"


def _waiter_role(state: LockState, weight: int) -> str:
    if state.kind == "election":
        return "candidate"
    if state.kind == "rwlock":
        return "writer" if weight == state.limit else "reader"
    return "waiter"


def _describe(who: Mapping[str, Any]) -> str:
    label, where = who.get("label"), f"{who.get('host', '?')} pid {who.get('pid', '?')}"
    return f"{label} ({where})" if label else (where if who else "an unlabelled holder")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
