"""The queries of a document of permits: a semaphore's, a read-write lock's and an election's.

```text
{_id, kind: "semaphore" | "rwlock" | "election", limit, fence, expiresAt,
 holders: [{o: <token>, w: <weight>, exp, fence, ttlMs, holder, at, renewedAt, r}],
 queue: [places, as a lock's, with their weight w], handedOffTo: "<token> <token> ...", handedOffAt,
 freed, releasedAt, releasedOwners, withdrawn}
```

Holders' weights add up to at most ``limit``: a semaphore's permits weigh 1; a read-write lock's
readers 1 and a writer the whole limit. Each holder has its own fencing token, from the document's
one counter. A release hands the weight it frees to the longest run of the oldest places that fits,
in the same write. An election is a semaphore of one permit whose candidates are always served in
turn.
"""

from __future__ import annotations

import functools
from typing import Any

from . import expressions
from .documents import MAX_FENCE, MAX_PERMITS
from .expressions import (
    EXPIRY_HORIZON_MS,
    FENCE_OK,
    NEXT_FENCE_IF_SANE,
    NOW,
    TEMPORARY,
    array_or_empty,
    done_with,
    new_place,
    places_without,
    request_values,
    server_plus,
    tokens_of,
    type_in,
    unexpired_places,
    with_place,
)
from .requests import Permits, PlaceRequest

_HOLDER_WELL_FORMED: dict[str, Any] = {
    "$and": [
        {"$eq": [{"$type": "$$this.o"}, "string"]},
        {"$eq": [{"$type": "$$this.exp"}, "date"]},
        {"$lte": ["$$this.exp", server_plus(expressions.SERVER_NOW, EXPIRY_HORIZON_MS)]},
        type_in("$$this.fence", "int", "long"),
        {"$gte": ["$$this.fence", 0]},
        {"$lt": ["$$this.fence", MAX_FENCE]},
        {
            "$or": [
                type_in("$$this.w", "missing", "null"),
                {
                    "$and": [
                        type_in("$$this.w", "int", "long"),
                        {"$gte": ["$$this.w", 1]},
                        {"$lte": ["$$this.w", MAX_PERMITS]},
                    ]
                },
            ]
        },
    ]
}


NEW_DOCUMENT: dict[str, Any] = {
    "$and": [
        type_in("$kind", "missing"),
        type_in("$owner", "missing"),
        type_in("$fence", "missing"),
        type_in("$holders", "missing"),
    ]
}
"""A document no lock, semaphore or read-write lock wrote yet (the upsert's bare _id, or one that
records only withdrawals)."""


def permits_sane(kind: Any) -> dict[str, Any]:
    """A document of ``kind`` with the fields its decisions read in the shapes written here, or a
    new document (the upsert's bare _id). A document of another kind, or one edited into another
    shape, is left as it is, and the caller raises LockDataError from LockState parsing."""
    return {
        "$or": [
            NEW_DOCUMENT,
            {
                "$and": [
                    {"$eq": ["$kind", kind]},
                    type_in("$limit", "int", "long"),
                    {"$gte": ["$limit", 1]},
                    {"$lte": ["$limit", MAX_PERMITS]},
                    type_in("$owner", "missing", "null"),
                    FENCE_OK,
                    type_in("$queue", "missing", "null", "array"),
                    {"$isArray": "$holders"},
                    {
                        "$eq": [
                            {"$size": {"$filter": {"input": "$holders", "cond": {"$not": [_HOLDER_WELL_FORMED]}}}},
                            0,
                        ]
                    },
                ]
            },
        ]
    }


def live_holders(now: Any) -> dict[str, Any]:
    """The holders whose permits have not expired at ``now``."""
    return {
        "$filter": {
            "input": array_or_empty("$holders"),
            "cond": {"$gt": ["$$this.exp", now]},
        }
    }


LIVE_HOLDERS = live_holders(NOW)


def entry_weight(entry: str) -> dict[str, Any]:
    """The weight of a holder or place (``$$this``, say): 1 unless it says otherwise."""
    return {"$ifNull": [f"{entry}.w", 1]}


def weight_of(holders: Any) -> dict[str, Any]:
    return {"$sum": {"$map": {"input": holders, "in": entry_weight("$$this")}}}


def latest_expiry(now: Any) -> dict[str, Any]:
    """``expiresAt`` of the document: its latest permit's expiry, or ``now`` (what the idle cleanup
    index counts from)."""
    return {"$max": [now, {"$max": {"$map": {"input": "$holders", "in": "$$this.exp"}}}]}


def holder_tokens(holders: Any) -> dict[str, Any]:
    return {"$map": {"input": holders, "in": "$$this.o"}}


def permit_entry(token: Any, ttl: Any, holder: Any, fence: Any, weight: Any, start: Any = NOW) -> dict[str, Any]:
    return {
        "o": token,
        "w": weight,
        "exp": server_plus(start, ttl),
        "fence": fence,
        "ttlMs": ttl,
        "holder": holder,
        "at": NOW,
        "renewedAt": NOW,
    }


def _permit_values(place: PlaceRequest, permits: Permits) -> dict[str, Any]:
    return {
        "me": place.token,
        "ttl": place.ttl_ms,
        "holder": dict(place.holder),
        "limit": permits.limit,
        "weight": permits.weight,
        "kind": permits.kind,
    }


def acquire_pipeline(
    place: PlaceRequest, permits: Permits, *, enqueue: bool, fair: bool
) -> list[dict[str, Any]]:
    """The acquire of a permit (a semaphore's or a read-write lock's): see ``_acquire_stages``."""
    values = {**_permit_values(place, permits), "keep": place.keep_expiry}
    return [request_values(**values), *_acquire_stages(enqueue=enqueue, fair=fair)]


@functools.cache
def _acquire_stages(*, enqueue: bool, fair: bool) -> tuple[dict[str, Any], ...]:
    """Drop expired holders; claim a permit already handed to ``me``, or take one when the live
    holders' weights leave room for ours under the request's ``limit`` (and, with ``fair``, no
    older place waits); else queue."""
    me = "$_v.me"
    my_place = {**new_place(me, "$_v.ttl", "$_v.holder"), "w": "$_v.weight"}
    my_tokens_index = {"$indexOfArray": [tokens_of("$_q"), me]}
    waiting_queue: Any = with_place("$_q", me, my_place) if enqueue else "$queue"
    renewed_mine = {
        "$map": {
            "input": "$_hs",
            "in": {
                "$cond": [
                    {"$eq": ["$$this.o", me]},
                    {
                        "$mergeObjects": [
                            "$$this",
                            {"exp": server_plus(NOW, "$_v.ttl"), "ttlMs": "$_v.ttl", "renewedAt": NOW},
                        ]
                    },
                    "$$this",
                ]
            },
        }
    }
    new_permit = permit_entry(me, "$_v.ttl", "$_v.holder", "$_nf", "$_v.weight")
    got_it = {"$or": ["$_claim", "$_take"]}
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": permits_sane("$_v.kind")}},
        {"$set": {"_q": unexpired_places(), "_hs": {"$cond": ["$_sane", LIVE_HOLDERS, []]}}},
        {
            "$set": {
                "_mine": {"$in": [me, holder_tokens("$_hs")]},
                "_gone": done_with(me, array_or_empty("$releasedOwners")),
                "_ahead": {"$cond": [{"$eq": [my_tokens_index, -1]}, {"$size": "$_q"}, my_tokens_index]} if fair else 0,
                "_nf": NEXT_FENCE_IF_SANE,
                "_room": {"$lte": [{"$add": [weight_of("$_hs"), "$_v.weight"]}, "$_v.limit"]},
            }
        },
        {
            "$set": {
                "_claim": {"$and": ["$_sane", "$_mine", {"$not": ["$_gone"]}]},
                "_take": {
                    "$and": ["$_sane", {"$not": ["$_mine"]}, {"$not": ["$_gone"]}, "$_room", {"$eq": ["$_ahead", 0]}]
                },
            }
        },
        {
            "$set": {
                "kind": {"$cond": ["$_sane", "$_v.kind", "$kind"]},
                "limit": {"$cond": ["$_sane", "$_v.limit", "$limit"]},
                "fence": {"$cond": ["$_take", "$_nf", "$fence"]},
                "holders": {
                    "$cond": [
                        "$_claim",
                        # A claim that keeps the expiry (see PlaceRequest.keep_expiry) changes nothing.
                        {"$cond": ["$_v.keep", "$_hs", renewed_mine]},
                        {
                            "$cond": [
                                "$_take",
                                {"$concatArrays": ["$_hs", [new_permit]]},
                                {"$cond": ["$_sane", "$_hs", "$holders"]},
                            ]
                        },
                    ]
                },
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": [got_it, places_without("$_q", me), {"$cond": ["$_gone", "$_q", waiting_queue]}]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_sane", latest_expiry(NOW), "$expiresAt"]}}},
        {"$unset": TEMPORARY},
    )


def renewal_pipeline(owner: str, ttl_ms: int, stamp: str) -> list[dict[str, Any]]:
    """A new expiry for ``owner``'s permit if it is still live; else no change at all (so the write
    does not count as modified)."""
    now = expressions.SERVER_NOW
    live = {"$and": [{"$eq": ["$$this.o", {"$literal": owner}]}, {"$gt": ["$$this.exp", now]}]}
    renewed = {"exp": server_plus(now, ttl_ms), "ttlMs": ttl_ms, "renewedAt": now, "r": stamp}
    return [
        {
            "$set": {
                "_live": {
                    "$and": [
                        {"$isArray": "$holders"},
                        {"$gt": [{"$size": {"$filter": {"input": "$holders", "cond": live}}}, 0]},
                    ]
                }
            }
        },
        {
            "$set": {
                "holders": {
                    "$cond": [
                        "$_live",
                        {
                            "$map": {
                                "input": "$holders",
                                "in": {"$cond": [live, {"$mergeObjects": ["$$this", renewed]}, "$$this"]},
                            }
                        },
                        "$holders",
                    ]
                }
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_live", latest_expiry(expressions.SERVER_NOW), "$expiresAt"]}}},
        {"$unset": "_live"},
    ]


def force_release_pipeline(stamp: str, owner: str | None, *, live: bool = True) -> list[dict[str, Any]]:
    """Break every live permit (or only ``owner``'s; none unless ``live``: then only a repair),
    recording them in ``forcedRelease`` with ``stamp``, and wake the waiters (``freed``); a corrupt
    document's permits are all broken and its fields reset."""
    chosen: Any = live if owner is None else {"$eq": ["$$this.o", {"$literal": owner}]}
    return [
        {"$set": {"_now": expressions.SERVER_NOW, "_sane": permits_sane("$kind")}},
        {
            "$set": {
                "_broken": {
                    "$cond": [
                        "$_sane",
                        {"$filter": {"input": LIVE_HOLDERS, "cond": chosen}},
                        array_or_empty("$holders"),
                    ]
                }
            }
        },
        {"$set": {"_break": {"$or": [{"$not": ["$_sane"]}, {"$gt": [{"$size": "$_broken"}, 0]}]}}},
        {
            "$set": {
                "forcedRelease": {
                    "$cond": ["$_break", {"by": stamp, "at": NOW, "permits": "$_broken"}, "$forcedRelease"]
                },
                "holders": {
                    "$cond": ["$_sane", {"$filter": {"input": LIVE_HOLDERS, "cond": {"$not": [chosen]}}}, []]
                },
                "limit": {"$cond": ["$_sane", "$limit", 1]},
                "fence": {"$cond": [FENCE_OK, "$fence", {"$literal": 0}]},
                "queue": array_or_empty("$queue"),
                "freed": {"$cond": ["$_break", stamp, "$freed"]},
                "releasedAt": {"$cond": ["$_break", NOW, "$releasedAt"]},
            }
        },
        {"$unset": ["_now", "_sane", "_broken", "_break"]},
    ]


def put_first_pipeline(kind: str, name: str, owner: str, label: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The filter and pipeline that move the oldest live place labelled ``label`` to the front of
    the queue, so that the next hand-off goes to it; only while ``owner`` holds a permit there
    (the queue is left as it is when no live place has that label)."""
    query = {"_id": name, "kind": kind, "holders.o": owner, "queue.holder.label": label}
    labelled = {
        "$and": [
            {"$eq": ["$$this.holder.label", {"$literal": label}]},  # never read as a field path
            {"$gt": ["$$this.exp", expressions.SERVER_NOW]},
        ]
    }
    rest = {"$filter": {"input": "$queue", "cond": {"$ne": ["$$this.t", "$_chosen.t"]}}}
    chosen = {"$first": [{"$filter": {"input": array_or_empty("$queue"), "cond": labelled}}]}
    moved = {"$concatArrays": [["$_chosen"], rest]}
    return query, [
        {"$set": {"_chosen": chosen}},
        {"$set": {"queue": {"$cond": [{"$eq": [{"$type": "$_chosen"}, "object"]}, moved, "$queue"]}}},
        {"$unset": "_chosen"},
    ]
