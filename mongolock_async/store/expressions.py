"""Pipeline expressions every kind of document shares: the server's clock, a request's values,
lease and fence checks, and the queue of places.

Time is always the server's: expiry is written and compared with ``$$NOW`` inside the query, never
with a client clock. ``$$NOW`` goes through ``{$toDate: {$toLong: "$$NOW"}}``, which is the identity
on MongoDB and works around an embedded test server that compares raw ``$$NOW`` with stored dates
wrongly. Array fields are read with ``$map``/``$filter`` rather than ``"$queue.t"`` paths, which
that server does not resolve.

``queue`` holds one *place* per waiting process: the owner token the lease is handed to when the
place's turn comes. Places expire (``exp``) unless their process refreshes them; expired or
malformed places are ignored and pruned by the next write.

Fencing tokens are ``max(previous + 1, server clock in microseconds)``: the floor keeps them
increasing even after an idle document was purged and re-created (a purge needs at least an hour
of idleness, in which the floor grows by 3.6e9).

The pipelines of each kind read ``SERVER_NOW`` from this module when they are built (they are
built once per shape of request and cached), so a test can set the server's time here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from .documents import EXPIRY_HORIZON, MAX_FENCE
from .requests import Pipeline

SERVER_NOW: dict[str, Any] = {"$toDate": {"$toLong": "$$NOW"}}

# The longest lease a handle may ask for. A stored expiry further ahead than this (plus a day for
# clock differences) was not written by this library, and a lease that never expires is refused.
MAX_TTL_MS = 366 * 86_400_000  # _validate.MAX_TTL
EXPIRY_HORIZON_MS = int(EXPIRY_HORIZON.total_seconds() * 1000)
NOW = "$_now"  # in pipelines, after the first stage has computed it once
# The temporary fields a lock's or permits' pipeline computes and removes before it writes. Their
# names say what they hold; spelling them out costs about 4 % more bytes per request (an acquire's
# pipeline is 5.1 kB, a semaphore's release 9.5 kB) than the one- and two-letter names they replaced.
TEMPORARY = [
    "_request", "_now", "_sane", "_queue", "_live", "_mine", "_ahead", "_claim", "_take", "_own", "_candidates",
    "_handee", "_handed", "_remote", "_live_holders", "_next_fence", "_rest", "_room", "_held", "_gone", "_hand",
    "_handoff",
]  # fmt: skip



# -- expressions ----------------------------------------------------------------------------------


def array_or_empty(field: str) -> dict[str, Any]:
    """The array at ``field``, or an empty one where the document has none (or something else)."""
    return {"$cond": [{"$isArray": field}, field, {"$literal": []}]}


def type_in(expression: str, *types: str) -> dict[str, Any]:
    return {"$in": [{"$type": expression}, list(types)]}


def server_plus(start: Any, ttl_ms: Any) -> dict[str, Any]:
    # $add of a date and milliseconds, not $dateAdd: that one is missing from the Stable API (V1)
    # of MongoDB 5.0.0 to 5.0.x before SERVER-60899, so a strict-API client there would be refused.
    return {"$add": [start, ttl_ms]}


def not_before(moment: Any, now: Any) -> dict[str, Any]:
    """``now``, or ``moment`` (a place's ``at``) if that is a later date.

    A write's ``$$NOW`` is fixed when the server parses the command, also through the retries of
    a write conflict (src/mongo/db/commands/find_and_modify.cpp and write_commands.cpp set the
    runtime constants once per command; a mongos sets them for the shards,
    src/mongo/s/commands/cluster_find_and_modify_cmd.cpp): a release that waited out a conflict can
    be applied after a place's later write with an earlier ``$$NOW``. The waiter counts its lease
    from that write's send time, so a hand-off runs from the place's ``at`` at the earliest.
    """
    return {"$cond": [{"$eq": [{"$type": moment}, "date"]}, {"$max": [moment, now]}, now]}


# A live lease, judged without the pipelines' temporary fields (in reads and single-stage updates).
LEASE_LIVE: dict[str, Any] = {
    "$and": [
        {"$eq": [{"$type": "$owner"}, "string"]},
        {"$eq": [{"$type": "$expiresAt"}, "date"]},
        {"$gt": ["$expiresAt", SERVER_NOW]},
    ]
}
FENCE_OK: dict[str, Any] = {
    "$or": [
        type_in("$fence", "missing", "null"),
        {"$and": [type_in("$fence", "int", "long"), {"$gte": ["$fence", 0]}, {"$lt": ["$fence", MAX_FENCE]}]},
    ]
}
# The fields a decision depends on have the types this library writes. Expressions on a corrupt
# document would otherwise fail on the server, or worse, succeed with a wrong answer (a date of
# year 9999 would be a lease that never expires).
LEASE_FIELDS_SANE: dict[str, Any] = {
    "$and": [
        type_in("$owner", "missing", "null", "string"),
        {
            "$or": [
                {"$and": [type_in("$expiresAt", "missing", "null"), {"$ne": [{"$type": "$owner"}, "string"]}]},
                {
                    "$and": [
                        {"$eq": [{"$type": "$expiresAt"}, "date"]},
                        {"$lte": ["$expiresAt", server_plus(SERVER_NOW, EXPIRY_HORIZON_MS)]},
                    ]
                },
            ]
        },
        FENCE_OK,
        type_in("$queue", "missing", "null", "array"),
    ]
}
NEXT_FENCE: dict[str, Any] = {
    "$max": [
        {"$add": [{"$toLong": {"$ifNull": ["$fence", 0]}}, 1]},
        {"$multiply": [{"$toLong": NOW}, 1000]},
    ]
}
# The next fence, only on a sane document: $toLong of a fence edited into NaN, a string, an object or
# a number beyond a long fails the whole request (ExpressionConvert in
# src/mongo/db/pipeline/expression.cpp raises ConversionFailure "... with no onError value"), where
# the caller should get LockDataError for an unchanged document. $cond evaluates only the branch it
# takes (ExpressionCond::evaluate, same file).
NEXT_FENCE_IF_SANE: dict[str, Any] = {"$cond": ["$_sane", NEXT_FENCE, None]}


def unexpired_places(excluding: str | None = None) -> dict[str, Any]:
    """The queue's well-formed, unexpired places, oldest first (optionally without the one whose
    token is at the field path ``excluding``)."""
    conditions: list[Any] = [
        {"$eq": [{"$type": "$$this.t"}, "string"]},
        {"$eq": [{"$type": "$$this.exp"}, "date"]},
        {"$in": [{"$type": "$$this.ttlMs"}, ["int", "long"]]},
        {"$gte": ["$$this.ttlMs", 1]},
        {"$lte": ["$$this.ttlMs", MAX_TTL_MS]},
        {"$gt": ["$$this.exp", NOW]},
        # A place's weight (a semaphore's or a read-write lock's) is 1 unless it says otherwise.
        # ("null" too: the embedded test server types a missing field of $$this as null.)
        {"$in": [{"$type": "$$this.w"}, ["missing", "null", "int", "long"]]},
    ]
    if excluding is not None:
        conditions.append({"$ne": ["$$this.t", excluding]})
    return {
        "$filter": {
            "input": array_or_empty("$queue"),
            "cond": {"$and": conditions},
        }
    }


def places_ahead(my_index: Any) -> dict[str, Any]:
    """How many live places (``$_queue``) are ahead of the request's: all of them if it has none
    (``my_index``, its index among their tokens, is -1)."""
    return {"$cond": [{"$eq": [my_index, -1]}, {"$size": "$_queue"}, my_index]}


def places_staying(places: Any) -> dict[str, Any]:
    """``places`` without those a withdrawal takes out (the tokens of ``$_request.leaving``)."""
    return {"$filter": {"input": places, "cond": {"$not": [{"$in": ["$$this.t", "$_request.leaving"]}]}}}


def places_without(places: Any, token: str) -> dict[str, Any]:
    """``places`` without the one holding ``token`` (a field path, such as ``$_request.me``)."""
    return {"$filter": {"input": places, "cond": {"$ne": ["$$this.t", token]}}}


def tokens_of(places: Any) -> dict[str, Any]:
    return {"$map": {"input": places, "in": "$$this.t"}}


def new_place(token: str, ttl: str, holder: str, follower: tuple[str, str] | None = None) -> dict[str, Any]:
    """A place written now, from field paths of the request's values (see ``request_values``)."""
    written: dict[str, Any] = {"t": token, "ttlMs": ttl, "holder": holder, "at": NOW, "exp": server_plus(NOW, ttl)}
    if follower is not None:
        written["n"], written["nttl"] = follower
    return written


def with_place(places: Any, token: Any, place: dict[str, Any]) -> dict[str, Any]:
    """``places`` with ``place`` (the place of ``token``) rewritten where ``token`` stands (its
    length is the new one's, its ``at`` not moved back), or queued last."""
    return {
        "$cond": [
            {"$in": [token, tokens_of(places)]},
            {
                "$map": {
                    "input": places,
                    "in": {
                        "$cond": [
                            {"$eq": ["$$this.t", token]},
                            {"$mergeObjects": [place, {"at": not_before("$$this.at", NOW)}]},
                            "$$this",
                        ]
                    },
                }
            },
            {"$concatArrays": [places, [place]]},
        ]
    }


# Withdrawn place tokens a document remembers: an attempt of a waiter that gave up, cut off by its
# bound and applied by the server after the withdrawal, must not queue the place again (or take
# the lock for nobody). Tokens are never reused, so remembering the last few is enough.
_WITHDRAWALS_REMEMBERED = 64


def done_with(token: Any, released: Any) -> dict[str, Any]:
    """Whether ``token`` is done with: its place was withdrawn (its owner gave up waiting), or it
    held a lease (a permit) that it released (``released``: the tokens a document remembers
    releasing). Its process never sends it again then: it moved on to new tokens.

    A request of such a token that the server applies late (cut off by its bound, still on its
    way) must take, claim and queue nothing. A waiter's attempt cut off by its timeout lands when it
    lands; meanwhile the next waiter of its process attempts again with the same token, takes the
    lock, runs and releases. Were the late attempt applied as an attempt, it would take the free
    lock for that token, a lease nobody holds, for a TTL; or, the lock held again by then, queue a
    place for it, and the holder's release would hand the lock to it: a lease nobody holds for a
    TTL, after a place that lasted one (tests/faults/test_late_requests.py). The memory is bounded (the
    last 64 withdrawals; a lock's releases while the lease they ended would have lasted, at most
    16, and its latest; a semaphore's last 64): a request that lands later than that is applied
    as an attempt again, and what it leaves lasts its TTL, as any outcome lost in transit."""
    return {"$or": [{"$in": [token, array_or_empty("$withdrawn")]}, {"$in": [token, released]}]}


def remember_withdrawals() -> dict[str, Any]:
    """``withdrawn`` with the tokens of a ``leaving`` request added (the last few kept)."""
    earlier = array_or_empty("$withdrawn")
    return {"$slice": [{"$concatArrays": [earlier, "$_request.leaving"]}, -_WITHDRAWALS_REMEMBERED]}


def first_or_null(array: Any) -> dict[str, Any]:
    return {"$ifNull": [{"$first": [array]}, None]}


def request_values(**values: Any) -> dict[str, Any]:
    """The first stage of a pipeline: the request's own values, in the temporary field ``_request``.

    Every later stage refers to them as ``$_request.<name>``, so the stages are constants built once per
    shape of request (cached), and a request builds only this one small stage: rebuilding a whole
    pipeline, some hundreds of objects, for each request cost more client CPU than sending it.
    ``$literal`` keeps a value from being read as an expression (a label may start with ``$``).
    """
    return {"$set": {"_request": {"$literal": values}}}


def new_stamp() -> str:
    return secrets.token_hex(8)


def cond(condition: Any, then: Any, otherwise: Any) -> dict[str, Any]:
    return {"$cond": [condition, then, otherwise]}


def refresh_place(token: str, ttl_ms: int) -> Pipeline:
    return [
        {
            "$set": {
                "queue": {
                    "$map": {
                        "input": "$queue",
                        "in": {
                            "$cond": [
                                {"$eq": ["$$this.t", {"$literal": token}]},
                                {
                                    "$mergeObjects": [
                                        "$$this",
                                        {
                                            "exp": server_plus(SERVER_NOW, ttl_ms),
                                            "at": not_before("$$this.at", SERVER_NOW),
                                        },
                                    ]
                                },
                                "$$this",
                            ]
                        },
                    }
                }
            }
        }
    ]


def mapping_or_empty(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
