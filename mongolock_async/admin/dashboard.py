"""The implementation of ``mongolock_async.dashboard`` (its public path; the user guide is there)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any

from pymongo.errors import PyMongoError

from .._util import validation
from .._util.backoff import Backoff
from .._util.collection_types import AsyncCollectionLike
from .._util.diagnosis import redacted_cause
from .._util.inert import json_text, printable
from .._util.shield import wait_for_event
from .dashboard_guard import LOOPBACK_HOSTS, host_allowed, host_names, release_token, token_matches
from .dashboard_window import NameIndex, Window, WindowSpec
from .live import LockEvent, LockWatch, ViewUpdate, lock_dict
from .operations import LockInfo, force_release, inspect_lock

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["Dashboard"]

logger = logging.getLogger("mongolock_async.audit")
operations_log = logging.getLogger("mongolock_async.dashboard")
"""Where the dashboard says what went wrong with its view, whole (driver errors name hosts)."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

EVENTS_KEPT = 200
"""Events a page gets when it opens (the latest)."""
KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream, so that proxies keep it open and a page that
went away is noticed."""
LINGER = 10.0
"""Seconds the shared view stays open after the last page closed (a reload does not reopen it)."""
_MAX_BODY = 16_384
_SUBSCRIBER_BACKLOG = 256
_TOKEN_HEADER = "x-mongolock-token"
# Every answer but the page (which has its own) says what it is and must not be sniffed as
# anything else: a browser never reads JSON or an event stream of ours as a script or a page.
_ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_EVENT_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    **_ANSWER_HEADERS,
    "X-Accel-Buffering": "no",  # nginx: pass each event on at once
}


@dataclass(slots=True)
class _Segment:
    owner: str
    who: str
    role: str
    fence: int | None
    start: datetime
    end: datetime | None = None
    how: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner[:8],
            "who": self.who,
            "role": self.role,
            "fence": self.fence,
            "start": _iso(self.start),
            "end": None if self.end is None else _iso(self.end),
            "how": self.how,
        }


@dataclass(slots=True)
class _LockHistory:
    segments: list[_Segment] = field(default_factory=list)
    waits: list[tuple[datetime, int]] = field(default_factory=list)


class Timeline:
    """Who held each lock when over the last ``window`` seconds: a segment per lease (from its
    acquisition or hand-off to its release, hand-off, expiry, loss or break) and the number of
    places waiting, each time it changed. Built from a view's updates; what the page draws."""

    def __init__(self, window: float) -> None:
        self.window = timedelta(seconds=window)
        self._locks: dict[str, _LockHistory] = {}
        self._forgotten_at: datetime | None = None

    def add(self, update: ViewUpdate) -> None:
        """Take an update's events and states into the history."""
        for event in update.events:
            history = self._locks.setdefault(event.name, _LockHistory())
            if event.event in ("released", "expired", "lost", "forced") and event.holder is not None:
                self._close(history, event.holder.owner, event.at, event.event)
            if event.event == "handed off" and event.previous is not None:
                self._close(history, event.previous.owner, event.at, "handed off")
            if event.event in ("acquired", "handed off") and event.holder is not None:
                self._open(history, event.holder.owner, event, event.at)
        for name in update.removed:
            gone = self._locks.get(name)
            if gone is not None:
                for segment in gone.segments:
                    if segment.end is None:
                        segment.end, segment.how = update.server_time, "released"
        for name in update.changed:
            self._reconcile(name, update.locks[name], update.server_time)
        # At most once a second: with 100,000 locks, a pass over every history per update would
        # cost more than the update.
        if self._forgotten_at is None or update.server_time - self._forgotten_at >= timedelta(seconds=1):
            self._forgotten_at = update.server_time
            self._forget(update.server_time - self.window)

    def of(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The history of ``names`` as JSON-ready values (times in ISO 8601 UTC)."""
        histories = {}
        for name in names:
            history = self._locks.get(name)
            if history is not None:
                histories[name] = {
                    "segments": [segment.as_dict() for segment in history.segments],
                    "waits": [[_iso(moment), count] for moment, count in history.waits],
                }
        return histories

    def names(self) -> list[str]:
        return list(self._locks)

    def _reconcile(self, name: str, info: LockInfo, now: datetime) -> None:
        """Make the open segments the live holders (an update without events: the first one, a
        read after the stream was reopened), and record the waiting count if it changed."""
        history = self._locks.setdefault(name, _LockHistory())
        live = {holder.owner: holder for holder in info.holders if holder.owner is not None}
        for segment in history.segments:
            if segment.end is None and segment.owner not in live:
                segment.end, segment.how = now, segment.how or "released"
            elif segment.end is not None and segment.how == "expired" and segment.owner in live:
                # Seen live again (a renewal the view could not see while it was cut off from
                # MongoDB): the lease never ended, and its bar goes on.
                segment.end, segment.how = None, None
        open_owners = {segment.owner for segment in history.segments if segment.end is None}
        for owner, holder in live.items():
            if owner not in open_owners:
                start = holder.acquired_at or now
                history.segments.append(
                    _Segment(owner, holder.describe(), holder.role, holder.fencing_token, max(start, now - self.window))
                )
        waiting = len(info.waiting)
        if not history.waits or history.waits[-1][1] != waiting:
            history.waits.append((now, waiting))

    def _open(self, history: _LockHistory, owner: str | None, event: LockEvent, at: datetime) -> None:
        if owner is None or event.holder is None:
            return
        if any(segment.owner == owner and segment.end is None for segment in history.segments):
            return
        holder = event.holder
        history.segments.append(_Segment(owner, holder.describe(), holder.role, event.fencing_token, at))

    @staticmethod
    def _close(history: _LockHistory, owner: str | None, at: datetime, how: str) -> None:
        for segment in history.segments:
            if segment.owner == owner and segment.end is None:
                segment.end, segment.how = max(at, segment.start), how

    def _forget(self, before: datetime) -> None:
        for name in list(self._locks):
            history = self._locks[name]
            history.segments = [s for s in history.segments if s.end is None or s.end >= before]
            # The count in force at the window's start stays, as the first point.
            kept = [point for point in history.waits if point[0] >= before]
            earlier = [point for point in history.waits if point[0] < before]
            history.waits = ([(before, earlier[-1][1])] if earlier else []) + kept
            if not history.segments and all(count == 0 for _, count in history.waits):
                del self._locks[name]


@dataclass(slots=True, eq=False)
class _Page:
    """One open page: its queue of messages and the window of locks it shows."""

    queue: asyncio.Queue[bytes | None]
    spec: WindowSpec
    window: Window | None = None


class _Feed:
    """One ``LockWatch`` for every open page: the state, the last events, the timeline, the names
    in order, and per page its window and a queue of messages: each page gets its window and the
    window's changes, not the collection."""

    def __init__(self, dashboard: Dashboard) -> None:
        self._dashboard = dashboard
        self._pages: dict[asyncio.Queue[bytes | None], _Page] = {}
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None
        self.update: ViewUpdate | None = None
        self.events: deque[LockEvent] = deque(maxlen=EVENTS_KEPT)
        self.timeline = Timeline(dashboard.window)
        self.names = NameIndex()
        self.error: str | None = None
        self.watch: LockWatch | None = None
        self._ready = asyncio.Event()

    def subscribe(self, spec: WindowSpec | None = None) -> asyncio.Queue[bytes | None]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_SUBSCRIBER_BACKLOG)
        page = self._pages[queue] = _Page(queue, spec or WindowSpec())
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mongolock-dashboard-feed")
        elif self._ready.is_set():
            queue.put_nowait(_message(self._snapshot_of(page)))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[bytes | None]) -> None:
        self._pages.pop(queue, None)
        if not self._pages and self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._linger = None
        if not self._pages and self._task is not None:
            self._task.cancel()  # leaving its LockWatch closes the stream between two getMores
            self._task = None
            self.update = None

    async def close(self) -> None:
        for queue in list(self._pages):
            _offer(queue, None)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def close_pages(self) -> None:
        """End every page's event stream (a server that shuts down waits for them)."""
        for queue in list(self._pages):
            _offer(queue, None)

    async def _run(self) -> None:
        backoff = Backoff(0.5, 30.0)
        while True:
            try:
                async with LockWatch(
                    self._dashboard.collection,
                    prefix=self._dashboard.prefix,
                    poll_interval=self._dashboard.poll_interval,
                ) as watch:
                    self.watch, self.error = watch, None
                    backoff.attempt = 0
                    async for update in watch:
                        self._take(update)
            except Exception as error:  # whatever it is, the pages are told and the view starts again
                # The viewers get the cause without hosts or topology; the operator's log gets it whole.
                unexpected = not isinstance(error, PyMongoError)
                operations_log.warning("the dashboard's view of %s failed: %s", self._dashboard.full_name,
                                       printable(repr(error)), exc_info=unexpected)  # fmt: skip
                self.error = f"cannot read the locks: {redacted_cause(error)}"
                self._ready.set()
                for page in list(self._pages.values()):
                    self._send(page, _message({"type": "error", "text": self.error}))
                if not self._pages:
                    return
                await asyncio.sleep(backoff.next_delay() + 0.5)
            finally:
                self.watch = None

    def _take(self, update: ViewUpdate) -> None:
        watch = self.watch
        if update.disconnected_since is not None and (self.update is None or self.update.disconnected_since is None):
            error = watch.last_error if watch is not None else None
            operations_log.warning("the dashboard lost MongoDB (%s): %s", self._dashboard.full_name,
                                   printable(repr(error)))  # fmt: skip
        self.events.extend(update.events)
        self.timeline.add(update)
        before, first = self.update, update.first or self.update is None
        self.update = update
        if first:
            self.names.reset(update.locks)
            self._ready.set()
            for page in list(self._pages.values()):
                self._send(page, _message(self._snapshot_of(page)))
            return
        for name in update.removed:
            self.names.remove(name)
        for name in update.changed:
            self.names.add(name)
        if before is None:  # an update after the first has one before it
            raise RuntimeError("a dashboard update with no update before it")
        told = before.mode != update.mode or before.note != update.note or (
            before.disconnected_since != update.disconnected_since)  # fmt: skip
        for page in list(self._pages.values()):
            message = self._update_of(page, update, before.locks, told=told)
            if message is not None:
                self._send(page, _message(message))

    def _update_of(
        self, page: _Page, update: ViewUpdate, before: Mapping[str, LockInfo], *, told: bool
    ) -> dict[str, Any] | None:
        """What ``page`` needs of ``update``: the locks of its window that changed or came into it,
        its window's names if they changed, its events; None if nothing concerns it."""
        spec, window = page.spec, page.window
        touched = [
            name
            for name in update.changed | update.removed
            if spec.matches(name, before.get(name)) or spec.matches(name, update.locks.get(name))
        ]
        events = [event for event in update.events if spec.covers(event.name)]
        if not (touched or events or told) or window is None:
            return None
        if touched:
            matching = window.matching + sum(
                spec.matches(name, update.locks.get(name)) - spec.matches(name, before.get(name)) for name in touched
            )
            page.window = self.names.window(spec, update.locks, matching)
        new = page.window
        if new is None:  # a page with a window keeps one
            raise RuntimeError("a dashboard page lost its window")
        sent = [name for name in new.names if name in update.changed or name not in window.names]
        if not (sent or events or told) and new == window:
            return None  # a change out of view that moved nothing in it: the page is told nothing
        return {
            "type": "update",
            "server_time": _iso(update.server_time),
            "mode": update.mode,
            "note": update.note,
            "disconnected_since": _iso_or_none(update.disconnected_since),
            **self._window_fields(new, changed_names=new.names != window.names),
            "locks": [lock_dict(update.locks[name]) for name in sent],
            "events": [event.as_dict() for event in events],
            "timeline": self.timeline.of(sent),
        }

    def _window_fields(self, window: Window, *, changed_names: bool = True) -> dict[str, Any]:
        return {
            **({"names": list(window.names)} if changed_names else {}),
            "more_before": window.more_before,
            "more_after": window.more_after,
            "matching": window.matching,
            "total": len(self.names),
        }

    def snapshot(self, spec: WindowSpec | None = None) -> dict[str, Any]:
        """What a page (or ``/state.json``) gets first: the window ``spec`` asks for (the first
        hundred names by default), the last events of its names, and its timeline."""
        return self._snapshot_of(_Page(asyncio.Queue(), spec or WindowSpec()))

    def _snapshot_of(self, page: _Page) -> dict[str, Any]:
        update = self.update
        if update is None:
            return {"type": "error", "text": self.error or "starting"}
        watch = self.watch
        now = watch.server_now() if watch is not None else update.server_time
        page.window = window = self.names.window(page.spec, update.locks)
        return {
            "type": "snapshot",
            "title": self._dashboard.title,
            "collection": self._dashboard.full_name,
            "prefix": self._dashboard.prefix,
            "allow_release": self._dashboard.allow_release,
            "server_time": _iso(now),
            "window_s": self._dashboard.window,
            "mode": update.mode,
            "note": update.note,
            "disconnected_since": _iso_or_none(update.disconnected_since),
            "poll_interval_s": self._dashboard.poll_interval,
            "window": page.spec.as_dict(),
            **self._window_fields(window),
            "locks": [lock_dict(update.locks[name]) for name in window.names],
            "events": [event.as_dict() for event in self.events if page.spec.covers(event.name)],
            "timeline": self.timeline.of(window.names),
        }

    def _send(self, page: _Page, message: bytes) -> None:
        if not _offer(page.queue, message):
            # A page that reads nothing is dropped (it reconnects and gets a snapshot).
            self._pages.pop(page.queue, None)
            with contextlib.suppress(asyncio.QueueFull):
                page.queue.get_nowait()
            _offer(page.queue, None)


class Dashboard:
    """The dashboard of ``collection`` (the locks whose name starts with ``prefix``), as an ASGI
    application; ``aiohttp_app`` gives an aiohttp one.

    :param allow_release: show a button that breaks a lease (default False: read-only). Releases
        need a token from the page, the page's own origin, and the lock's name typed again; each is
        logged at WARNING on ``mongolock_async.audit``.
    :param title: shown in the page's heading (as text).
    :param window: seconds of history the timeline keeps (default 600).
    :param poll_interval: seconds between reads where there is no change stream (default 2).
    :param allowed_hosts: the host names (or addresses) it is served under, as a request's
        ``Host`` header names them; any other is refused with 403 before anything else is done
        (DNS rebinding: see ``_dashboard_guard``). Default: loopback names only (``localhost``,
        ``127.0.0.1`` and IPv6's loopback address). Add the name a proxy or the application serves it under;
        ``["*"]`` answers every host, for an application that checks ``Host`` itself.
    :param release_secret: a secret (at least 16 characters) the page's release token is derived
        from, so that the token outlives a restart and is the same in every worker process that
        serves the dashboard; default: a random token per ``Dashboard`` (releases from a page
        loaded before a restart, or from another worker, are refused).

    Every argument is checked here, before any I/O. The view starts with the first page that
    opens, and stops ten seconds after the last one closed; ``aclose`` stops it at once.
    """

    def __init__(
        self,
        collection: AsyncCollectionLike,
        *,
        prefix: str = "",
        allow_release: bool = False,
        title: str = "locks",
        window: float = 600.0,
        poll_interval: float = 2.0,
        allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
        release_secret: str | None = None,
    ) -> None:
        self.collection = validation.async_collection(collection)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if not isinstance(title, str):
            raise TypeError(f"title must be a str, not {type(title).__name__}")
        self.prefix = prefix
        self.allow_release = validation.flag(allow_release, "allow_release")
        self.title = title
        self.window = validation.seconds(window, "window", minimum=10.0)
        self.poll_interval = validation.seconds(poll_interval, "poll_interval", minimum=0.05)
        self.full_name: str = collection.full_name
        self.allowed_hosts = host_names(allowed_hosts)
        # Proves a release request came from this dashboard's page: a page of another origin
        # cannot read it, and a request carrying it in a header is not a "simple" cross-origin
        # request, so a browser asks first (a preflight this app never allows).
        self._token = release_token(release_secret, self.full_name)
        self._feeds: dict[asyncio.AbstractEventLoop, _Feed] = {}

    @property
    def _feed(self) -> _Feed:
        loop = asyncio.get_running_loop()
        feed = self._feeds.get(loop)
        if feed is None:
            feed = self._feeds[loop] = _Feed(self)
        return feed

    async def aclose(self) -> None:
        """End every page's event stream and stop the view."""
        with contextlib.suppress(RuntimeError):
            await self._feed.close()

    def close_pages(self) -> None:
        """End every page's event stream now (the pages reconnect on their own): what a server
        that is shutting down needs, as it waits for open responses."""
        for feed in self._feeds.values():
            feed.close_pages()

    # -- what both frameworks serve ---------------------------------------------------------------

    def page(self) -> tuple[bytes, list[tuple[str, str]]]:
        """The page (with a fresh nonce for its script and style) and its headers."""
        nonce = secrets.token_urlsafe(16)
        text = resources.files("mongolock_async.admin").joinpath("dashboard.html").read_text(encoding="utf-8")
        token = f'<meta name="mongolock-token" content="{self._token}">' if self.allow_release else ""
        body = (
            text.replace("{{NONCE}}", nonce)
            .replace("{{TITLE}}", html.escape(printable(self.title)))
            .replace("{{COLLECTION}}", html.escape(printable(self.full_name)))
            .replace("{{TOKEN_META}}", token)
        )
        policy = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
        headers = [
            ("content-type", "text/html; charset=utf-8"),
            ("content-security-policy", policy),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
        ]
        return body.encode("utf-8"), headers

    def state(self, window: WindowSpec | None = None) -> dict[str, Any]:
        """What a page gets first (JSON-ready): the ``window`` of locks it asks for (default the first
        100 names), with ``names`` in order, ``matching`` and ``total`` counts, whether more lie
        ``more_before`` and ``more_after``; the last events of those names, and their timeline."""
        return self._feed.snapshot(window)

    async def events(self, window: WindowSpec | None = None) -> AsyncGenerator[bytes, None]:
        """The page's event stream: a snapshot of its ``window``, then an update whenever something
        in it changed (its locks that changed or came into it, its names when they changed, its
        events), and a comment every ``KEEPALIVE`` seconds when idle. Ends when the dashboard is
        closed."""
        feed = self._feed
        queue = feed.subscribe(window)
        try:
            yield b"retry: 2000\n\n"
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE):  # not wait_for: see LockWatch's iteration
                        message = await queue.get()
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if message is None:
                    return
                yield message
        finally:
            feed.unsubscribe(queue)

    async def release(self, headers: Mapping[str, str], body: bytes, client: str) -> tuple[int, dict[str, Any]]:
        """Answer a release request: (HTTP status, JSON body). ``headers`` by lowercase name."""
        who = f"dashboard client {client} (user agent {headers.get('user-agent', '-')[:200]!r})"
        if not self.allow_release:
            logger.warning("refused a forced release from %s: releases are disabled on this dashboard", who)
            return 403, {"error": "releases are disabled on this dashboard (allow_release=False)"}
        if not token_matches(headers.get(_TOKEN_HEADER, ""), self._token):
            logger.warning("refused a forced release from %s: no valid token from the page", who)
            return 403, {"error": "no valid token: send the request from the dashboard's page"}
        origin, host = headers.get("origin"), headers.get("host")
        if origin is not None and host is not None and origin.split("://", 1)[-1] != host:
            logger.warning("refused a forced release from %s: origin %r is not this page's", who, origin)
            return 403, {"error": "the request comes from another origin"}
        if headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return 415, {"error": 'send JSON: {"name": ..., "confirm": ..., "leases": [{"owner", "fencing_token"}]}'}
        try:
            request = json.loads(body)
            name, confirm, leases = request["name"], request["confirm"], _requested_leases(request["leases"])
            validation.lock_name(name)
        except (ValueError, KeyError, TypeError) as error:
            return 400, {"error": f"a bad request: {error}"}
        if confirm not in (name, printable(name)):
            return 400, {"error": "confirm by typing the lock's name exactly (as the page shows it)"}
        if self.prefix and not name.startswith(self.prefix):
            return 404, {"error": f"this dashboard shows only names starting with {self.prefix!r}"}
        try:
            return await self._break_leases(name, leases, who)
        except LookupError as error:
            return 404, {"error": str(error)}
        except PyMongoError as error:
            logger.warning("a forced release of %r from %s failed: %s", name, who, printable(repr(error)))
            return 502, {"error": f"MongoDB refused or failed: {redacted_cause(error)}"}

    async def _break_leases(
        self, name: str, leases: list[tuple[str, int]], who: str
    ) -> tuple[int, dict[str, Any]]:
        """Break each lease the page showed (owner token's start, fencing token), each only if it
        is still that lease: the fencing token names one acquisition of ``name``, and the write
        matches the whole owner token it has now."""
        info = await inspect_lock(self.collection, name)
        if info is None:
            raise LookupError(f"no lock named {name!r}")
        broken: list[dict[str, Any]] = []
        ended: list[dict[str, Any]] = []
        for owner_start, fence in leases:
            live = next(
                (holder for holder in info.holders
                 if holder.fencing_token == fence and (holder.owner or "").startswith(owner_start)),
                None,
            )  # fmt: skip
            result = None
            if live is not None and live.owner is not None:
                with contextlib.suppress(LookupError):  # it ended since the read above
                    result = await force_release(self.collection, name, holder=live.owner, by=who)
            if result is None:
                ended.append({"owner": owner_start, "fencing_token": fence})
                continue
            for owner, holder, token in result.permits or ((result.owner or "", result.holder, result.fencing_token),):
                broken.append({"owner": owner[:8], "holder": dict(holder), "fencing_token": token})
        answer = {"name": name, "released": bool(broken), "broken": broken, "ended": ended}
        if not broken:
            logger.warning("a forced release of %r from %s broke nothing: the leases shown had ended", name, who)
            return 409, {**answer, "error": "the lease shown had ended or changed hands: nothing was broken"}
        return 200, answer

    # -- ASGI ---------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: not served
        host = next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == b"host"), None)
        if not host_allowed(host, self.allowed_hosts):
            refusal = self._refuse_host(host, _client(scope))
            await _respond(send, 403, refusal, [("content-type", "text/plain"), *_ANSWER_HEADERS.items()])
            return
        path, method = _route_path(scope), scope.get("method", "GET")
        if path == "":
            await _respond(send, 307, b"", [("location", scope.get("root_path", "") + "/")])
        elif path == "/" and method in ("GET", "HEAD"):
            body, headers = self.page()
            await _respond(send, 200, b"" if method == "HEAD" else body, headers)
        elif path in ("/events", "/state.json") and method == "GET":
            try:
                window = WindowSpec.from_query(bytes(scope.get("query_string", b"")).decode("latin-1"))
            except ValueError as error:
                await _respond_json(send, 400, {"error": f"a bad window: {error}"})
                return
            if path == "/events":
                await self._stream(receive, send, window)
            else:
                await self._ensure_started()
                await _respond_json(send, 200, self.state(window))
        elif path == "/release" and method == "POST":
            request = await _read_body(receive)
            if request is None:
                await _respond_json(send, 413, {"error": "too large"})
                return
            fields = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
            status, answer = await self.release(fields, request, _client(scope))
            await _respond_json(send, status, answer)
        elif path in ("/", "/events", "/state.json", "/release"):
            await _respond(send, 405, b"method not allowed", [("content-type", "text/plain"), *_ANSWER_HEADERS.items()])
        else:
            await _respond(send, 404, b"not found", [("content-type", "text/plain"), *_ANSWER_HEADERS.items()])

    def _refuse_host(self, host: str | None, client: str) -> bytes:
        """Log a request for a host this dashboard does not serve; the body of its 403."""
        logger.warning("refused a request from %s for host %s: not in allowed_hosts", client, printable(repr(host)))
        return b"this dashboard does not answer for that host name (see allowed_hosts, --allow-host)"

    async def _ensure_started(self) -> None:
        """For a read without a page open: start the view, wait for its first state (at most 10 s)."""
        feed = self._feed
        queue = feed.subscribe()
        try:
            await wait_for_event(feed._ready, 10.0)
        finally:
            feed.unsubscribe(queue)

    async def _stream(self, receive: Receive, send: Send, window: WindowSpec) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(key.lower().encode("latin-1"), value.encode("latin-1"))
                            for key, value in _EVENT_HEADERS.items()],
            }
        )
        disconnected = asyncio.ensure_future(_disconnect(receive))
        events = self.events(window)
        try:
            while True:
                following = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({following, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                if following not in done:
                    following.cancel()  # the generator must be left before it can be closed
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await following
                    return
                try:
                    chunk = following.result()
                except StopAsyncIteration:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the page went away mid-write
        finally:
            disconnected.cancel()
            await events.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- aiohttp ------------------------------------------------------------------------------------

    def aiohttp_app(self) -> web.Application:
        """An aiohttp application of this dashboard, to add as a sub-application:
        ``app.add_subapp("/locks/", dashboard.aiohttp_app())`` (the page at ``/locks/``)."""
        try:
            from aiohttp import web
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                "Dashboard.aiohttp_app needs aiohttp: install the aiohttp extra (from a checkout: "
                "pip install '.[aiohttp]')"
            ) from error

        def json_response(payload: Mapping[str, Any], status: int = 200) -> web.Response:
            return web.Response(
                text=json_text(payload), status=status, content_type="application/json", headers=_ANSWER_HEADERS
            )

        @web.middleware
        async def hosts(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
            host = request.headers.get("Host")
            if not host_allowed(host, self.allowed_hosts):
                refusal = self._refuse_host(host, request.remote or "?")
                return web.Response(body=refusal, status=403, content_type="text/plain", headers=_ANSWER_HEADERS)
            return await handler(request)

        async def page(request: web.Request) -> web.Response:
            body, headers = self.page()
            return web.Response(body=body, headers=dict(headers))

        async def events(request: web.Request) -> web.StreamResponse:
            try:
                window = WindowSpec.from_query(request.query_string)
            except ValueError as error:
                return json_response({"error": f"a bad window: {error}"}, status=400)
            response = web.StreamResponse(headers=_EVENT_HEADERS)
            await response.prepare(request)
            stream = self.events(window)
            try:
                async for chunk in stream:
                    await response.write(chunk)
            except (ConnectionResetError, OSError):
                pass  # the page went away
            finally:
                await stream.aclose()
            return response

        async def state(request: web.Request) -> web.StreamResponse:
            try:
                window = WindowSpec.from_query(request.query_string)
            except ValueError as error:
                return json_response({"error": f"a bad window: {error}"}, status=400)
            await self._ensure_started()
            return json_response(self.state(window))

        async def release(request: web.Request) -> web.Response:
            body = await request.content.read(_MAX_BODY + 1)
            if len(body) > _MAX_BODY:
                return json_response({"error": "too large"}, status=413)
            headers = {key.lower(): value for key, value in request.headers.items()}
            client = f"{request.remote or '?'}"
            status, answer = await self.release(headers, body, client)
            return json_response(answer, status=status)

        async def stop(app: web.Application) -> None:
            self.close_pages()

        async def cleanup(app: web.Application) -> None:
            await self.aclose()

        app = web.Application(middlewares=[hosts])
        app.router.add_get("/", page)
        app.router.add_get("/events", events)
        app.router.add_get("/state.json", state)
        app.router.add_post("/release", release)
        app.on_shutdown.append(stop)
        app.on_cleanup.append(cleanup)
        return app


def _requested_leases(value: object) -> list[tuple[str, int]]:
    """The leases a release request names: a list of ``{"owner": <its token's first 8 characters
    or more>, "fencing_token": <int>}`` (what the page shows of each holder)."""
    if not isinstance(value, list) or not value:
        raise TypeError("leases must be a non-empty list of {owner, fencing_token}")
    leases = []
    for entry in value:
        owner = entry.get("owner") if isinstance(entry, dict) else None
        fence = entry.get("fencing_token") if isinstance(entry, dict) else None
        if not isinstance(owner, str) or len(owner) < 8 or isinstance(fence, bool) or not isinstance(fence, int):
            raise TypeError("each lease is {owner: the first 8 characters of its owner token, fencing_token: int}")
        leases.append((owner, fence))
    return leases


def _route_path(scope: Scope) -> str:
    """The path below where the app is mounted (Starlette's ``Mount`` keeps the full path and sets
    ``root_path``; a server with a root path of its own may strip it already)."""
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(key.encode("latin-1"), value.encode("latin-1")) for key, value in headers]
            + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _respond_json(send: Send, status: int, payload: Mapping[str, Any]) -> None:
    body = json_text(payload).encode("utf-8")
    await _respond(send, status, body, [("content-type", "application/json"), *_ANSWER_HEADERS.items()])


async def _read_body(receive: Receive) -> bytes | None:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += bytes(message.get("body", b""))
        if len(body) > _MAX_BODY:
            return None
        if not message.get("more_body"):
            return body


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _client(scope: Scope) -> str:
    client = scope.get("client")
    address = f"{client[0]}:{client[1]}" if client else "?"
    user = scope.get("user")
    name = getattr(user, "display_name", None) if user is not None else None
    return f"{address} user {name}" if name else address


def _message(payload: Mapping[str, Any]) -> bytes:
    # JSON escapes newlines (json_text also U+2028, U+2029), so one data line carries the whole message.
    return b"data: " + json_text(payload).encode("utf-8") + b"\n\n"


def _offer(queue: asyncio.Queue[bytes | None], message: bytes | None) -> bool:
    try:
        queue.put_nowait(message)
    except asyncio.QueueFull:
        return False
    return True


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else _iso(moment)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
