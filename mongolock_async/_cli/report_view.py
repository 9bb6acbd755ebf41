"""How the ``mongolock`` command shows locks: a table, a detail view, or JSON."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .._util.inert import json_text, printable
from ..admin.operations import status_of
from ..store.documents import JOB_KIND, JobRun, LockReport, LockState, Period, Place
from ..store.job_state import JobState

# Fencing tokens, owner tokens and full times are in `inspect` and --json: the table fits a terminal.
COLUMNS = ("NAME", "STATE", "HOLDER", "TIME", "WAITING")


def state_of(report: LockReport) -> str:
    """held, released, released by force, expired, free (never taken), or unreadable."""
    return status_of(report)


def as_dict(report: LockReport) -> dict[str, Any]:
    """A report as JSON-ready values (times in ISO 8601, UTC)."""
    state = report.state
    if state is None:
        return {"name": report.name, "state": "unreadable", "error": str(report.error)}
    semaphore: dict[str, Any] = {}
    if state.limit is not None:
        holders = [
            {
                "owner": permit.token,
                "holder": dict(permit.holder) if permit.holder else None,
                "fencing_token": permit.fencing_token,
                "time_left_ms": report.permits_left_ms[permit.token],
                "acquired_at": _iso(permit.acquired_at),
                "renewed_at": _iso(permit.renewed_at),
                "expires_at": _iso(permit.expires_at),
            }
            for permit in report.live_permits
        ]
        if state.kind == "election":
            semaphore = {
                "leader": holders[0] if holders else None,
                "candidates": [dict(place.holder) for place in state.queue],
            }
        elif state.kind == "rwlock":
            writing = _writing(report, state)
            semaphore = {
                "readers": [] if writing else holders,
                "writer": holders[0] if writing else None,
                "waiting_writers": sum(place.weight == state.limit for place in state.queue),
            }
        else:
            semaphore = {"limit": state.limit, "holders": holders}
    if state.kind == JOB_KIND and report.server_time is not None:
        semaphore = {"job": _job_dict(JobState.from_report(report))}
    return {
        "name": state.name,
        "kind": state.kind,
        "state": state_of(report),
        "held": report.remaining_ms is not None,
        "time_left_ms": report.remaining_ms,
        "fencing_token": state.fencing_token,
        "holder": dict(state.holder) if state.holder else None,
        "ttl_ms": state.ttl_ms,
        "expires_at": _iso(state.expires_at),
        "acquired_at": _iso(state.acquired_at),
        "renewed_at": _iso(state.renewed_at),
        # While held, the stored release time is the previous lease's: not shown as this one's.
        "released_at": None if report.remaining_ms is not None else _iso(state.released_at),
        "waiting": [dict(place.holder) for place in state.queue],
        **semaphore,
    }


def _job_dict(job: JobState) -> dict[str, Any]:
    def run(entry: JobRun | None) -> dict[str, Any] | None:
        if entry is None:
            return None
        error = None if entry.error_type is None else {"type": entry.error_type, "message": entry.error_message}
        return {
            "attempt": entry.attempt,
            "period": period(entry.period),
            "holder": dict(entry.holder) if entry.holder else None,
            "started_at": _iso(entry.started_at),
            "ended_at": _iso(entry.ended_at),
            "outcome": entry.outcome,
            "error": error,
        }

    def ms(value: Any) -> int | None:
        return None if value is None else round(value.total_seconds() * 1000)

    def period(span: Period | None) -> dict[str, Any] | None:
        return None if span is None else {"start": _iso(span.start), "end": _iso(span.end)}

    return {
        "state": job_word(job),
        "every_ms": ms(job.every),
        "offset_ms": ms(job.offset),
        "min_interval_ms": ms(job.min_interval),
        "max_attempts": job.max_attempts,
        "period": period(job.period),
        "done": job.done,
        "attempts": job.attempts,
        "exhausted": job.exhausted,
        "running": run(job.running),
        "last": run(job.last),
        "not_before": _iso(job.not_before),
    }


def job_word(job: JobState) -> str:
    """A job's state in a word: running, held, done, failed (its period's attempts used up), due
    (its period not done yet); without ``every``: how the last run ended, or never run."""
    if job.running is not None:
        return "running"
    if job.held:
        return "held"
    if job.period is not None:
        return "done" if job.done else ("failed" if job.exhausted else "due")
    if job.last is None:
        return "never run"
    return job.last.outcome or "ended"


def print_json(payload: Any) -> None:
    """UTF-8 JSON on stdout: text exact, non-ASCII characters as they are, but every character that
    is not printable (controls, bidi overrides) escaped (see ``_inert.json_text``)."""
    utf8_stdout()
    print(json_text(payload, indent=2))


def print_table(reports: Sequence[LockReport]) -> None:
    """One line per lock under a header; with ``rich`` on a terminal when it is installed. On a
    terminal (or with ``COLUMNS`` set) the table fits its width: the holder column is shortened,
    never the name; piped elsewhere, rows are whole. Every cell is printable text (see
    ``_inert.printable``), and rich reads it as text, never as markup."""
    rows = [_row(report) for report in reports]
    widths = [max(len(cell) for cell in column) for column in zip(COLUMNS, *rows, strict=True)]
    if sys.stdout.isatty():
        try:
            from rich import box
            from rich.console import Console
            from rich.table import Table
            from rich.text import Text
        except ImportError:
            pass
        else:
            console = Console()
            name, state, holder, time, waiting = widths
            # STATE, TIME and WAITING as wide as their content; the rest of the terminal's width
            # shared by the name (wrapped, never cut, when it must) and the holder (shortened).
            flexible = max(24, console.width - (state + time + waiting) - 12)  # 4 gaps of 3
            name = min(name, flexible - min(holder, 16))
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
            table.add_column("NAME", overflow="fold", width=name)
            table.add_column("STATE", no_wrap=True, width=state)
            table.add_column("HOLDER", overflow="ellipsis", no_wrap=True, width=min(holder, flexible - name))
            table.add_column("TIME", no_wrap=True, width=time)
            table.add_column("WAITING", justify="right", no_wrap=True, width=waiting)
            for row in rows:
                table.add_row(*(Text(cell) for cell in row))
            console.print(table)
            return
    utf8_stdout()
    widths = _fitted(widths)
    for line in (COLUMNS, *rows):
        _print_row(line, widths)


def _fitted(widths: list[int]) -> list[int]:
    """On a terminal (or with ``COLUMNS`` set), the holder column shortened to fit its width."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        excess = sum(widths) + 2 * (len(widths) - 1) - shutil.get_terminal_size().columns
        widths = [*widths[:2], max(len(COLUMNS[2]), widths[2] - max(0, excess)), *widths[3:]]
    return widths


def _print_row(line: Sequence[str], widths: Sequence[int]) -> None:
    cells = [*line[:2], _shortened(line[2], widths[2]), *line[3:]]
    print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip())


CHUNK = 1000
"""Locks a streamed listing holds at once."""


class JsonArray:
    """A JSON array printed an element at a time, as ``print_json`` would print it whole."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, reports: Sequence[LockReport]) -> None:
        utf8_stdout()
        for report in reports:
            element = json_text(as_dict(report), indent=2).replace("\n", "\n  ")
            print(("[\n  " if self.count == 0 else ",\n  ") + element, end="")
            self.count += 1

    def finish(self) -> int:
        print("[]" if self.count == 0 else "\n]")
        return self.count


class StreamedTable:
    """The table of ``print_table``, for a listing of any size: one that fits a chunk is
    printed as before (rich on a terminal); a longer one as plain rows a chunk at a time, its
    columns as wide as the first chunk needs (a longer cell later pushes its row along)."""

    def __init__(self) -> None:
        self.count = 0
        self._first: list[LockReport] | None = None
        self._widths: list[int] | None = None

    def add(self, reports: Sequence[LockReport]) -> None:
        if not reports:
            return
        self.count += len(reports)
        if self._first is None and self._widths is None:
            self._first = list(reports)
            return
        self._plain(reports)

    def finish(self) -> int:
        if self._first is not None:
            print_table(self._first)
        return self.count

    def _plain(self, reports: Sequence[LockReport]) -> None:
        utf8_stdout()
        if self._widths is None:
            first, self._first = self._first or [], None
            rows = [_row(report) for report in first]
            self._widths = _fitted([max(len(cell) for cell in column) for column in zip(COLUMNS, *rows, strict=True)])
            for line in (COLUMNS, *rows):
                _print_row(line, self._widths)
        for report in reports:
            _print_row(_row(report), self._widths)


def _shortened(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def print_detail(report: LockReport) -> None:
    """Every fact about one lock, one per line, for people."""
    utf8_stdout()
    state = report.state
    if state is None:
        say(f"lock      {report.name!r}")
        say(f"state     unreadable: {report.error}")
        return
    if state.limit is not None:
        _print_semaphore(report, state)
        return
    if state.kind == JOB_KIND and report.server_time is not None:
        _print_job(report, state, JobState.from_report(report))
        return
    say(f"lock      {state.name}")
    say(f"state     {_state_line(report, state)}")
    held = report.remaining_ms is not None
    say(f"{'holder' if held else 'last by':9} {holder_text(state.holder) or '-'}")
    if held:  # what `release --force --holder` names
        say(f"owner     {state.owner}")
    say(f"token     {state.fencing_token}")
    say(f"ttl       {'-' if state.ttl_ms is None else f'{state.ttl_ms / 1000:g} s'}")
    moments = [("acquired", state.acquired_at), ("renewed", state.renewed_at)]
    if not held:  # while held, the stored release time is the previous lease's
        moments.append(("released", state.released_at))
    for label, moment in [*moments, ("expires", state.expires_at)]:
        say(f"{label:9} {_when(moment)}")
    waiting = [holder_text(place.holder) or place.token[:8] for place in state.queue]
    say(f"waiting   {', '.join(waiting) if waiting else 'nobody'}")


def _print_job(report: LockReport, state: LockState, job: JobState) -> None:
    say(f"job       {state.name}")
    word = job_word(job)
    if job.running is not None or job.held:
        word += f", {(report.remaining_ms or 0) / 1000:.1f} s left"
    elif word == "failed":
        word += f" in this period after {job.attempts} attempts"
    elif word in ("done", "due"):
        word += " in this period"
    say(f"state     {word}")
    schedule = []
    if job.every is not None:
        schedule.append(f"every {_span(job.every)}" + (f" (offset {_span(job.offset)})" if job.offset else ""))
        schedule.append(f"at most {job.max_attempts} attempts per period")
    if job.min_interval is not None:
        schedule.append(f"at least {_span(job.min_interval)} between runs")
    say(f"schedule  {', '.join(schedule) or 'one run at a time'}")
    if job.period is not None:
        attempts = f"{job.attempts} attempt{'' if job.attempts == 1 else 's'} so far"
        say(f"period    {_when(job.period.start)} to {_when(job.period.end)}, {attempts}")
    if job.not_before is not None and job.not_before > job.server_time:
        say(f"next      not before {_when(job.not_before)}")
    if job.running is not None:
        running = job.running
        who = holder_text(running.holder) or "-"
        say(f"running   {who}, attempt {running.attempt}, since {_when(running.started_at)}")
    last = job.last
    if last is None:
        say("last run  never")
    else:
        took = "" if last.duration is None else f" ({last.duration:.3f} s)"
        say(f"last run  {last.outcome or 'ended'}, attempt {last.attempt}, by {holder_text(last.holder) or '-'}")
        say(f"          {_when(last.started_at)} to {_when(last.ended_at)}{took}")
        if last.error_type is not None:
            say(f"error     {last.error_type}: {last.error_message}")
    say(f"token     {state.fencing_token}")


def _span(duration: Any) -> str:
    seconds = duration.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g} {unit}"
    return f"{seconds:g} s"


def _writing(report: LockReport, state: LockState) -> bool:
    """Whether a read-write lock's live holder is its writer."""
    return any(permit.weight == state.limit for permit in report.live_permits)


def _print_semaphore(report: LockReport, state: LockState) -> None:
    permits = report.live_permits
    if state.kind == "election":
        say(f"election  {state.name}")
        say(f"state     {'led' if permits else 'no leader'}" + ("" if permits else f" ({state_of(report)})"))
    elif state.kind == "rwlock":
        say(f"rw lock   {state.name}")
        held = ("written" if _writing(report, state) else f"read by {len(permits)}") if permits else state_of(report)
        say(f"state     {held}")
    else:
        say(f"semaphore {state.name}")
        say(f"state     {len(permits)} of {state.limit} permits held" + ("" if permits else f" ({state_of(report)})"))
    say(f"token     {state.fencing_token} (the latest handed out)")
    for permit in permits:
        left = report.permits_left_ms[permit.token] / 1000
        who = holder_text(permit.holder) or "an unlabelled holder"
        # The whole owner token: the tokens of one process's permits share their start, so only the
        # whole token is sure to select one holder for `release --force --holder`.
        if state.kind == "election":
            say(f"leader    {who}")
            say(f"          owner {permit.token}")
            say(f"term      {permit.fencing_token}, since {_when(permit.acquired_at)}, {left:.1f} s left")
            continue
        say(f"holder    {who}, token {permit.fencing_token}, {left:.1f} s left")
        say(f"          owner {permit.token}")
    waiting = [_waiter(place, state) for place in state.queue]
    label = "candidates" if state.kind == "election" else "waiting"
    say(f"{label:9} {', '.join(waiting) if waiting else 'nobody'}")


def _waiter(place: Place, state: LockState) -> str:
    who = holder_text(place.holder) or place.token[:8]
    if state.kind != "rwlock":
        return who
    return f"{who} ({'write' if place.weight == state.limit else 'read'})"


def _row(report: LockReport) -> tuple[str, ...]:
    state = report.state
    if state is None:
        return (printable(str(report.name)), "unreadable", printable(str(report.error)), "", "")
    kind = state_of(report)
    shown = "force-released" if kind == "released by force" else kind
    if kind == "held":
        time = f"{(report.remaining_ms or 0) / 1000:.1f} s left"
    elif kind == "expired":
        time = f"since {_short(state.expires_at)}"
    else:
        time = "" if state.released_at is None else f"since {_short(state.released_at)}"
    holder = holder_text(state.holder) if kind == "held" else ""
    if state.kind == "election" and report.live_permits:
        shown, holder = "led", holder_text(report.live_permits[0].holder)
    elif state.kind == "rwlock" and report.live_permits:
        permits = report.live_permits
        shown = "written" if _writing(report, state) else f"read by {len(permits)}"
        holder = holder_text(permits[0].holder) if len(permits) == 1 else f"{len(permits)} readers"
    elif state.limit is not None:
        permits = report.live_permits
        shown = f"{len(permits)}/{state.limit} held" if permits else shown
        holder = holder_text(permits[0].holder) if len(permits) == 1 else (f"{len(permits)} holders" if permits else "")
    elif state.kind == JOB_KIND and report.server_time is not None:
        job = JobState.from_report(report)
        shown = job_word(job)
        run = job.running or job.last
        holder = holder_text(run.holder) if run is not None else ""
        if not job.held:
            time = "" if job.last is None else f"ended {_short(job.last.ended_at)}"
    return (printable(state.name), shown, printable(holder), time, str(len(state.queue)) if state.queue else "")


def _state_line(report: LockReport, state: LockState) -> str:
    kind = state_of(report)
    if kind == "held":
        return f"held, {(report.remaining_ms or 0) / 1000:.1f} s left"
    if kind == "expired":
        return f"expired at {_when(state.expires_at)} (its holder never released it)"
    return kind


def holder_text(holder: Mapping[str, Any]) -> str:
    """Who a holder is, in a few words (label, host and pid)."""
    if not holder:
        return ""
    label = holder.get("label")
    where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
    return f"{label} ({where})" if label else where


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def _short(moment: datetime | None) -> str:
    """The time of day if ``moment`` is today (UTC), else the date."""
    if moment is None:
        return "never"
    return f"{moment:%H:%M:%S}" if moment.date() == datetime.now(UTC).date() else f"{moment:%Y-%m-%d}"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def say(line: str) -> None:
    """One line for people: printable (each caller passes one line: a newline in it is someone
    else's, and shows as ``\\n``)."""
    print(printable(line))


def utf8_stdout() -> None:
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and (sys.stdout.encoding or "").lower().replace("-", "") != "utf8":
        reconfigure(encoding="utf-8")
