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
from typing import Any, NamedTuple

from .errors import LockDataError

# Tokens are the server clock in microseconds (about 1.8e15 today); far below this bound, which
# keeps ``fence + 1`` clear of int64 overflow on the server.
MAX_FENCE = 2**62
# No lease is written more than this far ahead (the longest TTL, a year and a day, plus a day).
EXPIRY_HORIZON = timedelta(days=368)


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


class LockState(NamedTuple):
    """A lock document as a waiter or an operator sees it."""

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

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> LockState:
        """Parse a stored lock document; ``LockDataError`` if a field the lock relies on is corrupt."""
        name = doc.get("_id")
        if not isinstance(name, str):
            raise LockDataError(name, "_id", f"holds {_type_name(name)}, expected a string lock name")
        owner = doc.get("owner")
        if owner is not None and not isinstance(owner, str):
            raise LockDataError(name, "owner", f"holds {_type_name(owner)}, expected a string or null")
        expires_at = _date_or_none(doc.get("expiresAt"), name, "expiresAt", strict=True)
        if owner is not None and expires_at is None:
            raise LockDataError(name, "expiresAt", "is missing although the lock has an owner")
        # The store's pipelines refuse the same on the server's clock; a year of slack makes the
        # local clock good enough to say why.
        if expires_at is not None and expires_at > datetime.now(UTC) + EXPIRY_HORIZON:
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
        ttl_ms = doc.get("ttlMs")
        return cls(
            name=name,
            owner=owner,
            expires_at=expires_at,
            fencing_token=fence,
            ttl_ms=ttl_ms if isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool) else None,
            holder=_mapping(doc.get("holder")),
            queue=tuple(place for place in map(_place, queue or ()) if place is not None),
            acquired_at=_date_or_none(doc.get("acquiredAt"), name, "acquiredAt"),
            renewed_at=_date_or_none(doc.get("renewedAt"), name, "renewedAt"),
            released_at=_date_or_none(doc.get("releasedAt"), name, "releasedAt"),
            handed_off_at=_date_or_none(doc.get("handedOffAt"), name, "handedOffAt"),
            forced_release_at=_date_or_none(_mapping(doc.get("forcedRelease")).get("at"), name, "forcedRelease.at"),
        )

    def place_of(self, token: str) -> Place | None:
        """The queue place holding ``token``, if there is one."""
        return next((place for place in self.queue if place.token == token), None)


@dataclass(frozen=True, slots=True)
class LockReport:
    """A lock document with the server's view of its remaining lease, for operators.

    ``error`` is set (and ``state`` is None) when the document is corrupt, so that one bad document
    does not hide the others.
    """

    name: object
    state: LockState | None
    remaining_ms: int | None
    """Milliseconds until the lease expires on the server's clock; None when the lock is free."""
    error: LockDataError | None = field(default=None)


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
    )


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
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _mapping(value: object) -> Mapping[str, Any]:
    if type(value) is dict:  # what the store decodes into; a Mapping check is an ABC check, slower
        return value
    return value if value is not None and isinstance(value, Mapping) else {}


def _type_name(value: object) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"
