"""A job's state as its document reports it, judged on the server's clock: what ran in which period,
whether the period is done, and why a call did not run the job, in words. Read by the job handle
(``AsyncMongoJob.state``), the operator tools and the command."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .documents import JobRecord, JobRun, LockReport, Period

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class JobState:
    """A job's schedule and runs, judged on the server's clock when read."""

    name: str
    every: timedelta | None
    """Its period, as its last run asked for it (None: not scheduled per period)."""
    offset: timedelta
    min_interval: timedelta | None
    max_attempts: int | None
    server_time: datetime
    """The server's clock when this was read."""
    period: Period | None
    """The current period, by the schedule the job's last run asked for (None without ``every``)."""
    done: bool
    """Whether a run that started in the current period (or later) succeeded."""
    attempts: int
    """Runs started in the current period (or later)."""
    exhausted: bool
    """Whether the current period's attempts are used up without a success: no call runs the job
    again before the next period (the failure is in ``last``)."""
    held: bool
    """Whether the job's lease is live (a run holds it, or it is kept by ``hold_at_least``)."""
    running: JobRun | None
    """The run that holds the lease now."""
    last: JobRun | None
    """The latest run that ended (a run whose lease expired unfinished shows as ``lost``)."""
    not_before: datetime | None
    """With ``min_interval``: no run starts before this (server time)."""

    @classmethod
    def from_report(cls, report: LockReport) -> JobState:
        """A job's state from a report of its document (see ``LockStore.report``)."""
        state = report.state
        if state is None or report.server_time is None:
            raise RuntimeError(f"a job's state from a report without a document or the server's time: {report.name!r}")
        record = state.job or JobRecord()
        now = report.server_time
        every = None if record.every_ms is None else timedelta(milliseconds=record.every_ms)
        offset = timedelta(milliseconds=record.offset_ms)
        period = None if every is None else period_at(now, every, offset)
        held = report.remaining_ms is not None
        last, last_ended_at = record.last, record.last_ended_at
        if record.running is not None and not held:  # its lease expired unfinished
            last = record.running._replace(ended_at=state.expires_at, outcome="lost")
            last_ended_at = max(filter(None, (last_ended_at, state.expires_at)), default=None)
        attempts = record.attempts_in(period)
        done = record.done_in(period)
        max_attempts = record.max_attempts
        min_interval = None if record.min_interval_ms is None else timedelta(milliseconds=record.min_interval_ms)
        return cls(
            name=state.name,
            every=every,
            offset=offset,
            min_interval=min_interval,
            max_attempts=max_attempts,
            server_time=now,
            period=period,
            done=done,
            attempts=attempts,
            exhausted=bool(period is not None and not done and max_attempts and attempts >= max_attempts and not held),
            held=held,
            running=record.running if held else None,
            last=last,
            not_before=None if min_interval is None or last_ended_at is None else last_ended_at + min_interval,
        )


def period_at(moment: datetime, every: timedelta, offset: timedelta) -> Period:
    """The period of ``every`` (shifted by ``offset``) that ``moment`` falls in, as the server's
    pipeline computes it: in whole milliseconds since the Unix epoch."""
    every_ms, offset_ms = every // _MILLISECOND, offset // _MILLISECOND
    moment_ms = (moment - _EPOCH) // _MILLISECOND
    start = _EPOCH + (moment_ms - (moment_ms - offset_ms) % every_ms) * _MILLISECOND
    return Period(start, start + every)


def describe_skip(reason: str | None, record: JobRecord) -> str:
    """Why a call did not run the job, in words, with who ran it and when."""
    last, running = record.last, record.running
    period = record.skipped[0] if record.skipped is not None else None
    if reason == "running" and running is not None:
        return f"running since {_when(running.started_at)} ({_who(running.holder)}, attempt {running.attempt})"
    if reason == "done" and last is not None:
        return f"done in the period {_span_of(period)}: last succeeded by {_who(last.holder)} at {_when(last.ended_at)}"
    if reason == "failed" and last is not None:
        error = f": {last.error_type}: {last.error_message}" if last.error_type else f" ({last.outcome})"
        return f"the period {_span_of(period)} failed after {record.attempts_in(period)} attempts{error}"
    if reason == "too_soon" and record.last_ended_at is not None and record.min_interval_ms is not None:
        not_before = record.last_ended_at + timedelta(milliseconds=record.min_interval_ms)
        return f"the last run ended at {_when(record.last_ended_at)}; no run before {_when(not_before)}"
    if reason == "held":
        return "its lease is held (kept after a run by hold_at_least, or by a lock of the same name)"
    return reason or "not due"


def _span_of(period: Period | None) -> str:
    return "(none)" if period is None else f"from {_when(period.start)} to {_when(period.end)}"


def _who(holder: Any) -> str:
    label = holder.get("label")
    where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
    return f"{label} ({where})" if label else where


def _when(moment: datetime | None) -> str:
    return "an unknown time" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S} UTC"
