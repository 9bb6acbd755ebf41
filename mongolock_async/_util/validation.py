"""Argument checks that run before any I/O, with messages that name the argument."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Literal, cast

from pymongo.collection import Collection as SyncCollection
from pymongo.write_concern import WriteConcern

from .collection_types import AsyncCollection

MAX_NAME_LENGTH = 1024
MAX_LABEL_BYTES = 128
"""The longest ``label``, in bytes of UTF-8. Every holder and every waiting place stores it, and a
semaphore or read-write lock keeps up to 10,000 holders (documents.MAX_PERMITS) and its queue in
one document, which MongoDB caps at 16 MB: at this bound and the longest host name (255 bytes),
10,000 holders take about 6 MB (tests/unit/test_validation.py builds that document)."""
# Expiry is stored with millisecond precision on the server.
MIN_TTL = 0.001
# The longest lease (a year and a day): expiries are computed on the server, and a stored
# expiry further ahead is treated as corrupt, never as a lease that never expires.
MAX_TTL = 366 * 86_400.0
MAX_DURATION = MAX_TTL
"""The longest duration a job stores (``every``, ``min_interval``, ``hold_at_least``), in seconds:
a year and a day, as the longest TTL. They are stored in milliseconds and added to server dates;
unbounded, 1e17 s overflows BSON's 64-bit integers and 3e11 s makes dates past the year 9999,
which no reader (Python's ``datetime`` among them) can represent."""
_COLLECTION_METHODS = ("find_one_and_update", "update_one", "update_many", "find_one", "find", "with_options")


def lock_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    if "\x00" in name:
        raise ValueError("name must not contain NUL characters")
    _utf8(name, "name")
    return name


def _utf8(value: str, argument: str) -> None:
    # BSON strings are UTF-8: a lone surrogate (say, from a bad decode) cannot be sent.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{argument} must be encodable as UTF-8 ({error.reason} at position {error.start})") from None


def seconds(value: object, argument: str, *, minimum: float = 0.0, allow_zero: bool = False) -> float:
    """A finite number of seconds, ``> minimum`` (or ``>=`` when ``allow_zero`` and it is 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{argument} must be finite, got {value!r}")
    if allow_zero and number == 0:
        return number
    if number <= 0 or number < minimum:
        bound = f"at least {minimum:g}" if minimum else ("non-negative" if allow_zero else "positive")
        raise ValueError(f"{argument} must be {bound}, got {value!r}")
    return number


def duration(value: object, argument: str, *, allow_zero: bool = False, maximum: float = MAX_DURATION) -> float:
    """A ``timedelta`` or a number of seconds, as seconds: positive (or with ``allow_zero`` also 0)
    and at most ``maximum`` (default ``MAX_DURATION``)."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a datetime.timedelta or a number of seconds, not {type(value).__name__}")
    number = seconds(value, argument, allow_zero=allow_zero)
    if number > maximum:
        raise ValueError(f"{argument} must be at most {maximum / 86_400:g} days ({maximum:.0f} s), got {number:g} s")
    return number


def ttl(value: object, argument: str = "ttl") -> float:
    number = seconds(value, argument, minimum=MIN_TTL)
    if number > MAX_TTL:
        raise ValueError(f"{argument} must be at most {MAX_TTL:g} s (a year and a day), got {value!r}")
    return number


def optional_timeout(value: object, argument: str = "timeout") -> float | None:
    if value is None:
        return None
    return seconds(value, argument, allow_zero=True)


def unreachable_timeout(value: object) -> float | Literal["server_selection"] | None:
    if value is None or value == "server_selection":
        return None if value is None else "server_selection"
    if isinstance(value, str):
        raise ValueError(f"unreachable_timeout must be seconds, None or 'server_selection', not {value!r}")
    return seconds(value, "unreachable_timeout", allow_zero=True)


def timeout_needs_blocking(blocking: bool, timeout: float | None) -> None:
    if not blocking and timeout is not None:
        raise ValueError("timeout cannot be combined with blocking=False (a non-blocking acquire tries once)")


def flag(value: object, argument: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")
    return value


def optional_label(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"label must be a str or None, not {type(value).__name__}")
    _utf8(value, "label")
    size = len(value.encode("utf-8"))
    if size > MAX_LABEL_BYTES:
        raise ValueError(f"label must be at most {MAX_LABEL_BYTES} bytes in UTF-8, got {size}")
    return value


def write_concern(value: object) -> WriteConcern:
    """Only majority-acknowledged writes: a ``w: 1`` acknowledgement can be rolled back when the
    primary fails over, and a rolled-back acquisition means two holders and a reused fencing token."""
    if not isinstance(value, WriteConcern):
        raise TypeError(f"write_concern must be a pymongo.write_concern.WriteConcern, not {type(value).__name__}")
    if value.document.get("w") != "majority":
        raise ValueError(
            f"write_concern must have w='majority', got {value.document or 'the server default'}: an acquisition "
            "acknowledged by fewer nodes can be rolled back at a failover, giving two holders and reused fencing "
            "tokens (j and wtimeout may be set)"
        )
    return value


def async_collection(collection: object) -> AsyncCollection:
    """Accept a PyMongo ``AsyncCollection`` or a Motor collection; refuse a blocking one."""
    if isinstance(collection, SyncCollection):
        raise TypeError(
            "collection is a blocking pymongo Collection; pass an async one "
            "(pymongo.AsyncMongoClient(...)[db][coll] or a Motor collection)"
        )
    missing = [method for method in _COLLECTION_METHODS if not callable(getattr(collection, method, None))]
    if missing or not isinstance(getattr(collection, "full_name", None), str):
        raise TypeError(
            f"collection must be a PyMongo AsyncCollection or a Motor collection, not {type(collection).__name__}"
        )
    return cast(AsyncCollection, collection)  # its methods were checked just above
