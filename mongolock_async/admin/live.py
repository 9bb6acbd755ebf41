"""The implementation of ``mongolock_async.live`` (its public path; the user guide is there)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal

from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from .._util import validation
from .._util.backoff import Backoff
from .._util.collection_types import AsyncCollectionLike
from .._util.diagnosis import redacted_cause
from .._util.shield import wait_within
from ..errors import LockDataError
from ..store import LockStore, change_streams_refused, change_streams_unsupported, store_for
from ..store.documents import LockReport, LockState
from .operations import Holder, LockInfo, lock_info, permit_holder, report_at, stored_holder

__all__ = ["EventKind", "LockEvent", "LockWatch", "ViewUpdate", "derive_events"]

EventKind = Literal["acquired", "handed off", "released", "expired", "lost", "forced"]
"""What happened to a lease: taken; passed to a waiter by its holder's release (one write);
released by its holder; reached its expiry unrenewed (noticed by the view's own timer: expiry writes
nothing); taken over or dropped after it expired (gone for good); broken by a forced release."""
_MAJORITY = WriteConcern(w="majority")
_REOPEN_BASE, _REOPEN_CAP = 0.5, 30.0


@dataclass(frozen=True, slots=True)
class LockEvent:
    """Something that happened to one lease of ``name``."""

    at: datetime
    """When, on the server's clock: the write's time where the server reports it (``wallTime``,
    MongoDB 6.0+), the expiry itself for ``expired``, else when the view saw it."""
    event: EventKind
    name: str
    kind: str
    """The kind of ``name``: ``lock``, ``semaphore``, ``rwlock``, ``election`` or ``job``."""
    holder: Holder | None
    """Whom it concerns: the new holder of ``acquired`` and ``handed off``, else the one whose
    lease ended."""
    previous: Holder | None = None
    """For ``handed off``: the holder who released it."""
    fencing_token: int | None = None
    """The lease's fencing token (an election's term)."""

    def describe(self) -> str:
        """The event in words, without the name: ``by shop-1 (vm pid 12), token 170...``."""
        who = _who(self.holder)
        token = "" if self.fencing_token is None else f", {'term' if self.kind == 'election' else 'token'} "
        token += "" if self.fencing_token is None else str(self.fencing_token)
        role = self.holder.role if self.holder is not None else "holder"
        if self.event == "acquired":
            verb = {"leader": "leads", "reader": "reads", "writer": "writes"}.get(role, "took it")
            return f"{who} {verb}{token}"
        if self.event == "handed off":
            return f"from {_who(self.previous)} to {who}{token}"
        if self.event == "released":
            return f"{who} {'resigned' if role == 'leader' else 'released it'}"
        if self.event == "expired":
            return f"{who}'s lease ran out unrenewed at {self.at:%H:%M:%S.%f}"[:-3] + " UTC"
        if self.event == "lost":
            return f"{who}'s expired lease is gone for good (taken over or dropped){token}"
        return f"{who} {'deposed' if role == 'leader' else 'broken'} by a forced release{token}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times in ISO 8601 UTC, holders as ``{owner, host, pid, label, ...}``."""
        return {
            "at": _iso(self.at),
            "event": self.event,
            "name": self.name,
            "kind": self.kind,
            "holder": holder_dict(self.holder),
            "previous": holder_dict(self.previous),
            "fencing_token": self.fencing_token,
            "text": self.describe(),
        }


@dataclass(frozen=True, slots=True)
class ViewUpdate:
    """The view after some changes: every lock now, which changed, and the events that changed them."""

    locks: Mapping[str, LockInfo]
    """Every lock document the view covers, by name (in no particular order), as of ``server_time``."""
    events: tuple[LockEvent, ...]
    changed: frozenset[str]
    """Names whose document or state changed (all of them in the first update)."""
    removed: frozenset[str]
    """Names whose document is gone."""
    server_time: datetime
    """The view's estimate of the server's clock when this was made."""
    mode: Literal["stream", "polling"]
    """``stream``: kept by a change stream; ``polling``: read every ``poll_interval`` seconds."""
    note: str | None = None
    """Why it polls, or that the stream is being reopened (None when all is well)."""
    first: bool = False
    """Whether this is the first update (the state when the view opened)."""
    disconnected_since: datetime | None = None
    """While MongoDB cannot be reached: the server time of the view's last word from it. The
    ``locks`` are then the last state known, stale (a lease shown held may have been renewed,
    released or expired since); None while the view is current."""


class LockWatch:
    """A live view of ``collection`` (the documents whose name starts with ``prefix``): enter it,
    then iterate over its [`ViewUpdate`][mongolock_async.live.ViewUpdate]s. The first update is the state as the view
    opened; each next one comes when a write or an expiry changed something. It stops when the
    ``async with`` block ends. One consumer per ``LockWatch``.

    Entering it opens the change stream (or finds that it must poll) and reads the documents;
    errors reaching MongoDB are raised there. Later failures of the stream reopen it with backoff
    (``note`` says so meanwhile) and read everything again, reporting what changed as events.

    :param poll_interval: seconds between reads where there is no change stream (default 2).
    :param max_await: longest wait of one of the stream's ``getMore``\\ s, in seconds (default 1):
        how long an idle view takes to stop.
    """

    def __init__(
        self,
        collection: AsyncCollectionLike,
        *,
        prefix: str = "",
        poll_interval: float = 2.0,
        max_await: float = 1.0,
    ) -> None:
        self._store: LockStore = store_for(validation.async_collection(collection), _MAJORITY)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self.prefix = prefix
        self.poll_interval = validation.seconds(poll_interval, "poll_interval", minimum=0.05)
        self._max_await_ms = max(1, int(validation.seconds(max_await, "max_await") * 1000))
        self.full_name: str = collection.full_name
        self.mode: Literal["stream", "polling"] = "stream"
        self.note: str | None = None
        self._states: dict[str, LockState | None] = {}
        self._reports: dict[str, LockReport] = {}
        self._infos: dict[str, LockInfo] = {}
        # Every lease's expiry, soonest first, as (expires at, name, owner token): the view's timer
        # and its expiry check look at the front only, however many locks there are. An entry whose
        # lease was renewed or ended since is dropped when it comes up.
        self._deadlines: list[tuple[datetime, str, str]] = []
        self._queued: set[tuple[str, str, datetime]] = set()
        self._reported: dict[str, set[tuple[str, datetime]]] = {}
        """Per name, the leases already told as expired (or already past when the view opened)."""
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._anchor: tuple[datetime, float] = (datetime.now(UTC), time.monotonic())
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._entered = False
        self._first: ViewUpdate | None = None
        self._polling_reason: str | None = None
        self._failed_read = False
        self._heard_at: datetime | None = None
        self.disconnected_since: datetime | None = None
        """See [`ViewUpdate.disconnected_since`][mongolock_async.live.ViewUpdate.disconnected_since]."""
        self.last_error: BaseException | None = None
        """The driver's error of the last failed read or stream, whole (it may name hosts and the
        topology: for the operator's log, not for viewers); None once the view is current again."""

    def server_now(self) -> datetime:
        """The view's estimate of the server's clock now."""
        anchor, then = self._anchor
        return anchor + timedelta(seconds=time.monotonic() - then)

    @property
    def locks(self) -> Mapping[str, LockInfo]:
        """Every lock the view covers now, by name (in no particular order: a view of 100,000 locks
        does not sort them for every update; sort, or pick, what you show)."""
        return MappingProxyType(dict(self._infos))

    async def __aenter__(self) -> LockWatch:
        if self._entered:
            raise RuntimeError("a LockWatch is entered once")
        self._entered = True
        stream = await self._open()
        now = self.server_now()
        self._sync(await self._read_all(), now, initial=True)
        self._heard_at = now
        self._first = self._update([], set(self._infos), set(), now, first=True)
        self._task = asyncio.get_running_loop().create_task(self._run(stream), name="mongolock-watch")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop: the stream is closed once its ``getMore`` in flight returns (within ``max_await``)."""
        self._closing = True
        self._queue.put_nowait(("stop", None))  # wakes an iteration waiting for news
        task, self._task = self._task, None
        if task is None:
            return
        # wait_within raises a cancellation of the caller after the wait, where a suppressed one
        # was lost: the dashboard's view, cancelled as it closed a watch, opened a new one.
        try:
            await wait_within(task, self._max_await_ms / 1000 + 2.0)
        finally:
            if not task.done():
                task.cancel()
                await wait_within(task, 2.0)
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            raise error

    def __aiter__(self) -> AsyncIterator[ViewUpdate]:
        return self._updates()

    async def _updates(self) -> AsyncIterator[ViewUpdate]:
        if self._first is None:
            raise RuntimeError("enter the LockWatch (async with) before iterating over it")
        yield self._first
        while not self._closing:
            deadline = self._next_expiry()
            # A millisecond past the expiry, so that the clock has passed it when the wait ends; an
            # expiry already past that the server has not confirmed yet waits for its next word.
            timeout = None if deadline is None else max(0.0, (deadline - self.server_now()).total_seconds() + 0.001)
            if timeout == 0.0 and (self._heard_at is None or deadline is None or deadline > self._heard_at):
                timeout = None
            items: list[tuple[str, Any]] = []
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns news that arrives as its
            # caller is cancelled and loses the cancellation (CPython gh-86296).
            with contextlib.suppress(TimeoutError):  # the next expiry is due
                async with asyncio.timeout(timeout):
                    items.append(await self._queue.get())
            while not self._queue.empty():  # a burst of writes makes one update
                items.append(self._queue.get_nowait())
            update = self._apply(items)
            if update is not None:
                yield update

    # -- the changes --------------------------------------------------------------------------

    def _apply(self, items: Sequence[tuple[str, Any]]) -> ViewUpdate | None:
        events: list[LockEvent] = []
        changed: set[str] = set()
        removed: set[str] = set()
        noted = False
        for kind, payload in items:
            if kind == "change":
                self._change(payload, events, changed, removed)
            elif kind == "sync":
                reports, moment = payload
                self._see_time(moment)
                self._heard_at = self.server_now()
                changed_before = set(self._infos)
                events.extend(self._sync(reports, self.server_now(), initial=False))
                removed |= changed_before - set(self._infos)
                changed |= set(self._infos)
            elif kind == "note":
                self.mode, self.note = payload
                noted = True
            elif kind == "heard":
                self._heard_at = max(self._heard_at or payload, payload)
            elif kind == "down":
                since, error = payload
                noted = noted or self.disconnected_since is None
                self.disconnected_since = self.disconnected_since or since
                self.last_error = error
            elif kind == "up":
                noted = noted or self.disconnected_since is not None
                self.disconnected_since = self.last_error = None
        now = self.server_now()
        events.extend(self._expire(now, changed))
        for name in changed - removed:
            self._refresh(name, now)
        if not (events or changed or removed or noted):
            return None
        events.sort(key=lambda event: event.at)
        return self._update(events, changed - removed, removed, now)

    def _change(self, change: Mapping[str, Any], events: list[LockEvent], changed: set[str], removed: set[str]) -> None:
        operation = change.get("operationType")
        if operation not in ("insert", "update", "replace", "delete"):
            return  # drop, rename, invalidate: the stream ends, and the view reads everything again
        key = (change.get("documentKey") or {}).get("_id")
        name = key if isinstance(key, str) else repr(key)
        wall = change.get("wallTime")
        if isinstance(wall, datetime):
            self._see_time(wall)
        at = _utc(wall) if isinstance(wall, datetime) else self.server_now()
        if operation == "delete":
            old = self._states.pop(name, None)
            self._reported.pop(name, None)
            if name in self._infos:
                del self._infos[name]
                self._reports.pop(name, None)
                removed.add(name)
                events.extend(derive_events(old, None, at))
            return
        document = change.get("fullDocument")
        if document is None:
            return  # deleted since this write: its delete event follows
        try:
            new: LockState | None = LockState.from_document(document)
        except LockDataError:
            new = None
        old = self._states.get(name)
        self._states[name] = new
        self._track(name, new)
        self._reports[name] = report_at(document, at)
        removed.discard(name)
        changed.add(name)
        events.extend(derive_events(old, new, at))

    def _sync(self, reports: Sequence[LockReport], now: datetime, *, initial: bool) -> list[LockEvent]:
        """Take a full read of the documents; the events are what changed since the view's state."""
        events: list[LockEvent] = []
        seen: set[str] = set()
        for report in reports:
            name = report.name if isinstance(report.name, str) else repr(report.name)
            seen.add(name)
            new = report.state
            if not initial:
                events.extend(derive_events(self._states.get(name), new, now))
            self._states[name] = new
            # Leases that ran out before the view opened are not news.
            self._track(name, new, past=now if initial else None)
            self._reports[name] = report
        for name in set(self._states) - seen:
            events.extend(derive_events(self._states.pop(name), None, now))
            self._reports.pop(name, None)
            self._infos.pop(name, None)
            self._reported.pop(name, None)
        for name in seen:
            self._refresh(name, now)
        return events

    def _track(self, name: str, state: LockState | None, *, past: datetime | None = None) -> None:
        """Queue the expiry of each lease ``state`` holds (those before ``past`` count as told)."""
        leases = {(token, expires_at) for token, expires_at, _, _ in _leases(state)}
        reported = self._reported.get(name, set()) & leases  # forget what no document holds any more
        if past is not None:
            reported |= {lease for lease in leases if lease[1] <= past}
        if reported:
            self._reported[name] = reported
        else:
            self._reported.pop(name, None)
        for token, expires_at in leases - reported:
            key = (name, token, expires_at)
            if key not in self._queued:
                self._queued.add(key)
                heapq.heappush(self._deadlines, (expires_at, name, token))

    def _lease(self, name: str, token: str, expires_at: datetime) -> tuple[LockState, Holder, int | None] | None:
        """The lease ``token`` of ``name`` if its document still holds it with that expiry."""
        state = self._states.get(name)
        for owner, expires, holder, fence in _leases(state):
            if owner == token and expires == expires_at and state is not None:
                return state, holder, fence
        return None

    def _refresh(self, name: str, now: datetime) -> None:
        state = self._states.get(name)
        report = report_at(state, now) if state is not None else self._reports.get(name)
        if report is not None:
            self._reports[name] = report
            self._infos[name] = lock_info(report)

    def _expire(self, now: datetime, changed: set[str]) -> list[LockEvent]:
        """The leases that reached their expiry unrenewed: by ``now``, and before the view last
        heard from the server (a renewal sent meanwhile would have been seen)."""
        events = []
        confirmed = min(now, self._heard_at) if self._heard_at is not None else now
        while self._deadlines and self._deadlines[0][0] <= confirmed:
            expires_at, name, token = heapq.heappop(self._deadlines)
            self._queued.discard((name, token, expires_at))
            lease = self._lease(name, token, expires_at)
            if lease is None:
                continue  # renewed, released or taken over since
            state, holder, fence = lease
            self._reported.setdefault(name, set()).add((token, expires_at))
            events.append(LockEvent(expires_at, "expired", name, state.kind, holder, None, fence))
            changed.add(name)
        return events

    def _next_expiry(self) -> datetime | None:
        while self._deadlines:
            expires_at, name, token = self._deadlines[0]
            if self._lease(name, token, expires_at) is not None:
                return expires_at
            heapq.heappop(self._deadlines)  # renewed or ended: not a deadline any more
            self._queued.discard((name, token, expires_at))
        return None

    def _update(
        self, events: list[LockEvent], changed: set[str], removed: set[str], now: datetime, *, first: bool = False
    ) -> ViewUpdate:
        return ViewUpdate(
            locks=self.locks,
            events=tuple(events),
            changed=frozenset(changed),
            removed=frozenset(removed),
            server_time=now,
            mode=self.mode,
            note=self.note,
            first=first,
            disconnected_since=self.disconnected_since,
        )

    def _see_time(self, moment: datetime) -> None:
        """Move the clock forward to a server time seen (never back: an event arrives after its write)."""
        moment = _utc(moment)
        if moment > self.server_now():
            self._anchor = (moment, time.monotonic())

    # -- the stream, or polling ---------------------------------------------------------------

    async def _open(self) -> Any:
        """Open the change stream and read the server's clock; None (and polling mode) where
        there is no change stream for this user."""
        stream = None
        try:
            stream = await self._store.watch_every_write(prefix=self.prefix, max_await_ms=self._max_await_ms)
        except PyMongoError as error:
            if change_streams_unsupported(error):
                self._poll_because(f"no change streams on this deployment (a standalone server): reading every "
                                   f"{self.poll_interval:g} s")  # fmt: skip
            elif change_streams_refused(error):
                self._poll_because(f"this user may not open a change stream (grant the changeStream action on "
                                   f"{self.full_name}): reading every {self.poll_interval:g} s")  # fmt: skip
            else:
                raise
        try:
            moment = await self._store.server_time()
        except BaseException:
            if stream is not None:
                await _close(stream)
            raise
        self._anchor = (moment, time.monotonic())
        return stream

    async def _read_all(self, *, clock_read: bool = True) -> list[LockReport]:
        """Every document the view covers, read a batch at a time (see ``LockStore.iterate_reports``),
        judged on the view's clock when ``clock_read`` (it was just read), else on the server's."""
        now = self.server_now() if clock_read else None
        return [report async for report in self._store.iterate_reports(prefix=self.prefix or None, now=now)]

    def _poll_because(self, why: str) -> None:
        self.mode, self.note = "polling", why
        self._polling_reason = why

    async def _run(self, stream: Any) -> None:
        reopen = Backoff(_REOPEN_BASE, _REOPEN_CAP)
        while not self._closing:
            if stream is None:
                await self._poll()
                continue
            try:
                while stream.alive and not self._closing:
                    change = await stream.try_next()
                    # Each answer (an event, or none within max_await) is the server's word that
                    # nothing else was written before it.
                    self._queue.put_nowait(("heard", self.server_now()))
                    if change is not None:
                        reopen.attempt = 0
                        self._queue.put_nowait(("change", change))
                failure = "the change stream ended (the collection was dropped or renamed)"
            except PyMongoError as error:
                lost: PyMongoError | None = error
                failure = f"lost MongoDB ({redacted_cause(error)})"
            else:
                lost = None
            finally:
                await _close(stream)
            stream = None
            while not self._closing:
                # The note and the loss in one step: the update that says "disconnected" says why.
                self._queue.put_nowait(("note", ("stream", f"{failure}; reopening the change stream")))
                if lost is not None:
                    self._lost(lost)
                await asyncio.sleep(reopen.next_delay())
                if self._closing:
                    return
                try:
                    stream = await self._open()
                    reports = await self._read_all()
                except PyMongoError as error:
                    if stream is not None:
                        await _close(stream)
                        stream = None
                    lost, failure = error, f"cannot reach MongoDB ({redacted_cause(error)})"
                    continue
                self._queue.put_nowait(("sync", (reports, self.server_now())))
                self._queue.put_nowait(("up", None))
                self._queue.put_nowait(("note", (self.mode, self.note if stream is None else None)))
                break

    async def _poll(self) -> None:
        await asyncio.sleep(self.poll_interval)
        if self._closing:
            return
        try:
            reports = await self._read_all(clock_read=False)
        except PyMongoError as error:
            failed = f"{self._polling_reason}; the last read failed ({redacted_cause(error)})"
            self._queue.put_nowait(("note", ("polling", failed)))
            self._lost(error)
            self._failed_read = True
            return
        moment = max((report.server_time for report in reports if report.server_time is not None), default=None)
        self._queue.put_nowait(("sync", (reports, moment or self.server_now())))
        if self._failed_read:
            self._failed_read = False
            self._queue.put_nowait(("up", None))
            self._queue.put_nowait(("note", ("polling", self._polling_reason)))

    def _lost(self, error: PyMongoError) -> None:
        """MongoDB could not be reached: the view is stale from its last word on."""
        self._queue.put_nowait(("down", (self._heard_at or self.server_now(), error)))


def derive_events(old: LockState | None, new: LockState | None, at: datetime) -> list[LockEvent]:
    """What happened to the leases of one name between two states of its document (None: no
    document), as of ``at`` on the server's clock. Expiry is not among them: nothing is written
    when a lease runs out (see [`LockWatch`][mongolock_async.live.LockWatch])."""
    state = new if new is not None else old
    if state is None:
        return []
    name, kind = state.name, state.kind
    forced = (
        new is not None
        and new.forced_release_at is not None
        and (old is None or new.forced_release_at != old.forced_release_at)
    )
    released = new is not None and new.released_at is not None and (old is None or new.released_at != old.released_at)
    before = {token: (expires, holder, fence) for token, expires, holder, fence in _leases(old)} if old else {}
    after = {token: (expires, holder, fence) for token, expires, holder, fence in _leases(new)} if new else {}
    events: list[LockEvent] = []
    ended = [token for token in before if token not in after]
    handed_from: Holder | None = None
    for token in ended:
        expires, holder, fence = before[token]
        if forced and expires > at:
            events.append(LockEvent(at, "forced", name, kind, holder, None, fence))
        elif expires > at or (released and old is not None and old.limit is None):
            # A live lease ended: released (a document deleted counts as that); a lock's lease
            # released in the write that saw it expire is its holder's own release, sent late.
            events.append(LockEvent(at, "released", name, kind, holder, None, fence))
            handed_from = handed_from or holder
        else:
            events.append(LockEvent(at, "lost", name, kind, holder, None, fence))
    for token in after:
        if token in before:
            continue
        _, holder, fence = after[token]
        acquired_at = holder.acquired_at
        if released and handed_from is not None and new is not None and acquired_at == new.released_at:
            events.append(LockEvent(at, "handed off", name, kind, holder, handed_from, fence))
        else:
            events.append(LockEvent(at, "acquired", name, kind, holder, None, fence))
    if any(event.event == "handed off" for event in events):
        # The release and the hand-off are one write: one event says both.
        handed = {id(event.previous) for event in events if event.event == "handed off"}
        events = [event for event in events if not (event.event == "released" and id(event.holder) in handed)]
    if (
        released
        and not before
        and not after
        and old is not None
        and new is not None
        and new.limit is None
        and new.fencing_token != old.fencing_token
        and new.holder
    ):
        # A lock taken and given up between two looks (the acquire's event was looked up after the
        # release, as under load): no lease in either state, but a new fencing token, and the
        # document still names its holder.
        holder = stored_holder(new, owner=None)
        events += [
            LockEvent(at, "acquired", name, kind, holder, None, new.fencing_token),
            LockEvent(at, "released", name, kind, holder, None, new.fencing_token),
        ]
    return events


def _leases(state: LockState | None) -> list[tuple[str, datetime, Holder, int | None]]:
    """Every lease a document records, live or not: (owner token, expiry, holder, fencing token)."""
    if state is None:
        return []
    if state.limit is not None:
        return [(permit.token, permit.expires_at, permit_holder(state, permit), permit.fencing_token)
                for permit in state.permits]  # fmt: skip
    if state.owner is None or state.expires_at is None:
        return []
    return [(state.owner, state.expires_at, stored_holder(state, owner=state.owner), state.fencing_token)]


def holder_dict(holder: Holder | None) -> dict[str, Any] | None:
    """A holder as JSON-ready values; its owner token cut to its first 8 characters (enough to tell
    holders apart on a screen, not a token to release with)."""
    if holder is None:
        return None
    return {
        "owner": None if holder.owner is None else holder.owner[:8],
        "host": holder.host,
        "pid": holder.pid,
        "label": holder.label,
        "text": holder.describe(),
        "role": holder.role,
        "fencing_token": holder.fencing_token,
        "acquired_at": _iso(holder.acquired_at),
        "expires_at": _iso(holder.expires_at),
        "ttl_ms": holder.ttl_ms,
    }


def lock_dict(info: LockInfo) -> dict[str, Any]:
    """A lock as the live views send it (JSON-ready)."""
    return {
        "name": info.name,
        "kind": info.kind,
        "status": info.status,
        "summary": info.summary,
        "held": info.held,
        "holders": [holder_dict(holder) for holder in info.holders],
        "last_holder": holder_dict(info.last_holder),
        "waiting": [
            {"text": waiter.describe(), "role": waiter.role, "expires_at": _iso(waiter.expires_at)}
            for waiter in info.waiting
        ],
        "fencing_token": info.fencing_token,
        "limit": info.limit,
        "ttl_ms": info.ttl_ms,
        "released_at": _iso(info.released_at),
        "error": None if info.error is None else str(info.error),
    }


async def _close(stream: Any) -> None:
    with contextlib.suppress(PyMongoError):
        await asyncio.shield(stream.close())


def _who(holder: Holder | None) -> str:
    return "nobody" if holder is None else holder.describe()


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else _utc(moment).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
