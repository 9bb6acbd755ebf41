"""How ``mongolock watch`` shows a [`LockWatch`][mongolock_async.live.LockWatch]: a live screen with
``rich`` on a terminal, else one line (or one JSON object) per event.

Names, labels and hosts are other people's text: on the screen they are plain ``rich`` text, never
markup, in printable form (see ``_inert.printable``: controls, C1 controls and bidi overrides
escaped), and so are lines; JSON keeps them exact, escaped as ``\\uXXXX``. A lock name can neither
style the screen, move the cursor, nor reorder what is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import sys
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from .._util.diagnosis import cause_of
from .._util.inert import json_text, printable
from ..admin.live import LockEvent, LockWatch, ViewUpdate, holder_dict
from ..admin.operations import LockInfo

EVENTS_SHOWN = 8
"""Events kept under the table on the screen."""
_BAR = 16
"""Characters of a time-left bar (half on a screen narrower than 100 columns)."""


async def show_lines(watch: LockWatch, stop: asyncio.Event, *, as_json: bool, write: Callable[[str], None]) -> None:
    """One line per event until ``stop`` is set; first one ``held`` line per live holder."""
    note: str | None = None
    cut_off: datetime | None = None
    async for update in _until(watch, stop):
        if update.disconnected_since != cut_off:
            cut_off = update.disconnected_since
            print(f"mongolock: {_connection_line(watch, cut_off)}", file=sys.stderr, flush=True)
        if update.note != note:
            note = update.note
            shown = f"mongolock: {printable(note)}" if note else "mongolock: the change stream is back"
            print(shown, file=sys.stderr, flush=True)
        lines = held_lines(update, as_json=as_json) if update.first else []
        lines += [event_line(event, as_json=as_json) for event in update.events]
        for line in lines:
            write(line)


def _connection_line(watch: LockWatch, cut_off: datetime | None) -> str:
    """That the view lost MongoDB (since when, and why: this is the operator's own terminal), or
    has it back."""
    if cut_off is None:
        return "reconnected to MongoDB: the view is current again"
    cause = "" if watch.last_error is None else f" ({printable(cause_of(watch.last_error))})"
    return f"disconnected from MongoDB since {_iso(cut_off)}{cause}: the state shown is the last known, stale"


def held_lines(update: ViewUpdate, *, as_json: bool) -> list[str]:
    """The state as the view opened: a ``held`` line per live holder."""
    lines = []
    for info in update.locks.values():
        for holder in info.holders:
            if as_json:
                lines.append(
                    json_text(
                        {
                            "at": _iso(update.server_time),
                            "event": "held",
                            "name": info.name,
                            "kind": info.kind,
                            "holder": holder_dict(holder),
                            "previous": None,
                            "fencing_token": holder.fencing_token,
                            "waiting": len(info.waiting),
                        }
                    )
                )
                continue
            left = "" if holder.expires_at is None else f", {_seconds(holder.expires_at, update.server_time)} left"
            text = f"{holder.describe()} holds it{left}, {len(info.waiting)} waiting"
            lines.append(_line(update.server_time, "held", info.name, text))
    return lines


def event_line(event: LockEvent, *, as_json: bool) -> str:
    if as_json:
        return json_text(event.as_dict())
    return _line(event.at, event.event, event.name, event.describe())


def _line(at: datetime, event: str, name: str, text: str) -> str:
    return f"{_iso(at)}  {event:<10}  {printable(name)}  {printable(text)}"


async def show_screen(watch: LockWatch, stop: asyncio.Event, *, held_only: bool) -> None:
    """A live screen (the terminal's alternate screen, as ``htop``'s) until ``stop`` is set."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    events: deque[LockEvent] = deque(maxlen=EVENTS_SHOWN)
    latest: list[ViewUpdate] = []

    def frame() -> Any:
        if not latest:
            return ""
        return screen(latest[-1], events, watch, console.width, console.height, held_only=held_only)

    with Live(get_renderable=frame, console=console, screen=True, refresh_per_second=4, redirect_stderr=False):
        async for update in _until(watch, stop):
            events.extend(update.events)
            latest[:] = [update]


def screen(
    update: ViewUpdate, events: Iterable[LockEvent], watch: LockWatch, width: int, height: int, *, held_only: bool
) -> Any:
    """One frame: a header, a row per lock (held ones first) that fits, and the last events."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = watch.server_now()
    source = "change stream" if update.mode == "stream" else f"polling every {watch.poll_interval:g} s"
    header = Text.assemble(
        ("mongolock watch ", "bold"),
        printable(watch.full_name),
        (f"  prefix {printable(watch.prefix)}" if watch.prefix else ""),
        f"  {source}  {now:%H:%M:%S} UTC  Ctrl-C stops",
    )
    parts: list[Any] = [header]
    if update.disconnected_since is not None:
        since = f"{update.disconnected_since:%H:%M:%S} UTC"
        parts.append(Text(f"disconnected from MongoDB since {since}: the last known state, stale", style="bold red"))
    if update.note:
        parts.append(Text(printable(update.note), style="yellow"))
    total = sum(1 for info in update.locks.values() if info.held or not held_only)
    shown_events = list(events)
    room = max(1, height - len(parts) - 4 - (len(shown_events) + 2 if shown_events else 0))
    # Only what fits, held ones first, picked without sorting every lock (a view of 100,000).
    locks = heapq.nsmallest(
        room if total <= room else room - 1,
        (info for info in update.locks.values() if info.held or not held_only),
        key=lambda info: (not info.held, info.name),
    )
    bar = _BAR if width >= 100 else _BAR // 2
    stale = update.disconnected_since is not None
    rows = [_cells(info, now, bar, stale=stale) for info in locks]
    headers = ["NAME", "KIND", "STATE", "HOLDER", "TIME LEFT", "WAITING", "TOKEN"]
    widest = [max([len(header)] + [row[index].cell_len for row in rows]) for index, header in enumerate(headers)]
    # The columns get what they need, but the name (a longer one wraps, never cut) and the holder
    # (shortened with an ellipsis) share what is left, half each unless one needs less: the time
    # left and a fencing token (16 digits or so: a cut one would read as another number) are never cut.
    room_left = width - (sum(widest[1:3]) + sum(widest[4:]) + len(headers) - 1)  # a space between columns
    holder = min(widest[3], max(10, room_left // 2))
    name = min(widest[0], max(8, room_left - holder))
    holder = min(widest[3], max(6, room_left - name))
    table = Table(box=None, pad_edge=False, expand=False, header_style="bold", padding=(0, 1, 0, 0))
    table.add_column(headers[0], overflow="fold", width=name)
    table.add_column(headers[1], no_wrap=True)
    table.add_column(headers[2], no_wrap=True)
    table.add_column(headers[3], overflow="ellipsis", no_wrap=True, width=holder)
    table.add_column(headers[4], no_wrap=True)
    table.add_column(headers[5], justify="right", no_wrap=True)
    table.add_column(headers[6], justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    parts.append(table if locks else Text("no locks" + (" held" if held_only else "")))
    if total > room:
        parts.append(Text(f"... and {total - room + 1} more (narrow with --prefix or --held)", style="dim"))
    if shown_events:
        parts.append(Text("\nlast events", style="bold"))
        for event in reversed(shown_events):
            parts.append(
                Text.assemble(
                    (f"{event.at:%H:%M:%S.%f}"[:-3] + "  ", "dim"),
                    (f"{event.event:<10}  ", _EVENT_STYLES.get(event.event, "")),
                    printable(event.name),
                    "  ",
                    printable(event.describe()),
                    overflow="ellipsis",
                    no_wrap=True,
                )
            )
    return Group(*parts)


_EVENT_STYLES = {
    "acquired": "green",
    "handed off": "cyan",
    "released": "",
    "expired": "yellow",
    "lost": "red",
    "forced": "bold red",
}


def _cells(info: LockInfo, now: datetime, bar: int, *, stale: bool = False) -> list[Any]:
    """A row of the screen; while the view is cut off from MongoDB, a held lease's time left is
    ``stale`` (it may have been renewed)."""
    from rich.text import Text

    holders = info.holders
    if len(holders) == 1:
        holder = holders[0].describe()
    elif holders:
        holder = f"{len(holders)} {'readers' if info.kind == 'rwlock' else 'holders'}"
    elif info.last_holder is not None:
        holder = f"(was {info.last_holder.describe()})"
    else:
        holder = ""
    ends = [h.expires_at for h in holders if h.expires_at is not None and h.expires_at > now]
    time_left = Text("")
    if stale and holders:
        time_left = Text("stale", style="dim")
    elif ends:
        end = max(ends)
        ttl = max((h.ttl_ms or 0) for h in holders) / 1000 or None
        left = (end - now).total_seconds()
        filled = bar if not ttl else round(bar * min(1.0, left / ttl))
        time_left = Text.assemble(("█" * filled, "green"), ("░" * (bar - filled), "dim"), f" {left:5.1f} s")
    token = info.fencing_token
    if holders and info.kind in ("semaphore", "rwlock", "election"):
        token = max(h.fencing_token or 0 for h in holders)
    state_style = {"held": "green", "expired": "yellow", "unreadable": "red"}.get(info.status, "")
    return [
        Text(printable(info.name)),
        Text(info.kind),
        Text(info.summary, style="green" if info.held else state_style),
        Text(printable(holder)),
        time_left,
        Text(str(len(info.waiting)) if info.waiting else ""),
        Text("" if token is None else str(token)),
    ]


async def _until(watch: LockWatch, stop: asyncio.Event) -> Any:
    """The watch's updates until ``stop`` is set (then the iteration in flight is abandoned)."""
    updates = watch.__aiter__()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            following = asyncio.ensure_future(updates.__anext__())
            done, _ = await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if following not in done:
                following.cancel()  # the generator must be left before it can be closed
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
                return
            try:
                yield following.result()
            except StopAsyncIteration:
                return
    finally:
        stopping.cancel()


def _seconds(end: datetime, now: datetime) -> str:
    return f"{max(0.0, (end - now).total_seconds()):.1f} s"


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
