"""The queries of a job's document: the start that decides whether a run is due and records it,
and the finish that records how it ended.

A job's document is a lock's (owner, expiresAt, fence, ttlMs, holder, ...) with kind "job" and the
job's record: job: {every, offset, minInterval, maxAttempts (the schedule as last asked for), slot
and attempts (runs started in that slot), doneSlot (the latest slot a run succeeded in), run: {o,
slot, attempt, startedAt, holder} (the run holding the lease, or null), last: (the latest run that
ended, with endedAt, outcome, error: {type, message}), lastEndedAt, seen: {slot, why} (the latest
decision not to run), finished: [the last owner tokens that finished a run]}. A slot is
floor((server time in ms - offset) / every): periods of the server's clock, so clients' clocks never
decide whether a slot is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ..documents import JOB_KIND
from . import expressions
from .expressions import _LEASE_FIELDS_SANE, _NEXT_FENCE, _NOW, _array_or_empty, _if, _server_plus, _type_in, _values


class JobSchedule(NamedTuple):
    """When a job may run (see ``LockStore.start_job``), in milliseconds."""

    every_ms: int | None = None
    """Run at most once per slot of this length of the server's clock; None: no slots."""
    offset_ms: int = 0
    """Slots start this long after each multiple of ``every_ms`` since the Unix epoch."""
    min_interval_ms: int | None = None
    """Start no run sooner than this after the last run ended."""
    max_attempts: int = 1
    """Runs allowed per slot (with ``every_ms``)."""


_JOB_KIND_IS: dict[str, Any] = {"$eq": ["$kind", JOB_KIND]}
_JOB_SANE: dict[str, Any] = {
    "$and": [
        _LEASE_FIELDS_SANE,
        {"$or": [_type_in("$kind", "missing", "null"), _JOB_KIND_IS]},
        _type_in("$job", "missing", "null", "object"),
        _type_in("$job.slot", "missing", "null", "int", "long"),
        _type_in("$job.attempts", "missing", "null", "int", "long"),
        _type_in("$job.doneSlot", "missing", "null", "int", "long"),
        _type_in("$job.run", "missing", "null", "object"),
        _type_in("$job.lastEndedAt", "missing", "null", "date"),
    ]
}
"""A job's document, or a lock's (a ``run_once`` of an earlier version kept its job in one)."""
_FINISHED_REMEMBERED = 16
_JOB_TEMPORARY = ["_v", "_now", "_sane", "_j", "_live", "_slot", "_lost", "_attempts", "_lastEnd", "_why", "_take",
                  "_own", "_until", "_keep"]  # fmt: skip


def start_pipeline(owner: str, ttl_ms: int, holder: Mapping[str, Any], schedule: JobSchedule) -> list[Any]:
    values = {
        "me": owner,
        "ttl": ttl_ms,
        "holder": dict(holder),
        "every": schedule.every_ms,
        "offset": schedule.offset_ms,
        "minInterval": schedule.min_interval_ms,
        "maxAttempts": schedule.max_attempts,
    }
    return [_values(**values), *_JOB_START_STAGES]


def _job_start_stages() -> tuple[dict[str, Any], ...]:
    slot = {
        "$toLong": {"$floor": {"$divide": [{"$subtract": [{"$toLong": _NOW}, "$_v.offset"]}, "$_v.every"]}}
    }
    has_run = {"$eq": [{"$type": "$_j.run"}, "object"]}
    slotted = {"$ne": ["$_slot", None]}
    too_soon = {
        "$and": [
            {"$ne": ["$_v.minInterval", None]},
            {"$eq": [{"$type": "$_lastEnd"}, "date"]},
            {"$lt": [_NOW, {"$add": ["$_lastEnd", "$_v.minInterval"]}]},
        ]
    }
    why = _if(
        {"$not": ["$_sane"]},
        "corrupt",
        _if(
            "$_live",
            _if(has_run, "running", "held"),
            _if(
                {"$and": [slotted, {"$eq": ["$_j.doneSlot", "$_slot"]}]},
                "done",
                _if(
                    {"$and": [slotted, {"$gte": ["$_attempts", "$_v.maxAttempts"]}]},
                    "failed",
                    _if(too_soon, "too_soon", None),
                ),
            ),
        ),
    )
    attempt = {"$add": ["$_attempts", 1]}
    run = {"o": "$_v.me", "slot": "$_slot", "attempt": attempt, "startedAt": _NOW, "holder": "$_v.holder"}
    record = {
        "$mergeObjects": [
            "$_j",
            {
                "every": "$_v.every",
                "offset": "$_v.offset",
                "minInterval": "$_v.minInterval",
                "maxAttempts": "$_v.maxAttempts",
                "slot": _if("$_take", "$_slot", "$_j.slot"),
                "attempts": _if("$_take", attempt, "$_j.attempts"),
                "run": _if("$_take", run, _if("$_lost", None, "$_j.run")),
                "last": _if(
                    "$_lost", {"$mergeObjects": ["$_j.run", {"endedAt": "$expiresAt", "outcome": "lost"}]}, "$_j.last"
                ),
                "lastEndedAt": "$_lastEnd",
                "seen": _if("$_take", "$_j.seen", {"slot": "$_slot", "why": "$_why"}),
            },
        ]
    }
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": _JOB_SANE, "_j": {"$cond": [{"$eq": [{"$type": "$job"}, "object"]}, "$job", {}]}}},
        {
            "$set": {
                "_live": {"$and": ["$_sane", {"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", _NOW]}]},
                "_slot": _if({"$eq": ["$_v.every", None]}, None, slot),
            }
        },
        {
            "$set": {
                "_lost": {"$and": ["$_sane", {"$not": ["$_live"]}, has_run]},
                "_attempts": _if({"$eq": ["$_j.slot", "$_slot"]}, {"$ifNull": ["$_j.attempts", 0]}, 0),
            }
        },
        # A run lost with its lease ended when the lease expired: that counts for min_interval.
        {"$set": {"_lastEnd": _if("$_lost", {"$max": ["$_j.lastEndedAt", "$expiresAt"]}, "$_j.lastEndedAt")}},
        {"$set": {"_why": why}},
        {"$set": {"_take": {"$and": ["$_sane", {"$eq": ["$_why", None]}]}}},
        {
            "$set": {
                "kind": _if("$_take", JOB_KIND, "$kind"),
                "owner": _if("$_take", "$_v.me", "$owner"),
                "expiresAt": _if("$_take", _server_plus(_NOW, "$_v.ttl"), "$expiresAt"),
                "fence": _if("$_take", _NEXT_FENCE, "$fence"),
                "ttlMs": _if("$_take", "$_v.ttl", "$ttlMs"),
                "holder": _if("$_take", "$_v.holder", "$holder"),
                "acquiredAt": _if("$_take", _NOW, "$acquiredAt"),
                "renewedAt": _if("$_take", _NOW, "$renewedAt"),
                # A lock's document (a run_once of an earlier version) gets a record only when taken.
                "job": _if({"$and": ["$_sane", {"$or": ["$_take", _JOB_KIND_IS]}]}, record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_START_STAGES = _job_start_stages()


def finish_pipeline(
    owner: str, outcome: str, error: Mapping[str, str] | None, hold_at_least_ms: int | None
) -> list[Any]:
    error_record = None if error is None else dict(error)
    values = {"me": owner, "outcome": outcome, "error": error_record, "hold": hold_at_least_ms}
    return [_values(**values), *_JOB_FINISH_STAGES]


def _job_finish_stages() -> tuple[dict[str, Any], ...]:
    released = {"$and": ["$_own", {"$not": ["$_keep"]}]}
    succeeded_in_a_slot = {
        "$and": [{"$eq": ["$_v.outcome", "succeeded"]}, {"$ne": [{"$ifNull": ["$_j.run.slot", None]}, None]}]
    }
    record = {
        "$mergeObjects": [
            "$_j",
            {
                "run": None,
                "last": {
                    "$mergeObjects": ["$_j.run", {"endedAt": _NOW, "outcome": "$_v.outcome", "error": "$_v.error"}]
                },
                "lastEndedAt": _NOW,
                "doneSlot": _if(succeeded_in_a_slot, "$_j.run.slot", "$_j.doneSlot"),
                "finished": {
                    "$slice": [
                        {"$concatArrays": [_array_or_empty("$_j.finished"), ["$_v.me"]]},
                        -_FINISHED_REMEMBERED,
                    ]
                },
            },
        ]
    }
    return (
        {"$set": {"_now": expressions.SERVER_NOW}},
        {"$set": {"_sane": {"$and": [_JOB_SANE, _JOB_KIND_IS]}, "_j": "$job"}},
        {
            "$set": {
                "_own": {
                    "$and": [
                        "$_sane",
                        {"$eq": ["$owner", "$_v.me"]},
                        {"$gt": ["$expiresAt", _NOW]},
                        {"$eq": ["$_j.run.o", "$_v.me"]},
                    ]
                }
            }
        },
        {"$set": {"_until": _if({"$eq": ["$_v.hold", None]}, None, {"$add": ["$_j.run.startedAt", "$_v.hold"]})}},
        {"$set": {"_keep": {"$and": ["$_own", {"$eq": [{"$type": "$_until"}, "date"]}, {"$gt": ["$_until", _NOW]}]}}},
        {
            "$set": {
                "owner": _if(released, None, "$owner"),
                "expiresAt": _if("$_own", _if("$_keep", "$_until", _NOW), "$expiresAt"),
                "releasedAt": _if(released, _NOW, "$releasedAt"),
                "releasedOwner": _if(released, "$_v.me", "$releasedOwner"),
                "job": _if("$_own", record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_FINISH_STAGES = _job_finish_stages()
