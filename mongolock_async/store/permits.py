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
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..documents import MAX_FENCE, MAX_PERMITS
from . import expressions
from .expressions import (
    _EXPIRY_HORIZON_MS,
    _FENCE_OK,
    _NEXT_FENCE_IF_SANE,
    _NOW,
    _TEMPORARY,
    _array_or_empty,
    _live_places,
    _new_place,
    _not_before,
    _remember_withdrawals,
    _server_plus,
    _stamp,
    _tokens,
    _type_in,
    _values,
    _with_place,
    _withdrawn,
    _without,
)

if TYPE_CHECKING:
    from .kinds import Permits, PlaceRequest

_HOLDER_WELL_FORMED: dict[str, Any] = {
    "$and": [
        {"$eq": [{"$type": "$$this.o"}, "string"]},
        {"$eq": [{"$type": "$$this.exp"}, "date"]},
        {"$lte": ["$$this.exp", _server_plus(expressions.SERVER_NOW, _EXPIRY_HORIZON_MS)]},
        _type_in("$$this.fence", "int", "long"),
        {"$gte": ["$$this.fence", 0]},
        {"$lt": ["$$this.fence", MAX_FENCE]},
        {
            "$or": [
                _type_in("$$this.w", "missing", "null"),
                {
                    "$and": [
                        _type_in("$$this.w", "int", "long"),
                        {"$gte": ["$$this.w", 1]},
                        {"$lte": ["$$this.w", MAX_PERMITS]},
                    ]
                },
            ]
        },
    ]
}


def _permits_sane(kind: Any) -> dict[str, Any]:
    """A document of ``kind`` with the fields its decisions read in the shapes written here, or a
    new document (the upsert's bare _id). A document of another kind, or one edited into another
    shape, is left as it is, and the caller raises LockDataError from LockState parsing."""
    return {
        "$or": [
            {
                "$and": [
                    _type_in("$kind", "missing"),
                    _type_in("$owner", "missing"),
                    _type_in("$fence", "missing"),
                    _type_in("$holders", "missing"),
                ]
            },
            {
                "$and": [
                    {"$eq": ["$kind", kind]},
                    _type_in("$limit", "int", "long"),
                    {"$gte": ["$limit", 1]},
                    {"$lte": ["$limit", MAX_PERMITS]},
                    _type_in("$owner", "missing", "null"),
                    _FENCE_OK,
                    _type_in("$queue", "missing", "null", "array"),
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


def _live_holders(now: Any) -> dict[str, Any]:
    """The holders whose permits have not expired at ``now``."""
    return {
        "$filter": {
            "input": _array_or_empty("$holders"),
            "cond": {"$gt": ["$$this.exp", now]},
        }
    }


_LIVE_HOLDERS = _live_holders(_NOW)


def _weight(entry: str) -> dict[str, Any]:
    """The weight of a holder or place (``$$this``, say): 1 unless it says otherwise."""
    return {"$ifNull": [f"{entry}.w", 1]}


def _weight_of(holders: Any) -> dict[str, Any]:
    return {"$sum": {"$map": {"input": holders, "in": _weight("$$this")}}}


def _latest_expiry(now: Any) -> dict[str, Any]:
    """``expiresAt`` of the document: its latest permit's expiry, or ``now`` (what the idle cleanup
    index counts from)."""
    return {"$max": [now, {"$max": {"$map": {"input": "$holders", "in": "$$this.exp"}}}]}


def _holder_tokens(holders: Any) -> dict[str, Any]:
    return {"$map": {"input": holders, "in": "$$this.o"}}


def _new_permit(token: Any, ttl: Any, holder: Any, fence: Any, weight: Any, start: Any = _NOW) -> dict[str, Any]:
    return {
        "o": token,
        "w": weight,
        "exp": _server_plus(start, ttl),
        "fence": fence,
        "ttlMs": ttl,
        "holder": holder,
        "at": _NOW,
        "renewedAt": _NOW,
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
    return [_values(**_permit_values(place, permits)), *_acquire_stages(enqueue=enqueue, fair=fair)]


@functools.cache
def _acquire_stages(*, enqueue: bool, fair: bool) -> tuple[dict[str, Any], ...]:
    """Drop expired holders; claim a permit already handed to ``me``, or take one when the live
    holders' weights leave room for ours under the request's ``limit`` (and, with ``fair``, no
    older place waits); else queue."""
    me = "$_v.me"
    my_place = {**_new_place(me, "$_v.ttl", "$_v.holder"), "w": "$_v.weight"}
    my_tokens_index = {"$indexOfArray": [_tokens("$_q"), me]}
    waiting_queue: Any = _with_place("$_q", me, my_place) if enqueue else "$queue"
    renewed_mine = {
        "$map": {
            "input": "$_hs",
            "in": {
                "$cond": [
                    {"$eq": ["$$this.o", me]},
                    {
                        "$mergeObjects": [
                            "$$this",
                            {"exp": _server_plus(_NOW, "$_v.ttl"), "ttlMs": "$_v.ttl", "renewedAt": _NOW},
                        ]
                    },
                    "$$this",
                ]
            },
        }
    }
    new_permit = _new_permit(me, "$_v.ttl", "$_v.holder", "$_nf", "$_v.weight")
    got_it = {"$or": ["$_claim", "$_take"]}
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": _permits_sane("$_v.kind")}},
        {"$set": {"_q": _live_places(), "_hs": {"$cond": ["$_sane", _LIVE_HOLDERS, []]}}},
        {
            "$set": {
                "_mine": {"$in": [me, _holder_tokens("$_hs")]},
                "_gone": _withdrawn(me),
                "_ahead": {"$cond": [{"$eq": [my_tokens_index, -1]}, {"$size": "$_q"}, my_tokens_index]} if fair else 0,
                "_nf": _NEXT_FENCE_IF_SANE,
                "_room": {"$lte": [{"$add": [_weight_of("$_hs"), "$_v.weight"]}, "$_v.limit"]},
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
                        renewed_mine,
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
                        {"$cond": [got_it, _without("$_q", me), {"$cond": ["$_gone", "$_q", waiting_queue]}]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_sane", _latest_expiry(_NOW), "$expiresAt"]}}},
        {"$unset": _TEMPORARY},
    )


def release_pipeline(
    owner: str | None,
    successor: PlaceRequest | None,
    permits: Permits,
    *,
    fair: bool,
    successor_first: bool,
    leaving: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Return ``owner``'s permit and hand the weight it frees on, as ``_release_pipeline`` does a
    lock's lease; with ``leaving``, withdraw those places, and hand on a permit handed to one of
    them meanwhile."""
    values: dict[str, Any] = {"me": owner, "leaving": list(leaving), "stamp": _stamp(), "kind": permits.kind}
    if successor is not None:
        values.update(
            successor=successor.token,
            successorTtl=successor.ttl_ms,
            successorHolder=dict(successor.holder),
            successorWeight=successor.weight,
        )
    shape = {"successor": successor is not None, "fair": fair, "successor_first": successor_first}
    return [_values(**values), *_release_stages(**shape, leaving=bool(leaving))]


# Released owner tokens a document remembers, so that a release sent again after a lost reply
# recognises its own success among the releases of other holders meanwhile.
_RELEASES_REMEMBERED = 64


# A release's server work must grow linearly with the places queued (a read-write lock's writer
# hands the lock to every reader queued before the next writer, up to MAX_PERMITS of them), so
# nothing below grows a string or an array inside $reduce: $concat and $concatArrays copy their
# inputs (ExpressionConcat/ExpressionConcatArrays::evaluate build a new value each time,
# src/mongo/db/pipeline/expression.cpp), which there made the work quadratic in the places.

# Tokens joined per run in a round of ``_joined``, and its rounds: _JOIN_RUN ** _JOIN_ROUNDS >
# MAX_PERMITS, the most places one release can hand to (each weighs at least 1).
_JOIN_RUN = 22
_JOIN_ROUNDS = math.ceil(math.log(MAX_PERMITS + 1, _JOIN_RUN))


def _joined(tokens: Any) -> dict[str, Any]:
    """``tokens`` in one string, separated by spaces. Each round joins every run of ``_JOIN_RUN``
    neighbours into one string, so a token is copied at most ``_JOIN_RUN`` times per round and
    ``_JOIN_ROUNDS`` rounds make one string: work linear in the tokens, where appending each to
    one growing string copied every earlier one again."""
    joined: Any = "$$t"
    for _ in range(_JOIN_ROUNDS):
        run = {
            "$reduce": {
                "input": {"$slice": ["$$a", "$$i", _JOIN_RUN]},
                "initialValue": "",
                "in": {"$cond": [{"$eq": ["$$value", ""]}, "$$this", {"$concat": ["$$value", " ", "$$this"]}]},
            }
        }
        runs = {"$map": {"input": {"$range": [0, {"$size": "$$a"}, _JOIN_RUN]}, "as": "i", "in": run}}
        joined = {"$let": {"vars": {"a": joined}, "in": runs}}
    return {"$let": {"vars": {"t": tokens}, "in": {"$ifNull": [{"$first": [joined]}, ""]}}}


def _fitting_count(places: Any, room: Any) -> dict[str, Any]:
    """How many of ``places``, from the first, fit in ``room`` together (the longest such run).
    Only numbers are carried from one place to the next."""
    fits = {"$and": ["$$value.open", {"$lte": [_weight("$$this"), "$$value.left"]}]}
    run = {
        "$reduce": {
            "input": places,
            "initialValue": {"left": room, "n": 0, "open": True},
            "in": {
                "$cond": [
                    fits,
                    {
                        "left": {"$subtract": ["$$value.left", _weight("$$this")]},
                        "n": {"$add": ["$$value.n", 1]},
                        "open": True,
                    },
                    {"left": "$$value.left", "n": "$$value.n", "open": False},
                ]
            },
        }
    }
    return {"$let": {"vars": {"run": run}, "in": "$$run.n"}}


def _position_in_order(index: Any, successor_at: Any, size: Any, *, successor_first: bool) -> dict[str, Any]:
    """Where the candidate at ``index`` of ``_c`` stands in the order of hand-offs, which moves the
    successor (at ``successor_at`` in ``_c``, or -1) to the front or to the back."""
    moved: Any
    if successor_first:
        moved, before, after = 0, {"$add": [index, 1]}, index
    else:
        moved, before, after = {"$subtract": [size, 1]}, index, {"$subtract": [index, 1]}
    return {
        "$cond": [
            {"$lt": [successor_at, 0]},
            index,
            {
                "$cond": [
                    {"$eq": [index, successor_at]},
                    moved,
                    {"$cond": [{"$lt": [index, successor_at]}, before, after]},
                ]
            },
        ]
    }


@functools.cache
def _release_stages(
    *, successor: bool, fair: bool, successor_first: bool, leaving: bool
) -> tuple[dict[str, Any], ...]:
    gone: Any = {"$in": ["$$this.o", "$_v.leaving"]} if leaving else {"$eq": ["$$this.o", "$_v.me"]}
    # Candidates for the freed weight: live places (ours removed), with the successor (a waiting
    # task of this process) rewritten where it stands or queued last; never a token that holds a
    # permit already (the successor's own attempt may have taken one), nor one that held a permit
    # and returned it, or gave up waiting: a release that was delayed past those would hand a
    # permit to nobody, which then stayed idle for its whole TTL.
    candidates: Any = "$_q"
    if successor:
        successor_place = {
            **_new_place("$_v.successor", "$_v.successorTtl", "$_v.successorHolder"),
            "w": "$_v.successorWeight",
        }
        candidates = _with_place("$_q", "$_v.successor", successor_place)
    candidates = {"$filter": {"input": candidates, "cond": {"$not": [{"$in": ["$$this.t", "$_held"]}]}}}
    order: Any = "$_c"
    # Where the successor stands in _c (-1: nowhere, or not moved), for the remaining queue below.
    successor_at: Any = -1
    if successor and not fair:
        mine = {"$filter": {"input": "$_c", "cond": {"$eq": ["$$this.t", "$_v.successor"]}}}
        others = _without("$_c", "$_v.successor")
        order = {"$concatArrays": [mine, others] if successor_first else [others, mine]}
        successor_at = {"$indexOfArray": [_tokens("$_c"), "$_v.successor"]}
    # The queue after the hand-off, in _c's order: the candidates whose place in the hand-off order
    # is past the ones handed (the first _r.k of that order). Where the handed ones are the first of
    # _c too (the successor not moved), a slice; else the rest picked by index.
    size_c = {"$size": "$_c"}
    handed = "$_r.k"
    position = _position_in_order("$$i", "$$m", size_c, successor_first=successor_first)
    picked = {
        "$map": {
            "input": {"$filter": {"input": {"$range": [0, size_c]}, "as": "i", "cond": {"$gte": [position, handed]}}},
            "as": "i",
            "in": {"$arrayElemAt": ["$_c", "$$i"]},
        }
    }
    natural = 0 if successor_first else {"$subtract": [size_c, 1]}
    in_place = {"$or": [{"$lt": ["$$m", 0]}, {"$eq": ["$$m", natural]}]}
    remaining_queue = {
        "$let": {
            "vars": {"m": successor_at},
            "in": {
                "$cond": [
                    {"$eq": [handed, 0]},
                    "$_c",
                    {"$cond": [in_place, {"$slice": ["$_c", handed, {"$max": [size_c, 1]}]}, picked]},
                ]
            },
        }
    }
    live_places: Any = _live_places(excluding="$_v.me")
    if leaving:
        live_places = {"$filter": {"input": live_places, "cond": {"$not": [{"$in": ["$$this.t", "$_v.leaving"]}]}}}
    successor_token = "$_v.successor" if successor else None
    handed_permits = {
        "$map": {
            "input": {"$range": [0, {"$size": "$_hand"}]},
            "as": "i",
            "in": {
                "$let": {
                    "vars": {"h": {"$arrayElemAt": ["$_hand", "$$i"]}},
                    "in": _new_permit(
                        "$$h.t",
                        "$$h.ttlMs",
                        "$$h.holder",
                        {"$add": ["$_nf", "$$i"]},
                        _weight("$$h"),
                        start=_not_before("$$h.at", _NOW),
                    ),
                }
            },
        }
    }
    remote = {"$filter": {"input": _tokens("$_r.hand"), "as": "t", "cond": {"$ne": ["$$t", successor_token]}}}
    room = {"$subtract": ["$limit", _weight_of("$_rest")]}
    fitting = {"$cond": ["$_own", _fitting_count("$$o", room), 0]}
    handed_off = {
        "$let": {
            "vars": {"o": order},
            "in": {"$let": {"vars": {"k": fitting}, "in": {"k": "$$k", "hand": {"$slice": ["$$o", "$$k"]}}}},
        }
    }
    # Served in turn, waiters all queue behind the oldest place; when the weight freed does not fit
    # it (readers leaving before a waiting writer), nobody could come in, and waking every waiting
    # process would only send an attempt from each to the one document, delaying the release that
    # will hand the writer its turn.
    nobody_blocks: Any = {"$eq": [{"$size": "$_c"}, 0]} if fair else True
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": {"$and": [_permits_sane("$_v.kind"), {"$eq": ["$kind", "$_v.kind"]}]}}},
        {
            "$set": {
                "_q": live_places,
                "_hs": {"$cond": ["$_sane", _LIVE_HOLDERS, []]},
                "_nf": _NEXT_FENCE_IF_SANE,
            }
        },
        {
            "$set": {
                "_own": {"$gt": [{"$size": {"$filter": {"input": "$_hs", "cond": gone}}}, 0]},
                "_rest": {"$filter": {"input": "$_hs", "cond": {"$not": [gone]}}},
            }
        },
        {
            "$set": {
                "_held": {
                    "$concatArrays": [
                        _holder_tokens("$_rest"),
                        _array_or_empty("$releasedOwners"),
                        _array_or_empty("$withdrawn"),
                    ]
                }
            }
        },
        {"$set": {"_c": candidates}},
        # The freed weight goes to the oldest places that fit under the stored limit (a lowered
        # limit revokes nobody; the weight above it is not handed on): _r.k of them, _r.hand.
        # (No more stages than needed: each one costs the embedded test server a copy of the
        # whole document, temporaries and all.)
        {"$set": {"_r": handed_off}},
        {"$set": {"_hand": "$_r.hand", "_handed": {"$gt": ["$_r.k", 0]}, "_remote": remote}},
        {
            "$set": {
                "holders": {
                    "$cond": ["$_own", {"$concatArrays": ["$_rest", handed_permits]}, "$holders"],
                },
                "fence": {"$cond": ["$_handed", {"$add": ["$_nf", {"$size": "$_hand"}, -1]}, "$fence"]},
                "handedOffAt": {"$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, _NOW, "$handedOffAt"]},
                # The change stream looks for the tokens of the places handed to, in one string: a
                # change event reports a changed array element by element ("handedOffTo.0"), which a
                # filter on the field would miss; a string is reported whole. Written when another
                # process's place got a permit, naming every place that got one (the releaser's
                # successor too): a process that finds its token alone there takes the document's
                # fence as its permit's, which holds only when one permit was handed.
                "handedOffTo": {
                    "$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, _joined(_tokens("$_hand")), "$handedOffTo"]
                },
                # What the change stream wakes other processes' waiters with: a value new on every
                # release that frees a permit without handing it on, and that a waiter could take.
                "freed": {"$cond": [{"$and": ["$_own", {"$not": ["$_handed"]}, nobody_blocks]}, "$_v.stamp", "$freed"]},
                "releasedAt": {"$cond": ["$_own", _NOW, "$releasedAt"]},
                "withdrawn": {"$cond": ["$_sane", _remember_withdrawals(), "$withdrawn"]} if leaving else "$withdrawn",
                "releasedOwners": {
                    "$cond": [
                        {"$and": ["$_own", not leaving]},
                        {
                            "$slice": [
                                {"$concatArrays": [{"$ifNull": ["$releasedOwners", []]}, ["$_v.me"]]},
                                -_RELEASES_REMEMBERED,
                            ]
                        },
                        "$releasedOwners",
                    ]
                },
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": ["$_own", remaining_queue, "$_q"]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_own", _latest_expiry(_NOW), "$expiresAt"]}}},
        {"$unset": _TEMPORARY},
    )


def _permit_renewal(owner: str, ttl_ms: int, stamp: str) -> list[dict[str, Any]]:
    """A new expiry for ``owner``'s permit if it is still live; else no change at all (so the write
    does not count as modified)."""
    now = expressions.SERVER_NOW
    live = {"$and": [{"$eq": ["$$this.o", {"$literal": owner}]}, {"$gt": ["$$this.exp", now]}]}
    renewed = {"exp": _server_plus(now, ttl_ms), "ttlMs": ttl_ms, "renewedAt": now, "r": stamp}
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
        {"$set": {"expiresAt": {"$cond": ["$_live", _latest_expiry(expressions.SERVER_NOW), "$expiresAt"]}}},
        {"$unset": "_live"},
    ]


def force_release_pipeline(stamp: str, owner: str | None) -> list[dict[str, Any]]:
    """Break every live permit (or only ``owner``'s), recording them in ``forcedRelease`` with
    ``stamp``, and wake the waiters (``freed``); a corrupt document's permits are all broken and
    its fields reset."""
    chosen: Any = True if owner is None else {"$eq": ["$$this.o", {"$literal": owner}]}
    return [
        {"$set": {"_now": expressions.SERVER_NOW, "_sane": _permits_sane("$kind")}},
        {
            "$set": {
                "_broken": {
                    "$cond": [
                        "$_sane",
                        {"$filter": {"input": _LIVE_HOLDERS, "cond": chosen}},
                        _array_or_empty("$holders"),
                    ]
                }
            }
        },
        {"$set": {"_break": {"$or": [{"$not": ["$_sane"]}, {"$gt": [{"$size": "$_broken"}, 0]}]}}},
        {
            "$set": {
                "forcedRelease": {
                    "$cond": ["$_break", {"by": stamp, "at": _NOW, "permits": "$_broken"}, "$forcedRelease"]
                },
                "holders": {
                    "$cond": ["$_sane", {"$filter": {"input": _LIVE_HOLDERS, "cond": {"$not": [chosen]}}}, []]
                },
                "limit": {"$cond": ["$_sane", "$limit", 1]},
                "fence": {"$cond": [_FENCE_OK, "$fence", {"$literal": 0}]},
                "queue": _array_or_empty("$queue"),
                "freed": {"$cond": ["$_break", stamp, "$freed"]},
                "releasedAt": {"$cond": ["$_break", _NOW, "$releasedAt"]},
            }
        },
        {"$unset": ["_now", "_sane", "_broken", "_break"]},
    ]


class PermitQueries:
    """The queries of a document of permits, for what ``permits`` asks (one of its permits, or a
    writer's whole limit): the same methods as ``mutex.MutexQueries``."""

    def __init__(self, permits: Permits) -> None:
        self.permits = permits
        self.kind = permits.kind

    def acquire(self, place: PlaceRequest, *, enqueue: bool, fair: bool) -> list[dict[str, Any]]:
        return acquire_pipeline(place, self.permits, enqueue=enqueue, fair=fair)

    def release(
        self, name: str, owner: str, successor: PlaceRequest | None, *, fair: bool, successor_first: bool
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        query = {"_id": name, "$or": [{"holders.o": owner}, {"releasedOwners": owner}]}
        return query, release_pipeline(owner, successor, self.permits, fair=fair, successor_first=successor_first)

    def leave(self, tokens: Sequence[str], *, fair: bool) -> list[dict[str, Any]]:
        return release_pipeline(None, None, self.permits, fair=fair, successor_first=False, leaving=tokens)

    def renewal(self, name: str, owner: str, ttl_ms: int, stamp: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return {"_id": name, "kind": self.kind, "holders.o": owner}, _permit_renewal(owner, ttl_ms, stamp)

    def guard(self, name: str, owner: str, fence: int) -> tuple[dict[str, Any], Any]:
        mine = {"$and": [{"$eq": ["$$this.o", owner]}, {"$eq": ["$$this.fence", fence]}]}
        live = {"$gt": [{"$size": {"$filter": {"input": _live_holders(expressions.SERVER_NOW), "cond": mine}}}, 0]}
        return {"_id": name, "holders": {"$elemMatch": {"o": owner, "fence": fence}}}, live

    def held(self, name: str, owner: str | None) -> tuple[dict[str, Any], Any]:
        """With ``owner``: whether it holds a live permit; without: whether the live holders leave
        no room for a permit of this weight (as ``asyncio.Semaphore.locked``)."""
        match: dict[str, Any] = {"_id": name, "kind": self.kind}
        holders = _live_holders(expressions.SERVER_NOW)
        if owner is None:
            limit = {"$ifNull": ["$limit", self.permits.limit]}
            return match, {"$gt": [{"$add": [_weight_of(holders), self.permits.weight]}, limit]}
        match["holders.o"] = owner
        return match, {"$in": [owner, _holder_tokens(holders)]}

    def put_first(self, name: str, owner: str, label: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The filter and pipeline that move the oldest live place labelled ``label`` to the front of
        the queue, so that the next hand-off goes to it; only while ``owner`` holds a permit there
        (the queue is left as it is when no live place has that label)."""
        query = {"_id": name, "kind": self.kind, "holders.o": owner, "queue.holder.label": label}
        labelled = {
            "$and": [
                {"$eq": ["$$this.holder.label", {"$literal": label}]},  # never read as a field path
                {"$gt": ["$$this.exp", expressions.SERVER_NOW]},
            ]
        }
        rest = {"$filter": {"input": "$queue", "cond": {"$ne": ["$$this.t", "$_chosen.t"]}}}
        chosen = {"$first": [{"$filter": {"input": _array_or_empty("$queue"), "cond": labelled}}]}
        moved = {"$concatArrays": [["$_chosen"], rest]}
        return query, [
            {"$set": {"_chosen": chosen}},
            {"$set": {"queue": {"$cond": [{"$eq": [{"$type": "$_chosen"}, "object"]}, moved, "$queue"]}}},
            {"$unset": "_chosen"},
        ]
