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
    places_ahead,
    places_without,
    request_values,
    server_plus,
    tokens_of,
    type_in,
    unexpired_places,
    with_place,
)
from .requests import Filter, Permits, Pipeline, PlaceRequest, Stage, encoded_once

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


def acquire_pipeline(place: PlaceRequest, permits: Permits, *, enqueue: bool, fair: bool) -> Pipeline:
    """Take a permit for ``place`` (a semaphore's, a read-write lock's, an election's), or queue it.

    Matches: the document's ``_id`` (an upserting ``findAndModify``).
    Changes: drops expired holders; claims a permit already handed to ``place``, or takes one when
    the live holders' weights leave room for its weight under the request's ``limit`` (and, with
    ``fair``, no older place waits): a new entry in ``holders`` with the next ``fence``; else, with
    ``enqueue``, queues or refreshes the place. A token already released or withdrawn takes
    nothing; a document that is not sane, or of another kind, is left unchanged.
    Returns: the document after the write (the caller holds a permit when ``holders`` has its token).
    """
    values = {**_permit_values(place, permits), "keep": place.keep_expiry}
    return [request_values(**values), *_acquire_stages(enqueue=enqueue, fair=fair)]


@encoded_once
def _acquire_stages(*, enqueue: bool, fair: bool) -> tuple[Stage, ...]:
    me = "$_request.me"
    my_place = {**new_place(me, "$_request.ttl", "$_request.holder"), "w": "$_request.weight"}
    my_tokens_index = {"$indexOfArray": [tokens_of("$_queue"), me]}
    waiting_queue: Any = with_place("$_queue", me, my_place) if enqueue else "$queue"
    renewed_mine = {
        "$map": {
            "input": "$_live_holders",
            "in": {
                "$cond": [
                    {"$eq": ["$$this.o", me]},
                    {
                        "$mergeObjects": [
                            "$$this",
                            {"exp": server_plus(NOW, "$_request.ttl"), "ttlMs": "$_request.ttl", "renewedAt": NOW},
                        ]
                    },
                    "$$this",
                ]
            },
        }
    }
    new_permit = permit_entry(me, "$_request.ttl", "$_request.holder", "$_next_fence", "$_request.weight")
    got_it = {"$or": ["$_claim", "$_take"]}
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": permits_sane("$_request.kind")}},
        {"$set": {"_queue": unexpired_places(), "_live_holders": {"$cond": ["$_sane", LIVE_HOLDERS, []]}}},
        {
            "$set": {
                "_mine": {"$in": [me, holder_tokens("$_live_holders")]},
                "_gone": done_with(me, array_or_empty("$releasedOwners")),
                "_ahead": places_ahead(my_tokens_index) if fair else 0,
                "_next_fence": NEXT_FENCE_IF_SANE,
                "_room": {"$lte": [{"$add": [weight_of("$_live_holders"), "$_request.weight"]}, "$_request.limit"]},
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
                "kind": {"$cond": ["$_sane", "$_request.kind", "$kind"]},
                "limit": {"$cond": ["$_sane", "$_request.limit", "$limit"]},
                "fence": {"$cond": ["$_take", "$_next_fence", "$fence"]},
                "holders": {
                    "$cond": [
                        "$_claim",
                        # A claim that keeps the expiry (see PlaceRequest.keep_expiry) changes nothing.
                        {"$cond": ["$_request.keep", "$_live_holders", renewed_mine]},
                        {
                            "$cond": [
                                "$_take",
                                {"$concatArrays": ["$_live_holders", [new_permit]]},
                                {"$cond": ["$_sane", "$_live_holders", "$holders"]},
                            ]
                        },
                    ]
                },
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {
                            "$cond": [
                                got_it, places_without("$_queue", me), {"$cond": ["$_gone", "$_queue", waiting_queue]}
                            ]
                        },
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_sane", latest_expiry(NOW), "$expiresAt"]}}},
        {"$unset": TEMPORARY},
    )


def renewal_pipeline(owner: str, ttl_ms: int, stamp: str) -> Pipeline:
    """Renew ``owner``'s permit (``LockStore.renew``).

    Matches: the ``_id``, the kind and a holder ``owner`` (``kinds.PermitQueries.renewal``).
    Changes: if ``owner``'s permit is still live, its ``exp``, ``ttlMs``, ``renewedAt`` and ``r``
    (``stamp``) and the document's ``expiresAt``; else nothing at all (the write does not count
    as modified).
    Returns: nothing (the caller reads ``modified_count``).
    """
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


def force_release_pipeline(stamp: str, owner: str | None, *, live: bool = True) -> Pipeline:
    """Break permits: the operator's break-glass (``reports.force_release``).

    Matches: the ``_id`` (and the owner token the operator named, ``reports``).
    Changes: every live permit (or only ``owner``'s; none unless ``live``: then only a repair) is
    removed from ``holders`` and recorded in ``forcedRelease`` with ``stamp``, and ``freed`` wakes
    the waiters; a corrupt document's permits are all broken and its fields reset.
    Returns: the document after the write.
    """
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


def put_first_pipeline(kind: str, name: str, owner: str, label: str) -> tuple[Filter, Pipeline]:
    """Put a labelled place first in line (an election's leader handing over, ``LockStore.put_first``).

    Matches: the ``_id``, the kind, a holder ``owner`` and a queued place labelled ``label``.
    Changes: moves the oldest live place labelled ``label`` to the front of the queue, so that the
    next hand-off goes to it (the queue is left as it is when no live place has that label).
    Returns: the filter and the pipeline (the caller reads ``queue`` from the document after).
    """
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
