"""The queries of a lock's document (a mutex): acquire, release and hand-off, withdrawal, renewal,
the transaction guard, the reads' liveness test, and the break-glass release.

One document per lock name:

```text
{_id: <name>, owner: <token> | null, expiresAt: <server date>, fence: <int64>, ttlMs: <int>,
 holder: {host, pid, label}, acquiredAt, renewedAt, releasedAt, releasedOwner, recentReleases,
 handedOffAt, handedOffTo, queue: [{t: <token>, ttlMs, holder, at: <server date>, exp: <server date>}, ...],
 renewal: <tick>, withdrawn: [<token>, ...]}
```

Release clears ``owner`` instead of deleting the document, so ``fence`` survives. A release hands
the lease straight to the next place in the same write, so a hand-off costs no extra request and no
race. Every pipeline first checks that the fields it relies on have the types this library writes
(``_sane``); on a document edited into another shape it changes nothing, and the caller raises
``LockDataError`` from ``LockState`` parsing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import expressions
from .expressions import (
    FENCE_OK,
    LEASE_FIELDS_SANE,
    LEASE_LIVE,
    MAX_TTL_MS,
    NEXT_FENCE,
    NOW,
    TEMPORARY,
    array_or_empty,
    done_with,
    first_or_null,
    new_place,
    not_before,
    places_ahead,
    places_staying,
    places_without,
    remember_withdrawals,
    request_values,
    server_plus,
    tokens_of,
    type_in,
    unexpired_places,
    with_place,
)
from .requests import Pipeline, PlaceRequest, Stage, encoded_once

_SANE: dict[str, Any] = {"$and": [LEASE_FIELDS_SANE, type_in("$kind", "missing", "null")]}
"""A lock's document (a job's has the same lease fields: see ``_JOB_SANE``)."""
_LIVE: dict[str, Any] = {"$and": ["$_sane", {"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", NOW]}]}


def _follow_up(handee: str) -> dict[str, Any]:
    """The place for the follower recorded in ``handee`` (a place expression), as a 0- or 1-element
    array: empty when the follower is done with (withdrawn, or its lease released: see ``done_with``)."""
    ttl = f"{handee}.nttl"
    joins = {
        "$and": [
            {"$eq": [{"$type": f"{handee}.n"}, "string"]},
            {"$in": [{"$type": ttl}, ["int", "long"]]},
            {"$gte": [ttl, 1]},
            {"$lte": [ttl, MAX_TTL_MS]},
            {"$not": [done_with(f"{handee}.n", _RELEASED_TOKENS)]},
        ]
    }
    # The follower's place counts as written when the handee's was (the hand-off's $$NOW can be older).
    place = {
        "t": f"{handee}.n",
        "ttlMs": ttl,
        "holder": f"{handee}.holder",
        "at": not_before(f"{handee}.at", NOW),
        "exp": server_plus(NOW, ttl),
    }
    return {"$cond": [joins, [place], {"$literal": []}]}


# Releases of a lock a document remembers at most (see ``LockStore.release``): each is forgotten
# once the lease it ended would have expired, and this bounds the list on a name handed on faster
# than that. Every write of the name carries the list (and on MongoDB, rewrites the document), so
# it is kept short: at 256 a hot name served half the acquisitions per second it serves at 16 on
# the embedded server (benchmarks/README.md). A copy of a release sent after more later releases
# than this reports the lease lost, although the block it ended had run under it.
LOCK_RELEASES_REMEMBERED = 16


def _remember_release() -> dict[str, Any]:
    """``recentReleases`` after a release of the lease (``$owner`` until ``$expiresAt``, as the
    document had them), without the releases whose leases would have expired by now; unchanged
    unless the release ended our live lease (``$_own``)."""
    still_resendable = {
        "$filter": {"input": array_or_empty("$recentReleases"), "cond": {"$gt": ["$$this.until", NOW]}}
    }
    remembered = {"$concatArrays": [still_resendable, [{"o": "$owner", "until": "$expiresAt"}]]}
    return {"$cond": ["$_own", {"$slice": [remembered, -LOCK_RELEASES_REMEMBERED]}, "$recentReleases"]}


_RELEASED_TOKENS: dict[str, Any] = {
    "$concatArrays": [{"$map": {"input": array_or_empty("$recentReleases"), "in": "$$this.o"}}, ["$releasedOwner"]]
}
"""The owner tokens whose release the document remembers (see ``_remember_release``)."""


def acquire_pipeline(place: PlaceRequest, *, enqueue: bool, fair: bool) -> Pipeline:
    """Take the lock for ``place``, or queue it (``LockStore.try_acquire``).

    Matches: the lock's ``_id`` (an upserting ``findAndModify``: a new name creates its document).
    Changes: takes a free lease (none live and, with ``fair``, no older place waiting), or claims
    one handed to ``place`` by a release: ``owner``, ``expiresAt`` (``ttl`` on the server's clock,
    kept with ``keep_expiry``), ``fence`` (next token), ``holder``, ``acquiredAt``; the place leaves
    the queue and its follower joins it. Otherwise, with ``enqueue``, queues or refreshes the place.
    Prunes expired places; a token already released or withdrawn takes nothing. Changes nothing on
    a document that is not sane.
    Returns: the document after the write (the caller holds the lock when ``owner`` is its token).
    """
    values = {"me": place.token, "ttl": place.ttl_ms, "holder": dict(place.holder), "keep": place.keep_expiry}
    if place.follower is not None:
        follower = place.follower
        values.update(next=follower.token, nextTtl=follower.ttl_ms, nextHolder=dict(follower.holder))
    return [request_values(**values), *_acquire_stages(enqueue=enqueue, fair=fair, follower=place.follower is not None)]


@encoded_once
def _acquire_stages(*, enqueue: bool, fair: bool, follower: bool) -> tuple[Stage, ...]:
    me = "$_request.me"
    my_follower = ("$_request.next", "$_request.nextTtl") if follower else None
    my_place = new_place(me, "$_request.ttl", "$_request.holder", my_follower)
    my_tokens_index = {"$indexOfArray": [tokens_of("$_queue"), me]}
    got_it = {"$or": ["$_claim", "$_take"]}
    # A claim that keeps the expiry (see PlaceRequest.keep_expiry) writes nothing of the lease.
    renewed = {"$or": ["$_take", {"$and": ["$_claim", {"$not": ["$_request.keep"]}]}]}
    waiting_queue: Any = with_place("$_queue", me, my_place) if enqueue else "$queue"
    taken_queue: Any = places_without("$_queue", me)
    if follower:
        follower_place = new_place("$_request.next", "$_request.nextTtl", "$_request.nextHolder")
        # A follower that is done with (withdrawn: its process stopped waiting while this request
        # was on its way) does not join: it would be a place nobody keeps, handed the lock next.
        joins = {"$cond": [done_with("$_request.next", _RELEASED_TOKENS), {"$literal": []}, [follower_place]]}
        taken_queue = {"$concatArrays": [places_without(taken_queue, "$_request.next"), joins]}
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": _SANE, "_queue": unexpired_places()}},
        {"$set": {"_live": _LIVE, "_mine": {"$eq": ["$owner", me]}, "_gone": done_with(me, _RELEASED_TOKENS)}},
        # Places ahead of ours: all live places if we have none yet.
        {
            "$set": {
                "_ahead": places_ahead(my_tokens_index) if fair else 0
            }
        },
        {
            "$set": {
                "_claim": {"$and": ["$_live", "$_mine", {"$not": ["$_gone"]}]},
                "_take": {"$and": ["$_sane", {"$not": ["$_live"]}, {"$eq": ["$_ahead", 0]}, {"$not": ["$_gone"]}]},
            }
        },
        {
            "$set": {
                "owner": {"$cond": [got_it, me, "$owner"]},
                "expiresAt": {"$cond": [renewed, server_plus(NOW, "$_request.ttl"), "$expiresAt"]},
                "fence": {"$cond": ["$_take", NEXT_FENCE, "$fence"]},
                "ttlMs": {"$cond": [renewed, "$_request.ttl", "$ttlMs"]},
                "holder": {"$cond": [got_it, "$_request.holder", "$holder"]},
                "acquiredAt": {"$cond": ["$_take", NOW, "$acquiredAt"]},
                "renewedAt": {"$cond": [renewed, NOW, "$renewedAt"]},
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": [got_it, taken_queue, {"$cond": ["$_gone", "$_queue", waiting_queue]}]},
                    ]
                },
            }
        },
        {"$unset": TEMPORARY},
    )


def release_pipeline(
    owner: str | None,
    successor: PlaceRequest | None,
    *,
    fair: bool,
    successor_first: bool,
    leaving: Sequence[str] = (),
) -> Pipeline:
    """Release ``owner``'s lease and hand it on (``LockStore.release``). With ``leaving`` instead (a
    process withdrawing its places, ``LockStore.leave``), the places are removed, and the lease is
    handed on only if it was handed to one of them.

    Matches: the lock's ``_id`` with ``owner`` as its owner or a recently released owner
    (``kinds.MutexQueries.release``); a withdrawal, the ``_id`` alone (upserting).
    Changes: while ``owner`` holds the live lease, hands it to the first live place (``successor``,
    a waiting task of the same process, first or last as asked), writing ``owner``, ``expiresAt``,
    ``fence`` and ``handedOffTo`` (a place of another process), or clears ``owner`` and sets
    ``releasedAt``; remembers ``owner`` in ``recentReleases`` so that a release sent again after a
    lost reply is recognised. Changes nothing on a document that is not sane.
    Returns: the document after the write (``owner`` still the caller's: its lease had expired).
    """
    values: dict[str, Any] = {"me": owner, "leaving": list(leaving)}
    if successor is not None:
        values.update(successor=successor.token, successorTtl=successor.ttl_ms, successorHolder=dict(successor.holder))
        if successor.follower is not None:
            values.update(next=successor.follower.token, nextTtl=successor.follower.ttl_ms)
    shape = {
        "successor": successor is not None,
        "follower": successor is not None and successor.follower is not None,
        "fair": fair,
        "successor_first": successor_first,
        "leaving": bool(leaving),
    }
    return [request_values(**values), *_release_stages(**shape)]


@encoded_once
def _release_stages(
    *, successor: bool, follower: bool, fair: bool, successor_first: bool, leaving: bool
) -> tuple[Stage, ...]:
    mine = {"$in": ["$owner", "$_request.leaving"]} if leaving else {"$eq": ["$owner", "$_request.me"]}
    # Candidates for the lease: live places (ours removed), with the successor queued last.
    candidates: Any = "$_queue"
    handee: Any
    if not successor:
        handee = first_or_null("$_queue")
    else:
        next_place = ("$_request.next", "$_request.nextTtl") if follower else None
        successor_place = new_place(
            "$_request.successor", "$_request.successorTtl", "$_request.successorHolder", next_place
        )
        # A successor that is done with (its waiters gave up and withdrew it while this release was
        # on its way) is neither handed the lease nor queued: queued, it would be a place nobody
        # waits behind, and the next release would hand the lock to it.
        candidates = {"$cond": ["$_gone", "$_queue", with_place("$_queue", "$_request.successor", successor_place)]}
        others = places_without("$_queue", "$_request.successor")
        if fair:
            handee = first_or_null(candidates)
        elif successor_first:
            handee = {"$cond": ["$_gone", first_or_null(others), successor_place]}
        else:
            handee = {"$ifNull": [{"$first": [others]}, {"$cond": ["$_gone", None, successor_place]}]}
    # The handee leaves the queue; its follower (if any) joins it last.
    without_handee = places_without(places_without("$_candidates", "$_handee.t"), "$_handee.n")
    remaining = {"$concatArrays": [without_handee, _follow_up("$_handee")]}
    live_places: Any = unexpired_places(excluding="$_request.me")
    if leaving:
        live_places = places_staying(live_places)
    successor_token = "$_request.successor" if successor else None
    successor_gone = {"_gone": done_with(successor_token, _RELEASED_TOKENS)} if successor else {}
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": _SANE, "_queue": live_places, **successor_gone}},
        {"$set": {"_own": {"$and": [_LIVE, mine]}, "_candidates": candidates}},
        {"$set": {"_handee": {"$cond": ["$_own", handee, None]}}},
        {
            "$set": {
                "_handed": {"$ne": ["$_handee", None]},
                "_remote": {"$and": [{"$ne": ["$_handee", None]}, {"$ne": ["$_handee.t", successor_token]}]},
            }
        },
        {
            "$set": {
                "owner": {"$cond": ["$_own", {"$cond": ["$_handed", "$_handee.t", None]}, "$owner"]},
                "expiresAt": {
                    "$cond": [
                        "$_own",
                        {"$cond": ["$_handed", server_plus(not_before("$_handee.at", NOW), "$_handee.ttlMs"), NOW]},
                        "$expiresAt",
                    ]
                },
                "fence": {"$cond": ["$_handed", NEXT_FENCE, "$fence"]},
                "ttlMs": {"$cond": ["$_handed", "$_handee.ttlMs", "$ttlMs"]},
                "holder": {"$cond": ["$_handed", "$_handee.holder", "$holder"]},
                "acquiredAt": {"$cond": ["$_handed", NOW, "$acquiredAt"]},
                "renewedAt": {"$cond": ["$_handed", NOW, "$renewedAt"]},
                "handedOffAt": {"$cond": ["$_remote", NOW, "$handedOffAt"]},
                # The change stream looks for this field: a new owner token on every hand-off,
                # where two in one millisecond write the same handedOffAt, which a change event
                # then leaves out of updatedFields as unchanged.
                "handedOffTo": {"$cond": ["$_remote", "$_handee.t", "$handedOffTo"]},
                "releasedAt": {"$cond": ["$_own", NOW, "$releasedAt"]},
                "releasedOwner": {"$cond": ["$_own", "$owner", "$releasedOwner"]},
                # A withdrawal passes on a lease handed to a place that gave up: no release of
                # that token is ever sent again.
                "recentReleases": "$recentReleases" if leaving else _remember_release(),
                "withdrawn": {"$cond": ["$_sane", remember_withdrawals(), "$withdrawn"]} if leaving else "$withdrawn",
                "queue": {"$cond": [{"$not": ["$_sane"]}, "$queue", {"$cond": ["$_own", remaining, "$_queue"]}]},
            }
        },
        {"$unset": TEMPORARY},
    )


def renewal_pipeline(ttl_ms: int, stamp: str) -> Pipeline:
    """Renew a held lease (``LockStore.renew``, one ``update_one`` or a chunk of a ``bulk_write``).

    Matches: the lock's ``_id`` and ``owner`` (``kinds.MutexQueries.renewal``).
    Changes: if the lease is still live, ``expiresAt`` to ``ttl_ms`` from the server's now,
    ``ttlMs``, ``renewedAt`` and ``renewal`` (``stamp``, by which a chunk's renewals are read back);
    else nothing at all, so the write does not count as modified.
    Returns: nothing (the caller reads ``modified_count``).
    """
    live = "$_live"
    return [
        {"$set": {"_live": LEASE_LIVE}},
        {
            "$set": {
                "expiresAt": {"$cond": [live, server_plus(expressions.SERVER_NOW, ttl_ms), "$expiresAt"]},
                "ttlMs": {"$cond": [live, ttl_ms, "$ttlMs"]},
                "renewedAt": {"$cond": [live, expressions.SERVER_NOW, "$renewedAt"]},
                "renewal": {"$cond": [live, {"$literal": stamp}, "$renewal"]},
            }
        },
        {"$unset": "_live"},
    ]


def force_release_pipeline(stamp: str, *, repair: bool, live: bool = True) -> Pipeline:
    """Break a lock's (or a job's) lease: the operator's break-glass (``reports.force_release``).

    Matches: the ``_id``, and the owner token the operator named (``reports``).
    Changes: a live lease (unless not ``live``: then only a repair) is ended and recorded in
    ``forcedRelease`` with ``stamp``; with ``repair``, a document whose lease fields were corrupted
    is reset too (``fence`` is kept when it is a valid token, else restarted from the server
    clock's floor).
    Returns: the document after the write (``forcedRelease.by`` is ``stamp`` when this broke it).
    """
    now = expressions.SERVER_NOW
    broken = "$_break"
    corrupt = {"$not": [FORCE_SANE]}
    breaks: Any = ({"$or": [corrupt, LEASE_LIVE]} if live else corrupt) if repair else LEASE_LIVE
    record = {"by": stamp, "at": now, "owner": "$owner", "holder": "$holder", "fence": "$fence"}
    return [
        {"$set": {"_break": breaks}},
        {
            "$set": {
                "forcedRelease": {"$cond": [broken, record, "$forcedRelease"]},
                "owner": {"$cond": [broken, None, "$owner"]},
                "expiresAt": {"$cond": [broken, now, "$expiresAt"]},
                "releasedAt": {"$cond": [broken, now, "$releasedAt"]},
                "fence": {"$cond": [{"$or": [{"$not": [broken]}, FENCE_OK]}, "$fence", {"$literal": 0}]},
                "queue": {"$cond": [{"$or": [{"$not": [broken]}, {"$isArray": "$queue"}]}, "$queue", []]},
            }
        },
        {"$unset": "_break"},
    ]


# A lock's or a job's lease fields in the shapes written here: a job's lease is a lock's (its record
# stays when its lease is broken: the run shows as lost).
FORCE_SANE: dict[str, Any] = {
    "$and": [LEASE_FIELDS_SANE, {"$or": [type_in("$kind", "missing", "null"), {"$eq": ["$kind", "job"]}]}]
}
