"""The queries of a job's document: the start that decides whether a run is due and records it,
and the finish that records how it ended.

A job's document is a lock's (owner, expiresAt, fence, ttlMs, holder, ...) with kind "job" and the
job's record: job: {every, offset, minInterval, maxAttempts (the schedule as last asked for), tries
(the start times of the latest runs in the server clock's order, at most MAX_ATTEMPTS_LIMIT of
them), lastSuccess (the start time of the latest run that succeeded), run: {o, period: {start,
end}, attempt, startedAt, holder} (the run holding the lease, or null), last: (the latest run that
ended, with endedAt, outcome, error: {type, message}), lastEndedAt, seen: {period, why} (the latest
decision not to run), finished: [the last owner tokens that finished a run]}.

A period is a span of the server's clock, ``[start, start + every)`` with ``start = offset +
floor((now - offset) / every) * every`` (milliseconds since the Unix epoch), known by its start and
end, never by a number: the schedule of the request that asks decides which period it is, and the
record says when runs started and succeeded. So a period is done when a run that started in it (or
later: a server clock that stepped back) succeeded, and its attempts are the runs started in it,
whatever ``every`` or ``offset`` the earlier runs were asked with. Clients' clocks decide nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from . import expressions
from .documents import JOB_KIND
from .expressions import (
    LEASE_FIELDS_SANE,
    NEXT_FENCE,
    NOW,
    array_or_empty,
    cond,
    request_values,
    server_plus,
    type_in,
)
from .requests import Pipeline, Stage


class JobSchedule(NamedTuple):
    """When a job may run (see ``LockStore.start_job``), in milliseconds."""

    every_ms: int | None = None
    """Run at most once per period of this length of the server's clock; None: no periods."""
    offset_ms: int = 0
    """Periods start this long after each multiple of ``every_ms`` since the Unix epoch."""
    min_interval_ms: int | None = None
    """Start no run sooner than this after the last run ended."""
    max_attempts: int = 1
    """Runs allowed per period (with ``every_ms``)."""


_JOB_KIND_IS: dict[str, Any] = {"$eq": ["$kind", JOB_KIND]}
_ALL_TRIES_DATES: dict[str, Any] = {
    "$allElementsTrue": [
        {"$map": {"input": array_or_empty("$job.tries"), "in": {"$eq": [{"$type": "$$this"}, "date"]}}}
    ]
}
_JOB_SANE: dict[str, Any] = {
    "$and": [
        LEASE_FIELDS_SANE,
        {"$or": [type_in("$kind", "missing", "null"), _JOB_KIND_IS]},
        type_in("$job", "missing", "null", "object"),
        type_in("$job.tries", "missing", "null", "array"),
        _ALL_TRIES_DATES,
        type_in("$job.lastSuccess", "missing", "null", "date"),
        type_in("$job.run", "missing", "null", "object"),
        type_in("$job.lastEndedAt", "missing", "null", "date"),
    ]
}
"""A job's document, or a lock's (a ``run_once`` of an earlier version kept its job in one)."""
_FINISHED_REMEMBERED = 16
MAX_ATTEMPTS_LIMIT = 1000
"""The largest ``max_attempts`` a job may ask, and the starts kept in ``job.tries``: the latest by
the server's clock, as many as that, so a period's attempts are counted exactly whatever ``max_attempts`` each
version of an application asks (issue 36; model/jobs.pml's NK)."""
_JOB_TEMPORARY = ["_request", "_now", "_sane", "_job", "_live", "_start", "_period", "_lost", "_attempts", "_done",
                  "_lastEnd", "_why", "_take", "_ours", "_own", "_record", "_until", "_keep"]  # fmt: skip


def start_pipeline(owner: str, ttl_ms: int, holder: Mapping[str, Any], schedule: JobSchedule) -> Pipeline:
    """Take the job's lease for ``owner`` if the job is due by ``schedule`` (see
    ``LockStore.start_job``).

    Matches: the job's ``_id`` (an upserting ``findAndModify``).
    Changes: computes the current period on the server's clock, and takes the lease (kind, owner,
    expiresAt, fence, ...) only when nobody holds it, no run that started in this period or later
    succeeded, fewer than ``maxAttempts`` runs started in it, and the last run ended
    ``minInterval`` ago or more; the run is recorded in ``job.run`` and its start in
    ``job.tries``. Otherwise records why not in ``job.seen``. A run whose lease expired unfinished
    becomes ``job.last``, as lost.
    Returns: the document after the write.
    """
    values = {
        "me": owner,
        "ttl": ttl_ms,
        "holder": dict(holder),
        "every": schedule.every_ms,
        "offset": schedule.offset_ms,
        "minInterval": schedule.min_interval_ms,
        "maxAttempts": schedule.max_attempts,
    }
    return [request_values(**values), *_JOB_START_STAGES]


def _period_start() -> dict[str, Any]:
    """The start of the current period, ``now - ((now - offset) mod every)``, as a date: integer
    arithmetic on milliseconds ($mod of longs is exact and, with a non-negative dividend, not
    negative: ExpressionMod in src/mongo/db/pipeline/expression.cpp, as C++'s %), so every request
    with the same schedule finds the same boundaries."""
    now_ms = {"$toLong": NOW}
    since_offset = {"$subtract": [now_ms, "$_request.offset"]}
    return {"$toDate": {"$subtract": [now_ms, {"$mod": [since_offset, "$_request.every"]}]}}


def _job_start_stages() -> tuple[Stage, ...]:
    has_run = {"$eq": [{"$type": "$_job.run"}, "object"]}
    periodic = {"$ne": ["$_start", None]}
    too_soon = {
        "$and": [
            {"$ne": ["$_request.minInterval", None]},
            {"$eq": [{"$type": "$_lastEnd"}, "date"]},
            {"$lt": [NOW, {"$add": ["$_lastEnd", "$_request.minInterval"]}]},
        ]
    }
    why = cond(
        {"$not": ["$_sane"]},
        "corrupt",
        cond(
            "$_live",
            cond(has_run, "running", "held"),
            cond(
                "$_done",
                "done",
                cond(
                    {"$and": [periodic, {"$gte": ["$_attempts", "$_request.maxAttempts"]}]},
                    "failed",
                    cond(too_soon, "too_soon", None),
                ),
            ),
        ),
    )
    attempt = {"$add": ["$_attempts", 1]}
    run = {
        "o": "$_request.me", "period": "$_period", "attempt": attempt, "startedAt": NOW, "holder": "$_request.holder"
    }
    # The starts in the server clock's order, this one inserted after every earlier one (a clock that
    # stepped back puts it before later ones; $sortArray is MongoDB 5.2+), the earliest dropped past
    # MAX_ATTEMPTS_LIMIT. Neither the requests' order nor the caller's own maxAttempts decides what
    # is kept: a period's attempts are counted exactly for any max_attempts the API allows.
    earlier = {"$filter": {"input": array_or_empty("$_job.tries"), "cond": {"$lt": ["$$this", NOW]}}}
    later = {"$filter": {"input": array_or_empty("$_job.tries"), "cond": {"$gte": ["$$this", NOW]}}}
    tries = {"$slice": [{"$concatArrays": [earlier, [NOW], later]}, -MAX_ATTEMPTS_LIMIT]}
    record = {
        "$mergeObjects": [
            "$_job",
            {
                "every": "$_request.every",
                "offset": "$_request.offset",
                "minInterval": "$_request.minInterval",
                "maxAttempts": "$_request.maxAttempts",
                "tries": cond({"$and": ["$_take", periodic]}, tries, "$_job.tries"),
                "run": cond("$_take", run, cond("$_lost", None, "$_job.run")),
                "last": cond(
                    "$_lost",
                    {"$mergeObjects": ["$_job.run", {"endedAt": "$expiresAt", "outcome": "lost"}]},
                    "$_job.last",
                ),
                "lastEndedAt": "$_lastEnd",
                "seen": cond("$_take", "$_job.seen", {"period": "$_period", "why": "$_why"}),
            },
        ]
    }
    last_success = "$_job.lastSuccess"
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": _JOB_SANE, "_job": {"$cond": [{"$eq": [{"$type": "$job"}, "object"]}, "$job", {}]}}},
        {
            "$set": {
                "_live": {"$and": ["$_sane", {"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", NOW]}]},
                "_start": cond({"$eq": ["$_request.every", None]}, None, _period_start()),
            }
        },
        {
            "$set": {
                "_period": cond(periodic, {"start": "$_start", "end": {"$add": ["$_start", "$_request.every"]}}, None),
                "_lost": {"$and": ["$_sane", {"$not": ["$_live"]}, has_run]},
                # Runs started in this period, or later (on a server clock that stepped back).
                "_attempts": cond(
                    periodic,
                    {
                        "$size": {
                            "$filter": {"input": array_or_empty("$_job.tries"), "cond": {"$gte": ["$$this", "$_start"]}}
                        }
                    },
                    0,
                ),
                # A success at or after the period's start: this period's, or a later one's.
                "_done": {
                    "$and": [periodic, {"$eq": [{"$type": last_success}, "date"]}, {"$gte": [last_success, "$_start"]}]
                },
            }
        },
        # A run lost with its lease ended when the lease expired: that counts for min_interval.
        {"$set": {"_lastEnd": cond("$_lost", {"$max": ["$_job.lastEndedAt", "$expiresAt"]}, "$_job.lastEndedAt")}},
        {"$set": {"_why": why}},
        {"$set": {"_take": {"$and": ["$_sane", {"$eq": ["$_why", None]}]}}},
        {
            "$set": {
                "kind": cond("$_take", JOB_KIND, "$kind"),
                "owner": cond("$_take", "$_request.me", "$owner"),
                "expiresAt": cond("$_take", server_plus(NOW, "$_request.ttl"), "$expiresAt"),
                "fence": cond("$_take", NEXT_FENCE, "$fence"),
                "ttlMs": cond("$_take", "$_request.ttl", "$ttlMs"),
                "holder": cond("$_take", "$_request.holder", "$holder"),
                "acquiredAt": cond("$_take", NOW, "$acquiredAt"),
                "renewedAt": cond("$_take", NOW, "$renewedAt"),
                # A lock's document (a run_once of an earlier version) gets a record only when taken.
                "job": cond({"$and": ["$_sane", {"$or": ["$_take", _JOB_KIND_IS]}]}, record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_START_STAGES = _job_start_stages()


def finish_pipeline(
    owner: str, outcome: str, error: Mapping[str, str] | None, hold_at_least_ms: int | None
) -> Pipeline:
    """End ``owner``'s run and record how it ended (see ``LockStore.finish_job``).

    Matches: the job's ``_id`` and ``owner`` (as the owner, the run's, or a finish already
    recorded).
    Changes: while ``owner`` holds the live lease of the run in ``job.run``, records the run in
    ``job.last`` with ``outcome`` (a success moves ``job.lastSuccess`` to the run's start) and
    ends the lease, or keeps it until ``hold_at_least`` after the run's start. A run whose lease
    is gone is recorded only as ``lost`` (its own account of the loss), and only while
    ``job.run`` is still that run; the lease is left as it is. Adds ``owner`` to ``job.finished``
    whenever it records.
    Returns: the document after the write.
    """
    error_record = None if error is None else dict(error)
    values = {"me": owner, "outcome": outcome, "error": error_record, "hold": hold_at_least_ms}
    return [request_values(**values), *_JOB_FINISH_STAGES]


def _job_finish_stages() -> tuple[Stage, ...]:
    released = {"$and": ["$_own", {"$not": ["$_keep"]}]}
    succeeded = {"$eq": ["$_request.outcome", "succeeded"]}
    record = {
        "$mergeObjects": [
            "$_job",
            {
                "run": None,
                "last": {
                    "$mergeObjects": [
                        "$_job.run", {"endedAt": NOW, "outcome": "$_request.outcome", "error": "$_request.error"}
                    ]
                },
                "lastEndedAt": NOW,
                "lastSuccess": cond(
                    succeeded, {"$max": ["$_job.lastSuccess", "$_job.run.startedAt"]}, "$_job.lastSuccess"
                ),
                "finished": {
                    "$slice": [
                        {"$concatArrays": [array_or_empty("$_job.finished"), ["$_request.me"]]},
                        -_FINISHED_REMEMBERED,
                    ]
                },
            },
        ]
    }
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": {"$and": [_JOB_SANE, _JOB_KIND_IS]}, "_job": "$job"}},
        {"$set": {"_ours": {"$and": ["$_sane", {"$eq": ["$_job.run.o", "$_request.me"]}]}}},
        {"$set": {"_own": {"$and": ["$_ours", {"$eq": ["$owner", "$_request.me"]}, {"$gt": ["$expiresAt", NOW]}]}}},
        {
            "$set": {
                "_record": {"$or": ["$_own", {"$and": ["$_ours", {"$eq": ["$_request.outcome", "lost"]}]}]},
                "_until": cond({"$eq": ["$_request.hold", None]}, None, {"$add": ["$_job.run.startedAt",
                    "$_request.hold"]}),
            }
        },
        {"$set": {"_keep": {"$and": ["$_own", {"$eq": [{"$type": "$_until"}, "date"]}, {"$gt": ["$_until", NOW]}]}}},
        {
            "$set": {
                "owner": cond(released, None, "$owner"),
                "expiresAt": cond("$_own", cond("$_keep", "$_until", NOW), "$expiresAt"),
                "releasedAt": cond(released, NOW, "$releasedAt"),
                "releasedOwner": cond(released, "$_request.me", "$releasedOwner"),
                "job": cond("$_record", record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_FINISH_STAGES = _job_finish_stages()
