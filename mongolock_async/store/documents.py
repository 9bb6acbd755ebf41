"""Lock documents as the library reads them, checked field by field.

A document can have been edited by hand or by another tool. Every field the lock's safety depends
on (``owner``, ``expiresAt``, ``fence``, ``queue``) is checked here the same way the store's
pipelines check it on the server, and a bad one raises ``LockDataError`` naming the lock and
the field. Fields kept only for operators (``holder``, ``ttlMs``, timestamps) are read leniently:
a wrong type shows as missing rather than breaking a listing of every other lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from ..errors import LockDataError

# Tokens are the server clock in microseconds (about 1.8e15 today); far below this bound, which
# keeps ``fence + 1`` clear of int64 overflow on the server.
MAX_FENCE = 2**62
# No lease is written more than this far ahead (the longest TTL, a year and a day, plus a day).
EXPIRY_HORIZON = timedelta(days=368)
PERMIT_KINDS = ("semaphore", "rwlock", "election")
"""The ``kind`` of a semaphore's, a read-write lock's and an election's document (holders of
permits, each with its own token); a lock's document has none."""
JOB_KIND = "job"
"""The ``kind`` of a job's document: a lock's fields, and the job's record in ``job``."""
JOB_OUTCOMES = ("succeeded", "failed", "cancelled", "lost")
"""How a run of a job ended: it returned; it raised (recorded with the error's type and message);
it was cancelled; or its lease ended first (its process died, or it lost the lease)."""
MAX_PERMITS = 10_000
"""The largest semaphore ``limit``: its holders, each some hundreds of bytes with the holder's
label, and its queue share one document, which MongoDB caps at 16 MB."""


class Place(NamedTuple):
    """A process's place in the fair queue stored with a lock."""

    token: str
    """The owner token the lease is handed to when this place's turn comes."""
    ttl_ms: int
    expires_at: datetime
    """Server time after which the place no longer counts (its process stopped refreshing it)."""
    refreshed_at: datetime | None
    """Server time of the last write that added or refreshed the place."""
    holder: Mapping[str, Any]
    weight: int = 1
    """What it waits for of a semaphore's or read-write lock's limit (a writer: all of it)."""


class Permit(NamedTuple):
    """One holder of a semaphore's permits."""

    token: str
    """The holder's owner token."""
    weight: int
    """1 for a semaphore's permit and a reader; a read-write lock's limit for its writer."""
    expires_at: datetime
    fencing_token: int
    ttl_ms: int | None
    holder: Mapping[str, Any]
    acquired_at: datetime | None
    renewed_at: datetime | None


class Period(NamedTuple):
    """A period of a job's schedule: the span ``[start, end)`` of the server's clock, with
    ``start = offset + floor((now - offset) / every) * every`` (times since the Unix epoch)."""

    start: datetime
    end: datetime


class JobRun(NamedTuple):
    """One run of a job, as its document records it (read leniently: these fields are for people)."""

    attempt: int
    """Its number among the runs started in its period (1 for the first; always 1 without ``every``)."""
    period: Period | None
    """The period it started in, as its schedule defined it; None for a job without ``every``."""
    started_at: datetime | None
    """Server time at which it took the job's lease."""
    holder: Mapping[str, Any]
    """``host``, ``pid`` and ``label`` of the process that ran it."""
    ended_at: datetime | None = None
    """Server time at which it ended (for a lost run: when its lease expired); None while it runs."""
    outcome: str | None = None
    """One of ``JOB_OUTCOMES``; None while it runs."""
    error_type: str | None = None
    """The exception's class name, for a failed run."""
    error_message: str | None = None
    """The exception's message (its first 1,000 characters), for a failed run."""

    @property
    def duration(self) -> float | None:
        """Seconds from its start to its end, on the server's clock; None while it runs."""
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


class JobRecord(NamedTuple):
    """What a job's document records: its schedule as last asked for, and its runs."""

    every_ms: int | None = None
    """The length of its periods (spans of the server's clock); None: not scheduled per period."""
    offset_ms: int = 0
    """Where its periods start, after each multiple of ``every_ms`` since the Unix epoch."""
    min_interval_ms: int | None = None
    """The least time between the end of a run and the start of the next."""
    max_attempts: int | None = None
    """Runs allowed per period (a run that failed or was lost counts)."""
    tries: tuple[datetime, ...] = ()
    """Server times at which the latest runs of a job with ``every`` started, earliest first (at most
    1000 of them, the largest ``max_attempts``): the runs started in a period are those at or after
    its start."""
    last_success: datetime | None = None
    """Server time at which the latest run that succeeded started: the period it started in is
    done, and so is any earlier one (a server clock that stepped back finds them done)."""
    running: JobRun | None = None
    """The run holding the job's lease now, or that held it until it expired without finishing."""
    last: JobRun | None = None
    """The latest run that ended."""
    last_ended_at: datetime | None = None
    """Server time at which the latest run ended (what ``min_interval_ms`` counts from)."""
    skipped: tuple[Period | None, str] | None = None
    """The period and reason of the latest call that did not run (``running``, ``held``, ``done``,
    ``failed``, ``too_soon``), as the server decided it."""

    def attempts_in(self, period: Period | None) -> int:
        """Runs started in ``period`` or later (0 for None: a job without ``every`` counts none)."""
        return 0 if period is None else sum(1 for started in self.tries if started >= period.start)

    def done_in(self, period: Period | None) -> bool:
        """Whether a run that started in ``period`` or later succeeded."""
        return period is not None and self.last_success is not None and self.last_success >= period.start


class LockState(NamedTuple):
    """A lock (or semaphore) document as a waiter or an operator sees it.

    For a semaphore, ``limit`` is set, ``permits`` lists its holders (live or not: the server
    drops expired ones at its next write), ``owner`` is None and ``fencing_token`` is the latest
    token handed out.
    """

    name: str
    owner: str | None
    expires_at: datetime | None
    fencing_token: int
    ttl_ms: int | None
    holder: Mapping[str, Any]
    queue: tuple[Place, ...] = ()
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    released_at: datetime | None = None
    handed_off_at: datetime | None = None
    forced_release_at: datetime | None = None
    """Server time of the last ``mongolock release --force`` (or ``LockStore.force_release``)."""
    limit: int | None = None
    """A semaphore's limit, as its last acquire wrote it (a read-write lock's: its most readers);
    None for a lock."""
    permits: tuple[Permit, ...] = ()
    kind: str = "lock"
    """``lock``, ``semaphore``, ``rwlock``, ``election`` or ``job``."""
    job: JobRecord | None = None
    """A job's record (None for other kinds)."""

    def holds(self, token: str) -> bool:
        """Whether ``token`` owns the lease, or one of the semaphore's permits (live or not)."""
        return self.owner == token or any(permit.token == token for permit in self.permits)

    def fence_of(self, token: str) -> int:
        """The fencing token of ``token``'s lease or permit (the document's latest if it holds none)."""
        permit = next((permit for permit in self.permits if permit.token == token), None)
        return self.fencing_token if permit is None else permit.fencing_token

    @property
    def next_expiry(self) -> datetime | None:
        """When the lease, or the semaphore's earliest permit, expires (None if none is held)."""
        if self.limit is None:
            return self.expires_at
        return min((permit.expires_at for permit in self.permits), default=None)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> LockState:
        """Parse a stored lock document; ``LockDataError`` if a field the lock relies on is corrupt."""
        state = cls.from_reply(doc)
        name = state.name
        ttl_ms = doc.get("ttlMs")
        return state._replace(
            ttl_ms=ttl_ms if isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool) else None,
            holder=_mapping(doc.get("holder")),
            acquired_at=_date_or_none(doc.get("acquiredAt"), name, "acquiredAt"),
            renewed_at=_date_or_none(doc.get("renewedAt"), name, "renewedAt"),
            released_at=_date_or_none(doc.get("releasedAt"), name, "releasedAt"),
            handed_off_at=_date_or_none(doc.get("handedOffAt"), name, "handedOffAt"),
            forced_release_at=_date_or_none(_mapping(doc.get("forcedRelease")).get("at"), name, "forcedRelease.at"),
        )

    @classmethod
    def from_reply(cls, doc: Mapping[str, Any]) -> LockState:
        """Parse the fields an acquire or a release reads back (``sending.DECIDING_FIELDS``), checked
        as strictly as ``from_document`` checks them; the fields kept for operators are left unset
        (the reply does not carry them). ``LockDataError`` if one of them is corrupt."""
        name = doc.get("_id")
        if not isinstance(name, str):
            raise LockDataError(name, "_id", f"holds {_type_name(name)}, expected a string lock name")
        kind = doc.get("kind")
        if kind is not None and kind not in PERMIT_KINDS and kind != JOB_KIND:
            detail = f"holds {kind!r}, expected nothing (a lock), 'semaphore', 'rwlock', 'election' or 'job'"
            raise LockDataError(name, "kind", detail)
        owner = doc.get("owner")
        if owner is not None and not isinstance(owner, str):
            raise LockDataError(name, "owner", f"holds {_type_name(owner)}, expected a string or null")
        expires_at = _date_or_none(doc.get("expiresAt"), name, "expiresAt", strict=True)
        if expires_at is None:
            if owner is not None:
                raise LockDataError(name, "expiresAt", "is missing although the lock has an owner")
        # The store's pipelines refuse the same on the server's clock; a year of slack makes the
        # local clock good enough to say why.
        elif expires_at > datetime.now(UTC) + EXPIRY_HORIZON:
            detail = f"is {expires_at:%Y-%m-%d}, more than a year ahead: never written here"
            raise LockDataError(name, "expiresAt", detail)
        fence = doc.get("fence")
        if fence is None:
            fence = 0
        elif isinstance(fence, bool) or not isinstance(fence, int):
            raise LockDataError(name, "fence", f"holds {_type_name(fence)}, expected a 64-bit integer")
        elif not 0 <= fence < MAX_FENCE:
            raise LockDataError(name, "fence", f"holds {fence}, outside 0 to 2**62")
        queue = doc.get("queue")
        if queue is not None and not isinstance(queue, list):
            raise LockDataError(name, "queue", f"holds {_type_name(queue)}, expected an array")
        places = tuple(place for place in map(_place, queue) if place is not None) if queue else ()
        if kind is None:  # a lock's document: most replies
            return cls(name, owner, expires_at, fence, None, _NO_HOLDER, places)
        limit: int | None = None
        permits: tuple[Permit, ...] = ()
        if kind in PERMIT_KINDS:
            if owner is not None:
                raise LockDataError(name, "owner", f"is set in a {kind}, which has holders instead")
            limit, permits = _limit(doc.get("limit"), name), _permits(doc.get("holders"), name)
        return cls(
            name,
            owner,
            expires_at,
            fence,
            None,
            _NO_HOLDER,
            places,
            limit=limit,
            permits=permits,
            kind=kind,
            job=_job(doc.get("job"), name) if kind == JOB_KIND else None,
        )

    def place_of(self, token: str) -> Place | None:
        """The queue place holding ``token``, if there is one."""
        return next((place for place in self.queue if place.token == token), None)


@dataclass(frozen=True, slots=True)
class Leadership:
    """Who leads an election, as the server saw it when asked."""

    name: str
    term: int
    """The leader's term: its fencing token, above every term before it."""
    holder: Mapping[str, Any]
    """``label``, ``host`` and ``pid`` of the leading candidate."""
    since: datetime | None
    """Server time at which this term began (None on a document written by hand)."""
    time_left: float
    """Seconds until the leadership expires on the server's clock unless renewed."""
    candidates: int
    """Processes waiting to lead next (each process's candidates wait behind one place)."""


@dataclass(frozen=True, slots=True)
class LockReport:
    """A lock document with the server's view of its remaining lease, for operators.

    ``error`` is set (and ``state`` is None) when the document is corrupt, so that one bad document
    does not hide the others.
    """

    name: object
    state: LockState | None
    remaining_ms: int | None
    """Milliseconds until the lease expires on the server's clock; None when the lock is free. For
    a semaphore: until its last live permit expires; None when no permit is held."""
    error: LockDataError | None = field(default=None)
    permits_left_ms: Mapping[str, int] = field(default_factory=dict)
    """A semaphore's live permits: owner token -> milliseconds left on the server's clock."""
    server_time: datetime | None = None
    """The server's clock when this was read."""

    @property
    def live_permits(self) -> tuple[Permit, ...]:
        """A semaphore's permits still live on the server's clock when this was read."""
        state = self.state
        return () if state is None else tuple(p for p in state.permits if p.token in self.permits_left_ms)


def _place(entry: object) -> Place | None:
    """A queue entry as the server's pipelines read it; None for anything they would skip."""
    if not isinstance(entry, Mapping):
        return None
    token, ttl_ms, expires_at = entry.get("t"), entry.get("ttlMs"), entry.get("exp")
    if not isinstance(token, str) or not isinstance(expires_at, datetime):
        return None
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms < 1:
        return None
    refreshed_at = entry.get("at")
    return Place(
        token=token,
        ttl_ms=ttl_ms,
        expires_at=_utc(expires_at),
        refreshed_at=_utc(refreshed_at) if isinstance(refreshed_at, datetime) else None,
        holder=_mapping(entry.get("holder")),
        weight=weight if isinstance(weight := entry.get("w"), int) and not isinstance(weight, bool) else 1,
    )


def _job(value: object, name: str) -> JobRecord:
    """A job's record, with the fields its pipelines decide on checked as strictly as they check
    them (the rest, for people, read leniently)."""
    if value is None:
        return JobRecord()
    if not isinstance(value, Mapping):
        raise LockDataError(name, "job", f"holds {_type_name(value)}, expected a job record")
    running = value.get("run")
    if running is not None and not isinstance(running, Mapping):
        raise LockDataError(name, "job.run", f"holds {_type_name(running)}, expected a run record")
    skipped = value.get("seen")
    return JobRecord(
        every_ms=_int_or_none(value.get("every")),
        offset_ms=_int_or_none(value.get("offset")) or 0,
        min_interval_ms=_int_or_none(value.get("minInterval")),
        max_attempts=_int_or_none(value.get("maxAttempts")),
        tries=_tries(value.get("tries"), name),
        last_success=_date_or_none(value.get("lastSuccess"), name, "job.lastSuccess", strict=True),
        running=None if running is None else _job_run(running, name),
        last=_job_run(last, name) if isinstance(last := value.get("last"), Mapping) else None,
        last_ended_at=_date_or_none(value.get("lastEndedAt"), name, "job.lastEndedAt", strict=True),
        skipped=(
            (_period(skipped.get("period")), str(skipped.get("why")))
            if isinstance(skipped, Mapping) and isinstance(skipped.get("why"), str)
            else None
        ),
    )


def _tries(value: object, name: str) -> tuple[datetime, ...]:
    """A job's ``tries``: an array of dates, which its pipelines count (so checked strictly)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise LockDataError(name, "job.tries", f"holds {_type_name(value)}, expected an array of dates")
    tries = []
    for index, entry in enumerate(value):
        moment = _date_or_none(entry, name, f"job.tries.{index}", strict=True)
        if moment is None:
            raise LockDataError(name, f"job.tries.{index}", "holds nothing, expected a date")
        tries.append(moment)
    return tuple(tries)


def _job_run(value: Mapping[str, Any], name: str) -> JobRun:
    error = _mapping(value.get("error"))
    outcome = value.get("outcome")
    return JobRun(
        attempt=_int_or_none(value.get("attempt")) or 0,
        period=_period(value.get("period")),
        started_at=_date_or_none(value.get("startedAt"), name, "job.run.startedAt"),
        holder=_mapping(value.get("holder")),
        ended_at=_date_or_none(value.get("endedAt"), name, "job.run.endedAt"),
        outcome=outcome if outcome in JOB_OUTCOMES else None,
        error_type=error.get("type") if isinstance(error.get("type"), str) else None,
        error_message=error.get("message") if isinstance(error.get("message"), str) else None,
    )


def _period(value: object) -> Period | None:
    """A period as a run or a decision records it, ``{start, end}``; None if it is not one."""
    period = _mapping(value)
    start, end = period.get("start"), period.get("end")
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return None
    return Period(_utc(start), _utc(end))


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _limit(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PERMITS:
        raise LockDataError(name, "limit", f"holds {_type_name(value)} {value!r}, expected 1 to {MAX_PERMITS}")
    return value


def _permits(value: object, name: str) -> tuple[Permit, ...]:
    """A semaphore's ``holders``, checked as strictly as the store's pipelines check them: a holder
    that could not be read would be a permit nobody counts."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise LockDataError(name, "holders", f"holds {_type_name(value)}, expected an array")
    permits = []
    for index, entry in enumerate(value):
        where = f"holders.{index}"
        if not isinstance(entry, Mapping):
            raise LockDataError(name, where, f"holds {_type_name(entry)}, expected a holder document")
        token, fence, ttl_ms, weight = entry.get("o"), entry.get("fence"), entry.get("ttlMs"), entry.get("w")
        if not isinstance(token, str):
            raise LockDataError(name, f"{where}.o", f"holds {_type_name(token)}, expected an owner token")
        expires_at = _date_or_none(entry.get("exp"), name, f"{where}.exp", strict=True)
        if expires_at is None:
            raise LockDataError(name, f"{where}.exp", "is missing")
        if expires_at > datetime.now(UTC) + EXPIRY_HORIZON:
            raise LockDataError(name, f"{where}.exp", f"is {expires_at:%Y-%m-%d}, more than a year ahead")
        if isinstance(fence, bool) or not isinstance(fence, int) or not 0 <= fence < MAX_FENCE:
            raise LockDataError(name, f"{where}.fence", f"holds {_type_name(fence)} {fence!r}, expected a token")
        weight = 1 if weight is None else weight
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_PERMITS:
            raise LockDataError(
                name, f"{where}.w", f"holds {_type_name(weight)} {weight!r}, expected 1 to {MAX_PERMITS}"
            )
        permits.append(
            Permit(
                token=token,
                weight=weight,
                expires_at=expires_at,
                fencing_token=fence,
                ttl_ms=ttl_ms if isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool) else None,
                holder=_mapping(entry.get("holder")),
                acquired_at=_date_or_none(entry.get("at"), name, f"{where}.at"),
                renewed_at=_date_or_none(entry.get("renewedAt"), name, f"{where}.renewedAt"),
            )
        )
    if len({permit.token for permit in permits}) != len(permits):
        raise LockDataError(name, "holders", "lists one owner token twice")
    return tuple(permits)


def _date_or_none(value: object, name: object, field_name: str, *, strict: bool = False) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return _utc(value)
    if strict:
        # Out-of-range dates arrive as bson.DatetimeMS (the store decodes with DATETIME_AUTO).
        raise LockDataError(name, field_name, f"holds {_type_name(value)} {value!r}, expected a date")
    return None


def _utc(value: datetime) -> datetime:
    tzinfo = value.tzinfo
    if tzinfo is UTC:  # what the store decodes (tz_aware, in UTC)
        return value
    return value.replace(tzinfo=UTC) if tzinfo is None else value.astimezone(UTC)


_NO_HOLDER: Mapping[str, Any] = MappingProxyType({})
"""What a state parsed without the operators' fields (``LockState.from_reply``) holds as ``holder``."""


def _mapping(value: object) -> Mapping[str, Any]:
    if type(value) is dict:  # what the store decodes into; a Mapping check is an ABC check, slower
        return value
    return value if value is not None and isinstance(value, Mapping) else {}


def _type_name(value: object) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"
