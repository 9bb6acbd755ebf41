"""The release of a permit (a semaphore's, a read-write lock's, an election's): the weight it
frees goes to the longest run of the oldest places that fits, in the same write; and a withdrawal
of places, which passes on a permit handed to one of them meanwhile.

Work per release is linear in the places queued: the places that fit are counted with one
``$reduce`` over numbers, and the strings and arrays are built once, not appended to place by place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import expressions
from .documents import MAX_PERMITS
from .expressions import (
    NEXT_FENCE_IF_SANE,
    NOW,
    TEMPORARY,
    array_or_empty,
    new_place,
    new_stamp,
    not_before,
    places_staying,
    places_without,
    remember_withdrawals,
    request_values,
    tokens_of,
    unexpired_places,
    with_place,
)
from .permits import (
    LIVE_HOLDERS,
    NEW_DOCUMENT,
    entry_weight,
    holder_tokens,
    latest_expiry,
    permit_entry,
    permits_sane,
    weight_of,
)
from .requests import Expression, Permits, Pipeline, PlaceRequest, Stage, encoded_once


def release_pipeline(
    owner: str | None,
    successor: PlaceRequest | None,
    permits: Permits,
    *,
    fair: bool,
    successor_first: bool,
    leaving: Sequence[str] = (),
) -> Pipeline:
    """Return ``owner``'s permit and hand the weight it frees on (``LockStore.release``); with
    ``leaving``, withdraw those places, and hand on a permit handed to one of them meanwhile
    (``LockStore.leave``).

    Matches: the ``_id`` and a holder or released owner ``owner`` (``kinds.PermitQueries.release``);
    a withdrawal, the ``_id`` alone (upserting).
    Changes: drops the caller's permit (or the withdrawn places); hands the freed weight to the
    oldest queued places that fit under the stored limit (``holders``, ``fence``, ``handedOffTo``)
    or marks it ``freed`` for waiters of other processes; remembers the release
    (``releasedOwners``) or the withdrawal (``withdrawn``); prunes the queue; moves ``expiresAt``
    to the latest permit's. A document that is not sane is left unchanged.
    Returns: the document after the write (``holders`` still has the caller's token: its permit
    had expired).
    """
    values: dict[str, Any] = {"me": owner, "leaving": list(leaving), "stamp": new_stamp(), "kind": permits.kind}
    if successor is not None:
        values.update(
            successor=successor.token,
            successorTtl=successor.ttl_ms,
            successorHolder=dict(successor.holder),
            successorWeight=successor.weight,
        )
    shape = {"successor": successor is not None, "fair": fair, "successor_first": successor_first}
    return [request_values(**values), *_release_stages(**shape, leaving=bool(leaving))]


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
    fits = {"$and": ["$$value.open", {"$lte": [entry_weight("$$this"), "$$value.left"]}]}
    run = {
        "$reduce": {
            "input": places,
            "initialValue": {"left": room, "n": 0, "open": True},
            "in": {
                "$cond": [
                    fits,
                    {
                        "left": {"$subtract": ["$$value.left", entry_weight("$$this")]},
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
    """Where the candidate at ``index`` of ``_candidates`` stands in the order of hand-offs, which moves the
    successor (at ``successor_at`` in ``_candidates``, or -1) to the front or to the back."""
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


def _candidates(*, successor: bool) -> Expression:
    """Candidates for the freed weight: live places (ours removed), with the successor (a waiting
    task of this process) rewritten where it stands or queued last; never a token that holds a
    permit already (the successor's own attempt may have taken one), nor one that held a permit
    and returned it, or gave up waiting (``$_held``): a release that was delayed past those would
    hand a permit to nobody, which then stayed idle for its whole TTL."""
    candidates: Any = "$_queue"
    if successor:
        successor_place = {
            **new_place("$_request.successor", "$_request.successorTtl", "$_request.successorHolder"),
            "w": "$_request.successorWeight",
        }
        candidates = with_place("$_queue", "$_request.successor", successor_place)
    return {"$filter": {"input": candidates, "cond": {"$not": [{"$in": ["$$this.t", "$_held"]}]}}}


def _hand_off_order(*, successor: bool, fair: bool, successor_first: bool) -> tuple[Expression, Expression]:
    """The order in which ``$_candidates`` are handed the freed weight (served in turn: theirs; else
    with the successor moved to the front or the back), and where the successor stands in
    ``$_candidates`` (-1: nowhere, or not moved)."""
    if not successor or fair:
        return "$_candidates", -1
    mine = {"$filter": {"input": "$_candidates", "cond": {"$eq": ["$$this.t", "$_request.successor"]}}}
    others = places_without("$_candidates", "$_request.successor")
    order = {"$concatArrays": [mine, others] if successor_first else [others, mine]}
    return order, {"$indexOfArray": [tokens_of("$_candidates"), "$_request.successor"]}


def _handoff(order: Expression) -> Expression:
    """``{count, hand}``: how many of ``order``, from the first, fit together in the room the
    remaining holders leave under the stored limit, and those places (none unless the release is
    the caller's own)."""
    room = {"$subtract": ["$limit", weight_of("$_rest")]}
    fitting = {"$cond": ["$_own", _fitting_count("$$o", room), 0]}
    handed = {"count": "$$count", "hand": {"$slice": ["$$o", "$$count"]}}
    return {"$let": {"vars": {"o": order}, "in": {"$let": {"vars": {"count": fitting}, "in": handed}}}}


def _remaining_queue(successor_at: Expression, *, successor_first: bool) -> Expression:
    """The queue after the hand-off, in ``$_candidates``' order: the candidates whose place in the
    hand-off order is past the ones handed (the first ``$_handoff.count`` of that order). Where the
    handed ones are the first of ``$_candidates`` too (the successor not moved), a slice; else the
    rest picked by index."""
    size = {"$size": "$_candidates"}
    handed = "$_handoff.count"
    position = _position_in_order("$$i", "$$m", size, successor_first=successor_first)
    picked = {
        "$map": {
            "input": {"$filter": {"input": {"$range": [0, size]}, "as": "i", "cond": {"$gte": [position, handed]}}},
            "as": "i",
            "in": {"$arrayElemAt": ["$_candidates", "$$i"]},
        }
    }
    natural = 0 if successor_first else {"$subtract": [size, 1]}
    in_place = {"$or": [{"$lt": ["$$m", 0]}, {"$eq": ["$$m", natural]}]}
    rest = {"$cond": [in_place, {"$slice": ["$_candidates", handed, {"$max": [size, 1]}]}, picked]}
    return {"$let": {"vars": {"m": successor_at}, "in": {"$cond": [{"$eq": [handed, 0]}, "$_candidates", rest]}}}


# The permits of the places handed to (``$_hand``), fenced one after another from the next fence,
# each counted from its place's ``at`` at the earliest (see expressions.not_before).
_HANDED_PERMITS = {
    "$map": {
        "input": {"$range": [0, {"$size": "$_hand"}]},
        "as": "i",
        "in": {
            "$let": {
                "vars": {"h": {"$arrayElemAt": ["$_hand", "$$i"]}},
                "in": permit_entry(
                    "$$h.t",
                    "$$h.ttlMs",
                    "$$h.holder",
                    {"$add": ["$_next_fence", "$$i"]},
                    entry_weight("$$h"),
                    start=not_before("$$h.at", NOW),
                ),
            }
        },
    }
}


@encoded_once
def _release_stages(*, successor: bool, fair: bool, successor_first: bool, leaving: bool) -> tuple[Stage, ...]:
    """The stages after the request's values (see ``release_pipeline``)."""
    gone: Any = {"$in": ["$$this.o", "$_request.leaving"]} if leaving else {"$eq": ["$$this.o", "$_request.me"]}
    order, successor_at = _hand_off_order(successor=successor, fair=fair, successor_first=successor_first)
    remaining_queue = _remaining_queue(successor_at, successor_first=successor_first)
    live_places: Any = unexpired_places(excluding="$_request.me")
    if leaving:
        live_places = places_staying(live_places)
    successor_token = "$_request.successor" if successor else None
    remote = {"$filter": {"input": tokens_of("$_handoff.hand"), "as": "t", "cond": {"$ne": ["$$t", successor_token]}}}
    # Served in turn, waiters all queue behind the oldest place; when the weight freed does not fit
    # it (readers leaving before a waiting writer), nobody could come in, and waking every waiting
    # process would only send an attempt from each to the one document, delaying the release that
    # will hand the writer its turn.
    nobody_blocks: Any = {"$eq": [{"$size": "$_candidates"}, 0]} if fair else True
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": {"$and": [permits_sane("$_request.kind"), {"$eq": ["$kind", "$_request.kind"]}]}}},
        {
            "$set": {
                "_queue": live_places,
                "_live_holders": {"$cond": ["$_sane", LIVE_HOLDERS, []]},
                "_next_fence": NEXT_FENCE_IF_SANE,
            }
        },
        {
            "$set": {
                "_own": {"$gt": [{"$size": {"$filter": {"input": "$_live_holders", "cond": gone}}}, 0]},
                "_rest": {"$filter": {"input": "$_live_holders", "cond": {"$not": [gone]}}},
            }
        },
        {
            "$set": {
                "_held": {
                    "$concatArrays": [
                        holder_tokens("$_rest"),
                        array_or_empty("$releasedOwners"),
                        array_or_empty("$withdrawn"),
                    ]
                }
            }
        },
        {"$set": {"_candidates": _candidates(successor=successor)}},
        # The freed weight goes to the oldest places that fit under the stored limit (a lowered
        # limit revokes nobody; the weight above it is not handed on).
        # (No more stages than needed: each one costs the embedded test server a copy of the
        # whole document, temporaries and all.)
        {"$set": {"_handoff": _handoff(order)}},
        {"$set": {"_hand": "$_handoff.hand", "_handed": {"$gt": ["$_handoff.count", 0]}, "_remote": remote}},
        {
            "$set": {
                "holders": {
                    "$cond": ["$_own", {"$concatArrays": ["$_rest", _HANDED_PERMITS]}, "$holders"],
                },
                "fence": {"$cond": ["$_handed", {"$add": ["$_next_fence", {"$size": "$_hand"}, -1]}, "$fence"]},
                "handedOffAt": {"$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, NOW, "$handedOffAt"]},
                # The change stream looks for the tokens of the places handed to, in one string: a
                # change event reports a changed array element by element ("handedOffTo.0"), which a
                # filter on the field would miss; a string is reported whole. Written when another
                # process's place got a permit, naming every place that got one (the releaser's
                # successor too): a process that finds its token alone there takes the document's
                # fence as its permit's, which holds only when one permit was handed.
                "handedOffTo": {
                    "$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, _joined(tokens_of("$_hand")), "$handedOffTo"]
                },
                # What the change stream wakes other processes' waiters with: a value new on every
                # release that frees a permit without handing it on, and that a waiter could take.
                "freed": {
                    "$cond": [{"$and": ["$_own", {"$not": ["$_handed"]}, nobody_blocks]}, "$_request.stamp", "$freed"]
                },
                "releasedAt": {"$cond": ["$_own", NOW, "$releasedAt"]},
                # Remembered on a document not written yet too (the withdrawal upserts it): the
                # attempt it withdraws may create it later.
                "withdrawn": {"$cond": [{"$or": ["$_sane", NEW_DOCUMENT]}, remember_withdrawals(), "$withdrawn"]}
                if leaving
                else "$withdrawn",
                "releasedOwners": {
                    "$cond": [
                        {"$and": ["$_own", not leaving]},
                        {
                            "$slice": [
                                {"$concatArrays": [{"$ifNull": ["$releasedOwners", []]}, ["$_request.me"]]},
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
                        {"$cond": ["$_own", remaining_queue, "$_queue"]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_own", latest_expiry(NOW), "$expiresAt"]}}},
        {"$unset": TEMPORARY},
    )
