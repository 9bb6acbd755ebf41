"""Wake waiting heads when another process releases a lock or hands it to them: change streams.

One change stream per client, collection and event loop, opened only when a blocking acquire has
to wait, and started at that failed attempt's ``operationTime``, so that a release between the
attempt and the stream's start is still reported. It stays open ``LINGER`` seconds after the
last waiter leaves, so a steady trickle of contention does not open and kill a stream per
acquisition, and it is closed between two ``getMore``s (each waits at most ``maxAwaitTimeMS``), so
no pooled connection is torn down mid-request.

Any failure (the collection dropped or renamed, the stream ending, a timeout, resumable errors the
driver could not resume, non-resumable errors, no replica set) closes it; it is reopened with
backoff while anyone waits, and waiters rely on their own backoff meanwhile. Every time it opens,
all heads are woken to try again, so nothing missed before it opened (while it was down, or
before a start position a server set too late) goes unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
import time
from typing import Any

from pymongo.errors import InvalidOperation, PyMongoError

from .._util.backoff import Backoff
from .._util.collection_types import AsyncClient
from .._util.diagnosis import retrying_cannot_fix
from .._util.weak import PerLoop, WeakIdentityMap
from ..store import LockStore
from ..store.documents import PERMIT_KINDS
from .queues import LocalQueue, queues_on

logger = logging.getLogger("mongolock_async")

LINGER = 10.0
"""Seconds a stream stays open after the last waiter of its collection left."""
_MAX_AWAIT_MS = 1000
_REOPEN_BASE, _REOPEN_CAP = 0.5, 30.0
_UNAUTHORIZED = 13


class ReleaseWatcher:
    """The change stream of one collection for the waiters of one event loop."""

    def __init__(self, client_id: int, full_name: str) -> None:
        self.token_prefix = secrets.token_hex(8)
        """Starts the owner tokens of this loop's places on the collection; the stream lets
        through only hand-offs to tokens with it."""
        self._client_id = client_id
        self._full_name = full_name
        self._task: asyncio.Task[None] | None = None
        self._start_at: Any = None
        self._failing_until = 0.0
        self._reopen = Backoff(_REOPEN_BASE, _REOPEN_CAP)
        self._refusal_reported = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def streaming(self) -> bool:
        """Whether releases and hand-offs are (being) reported: heads need not poll."""
        return self.running and time.monotonic() >= self._failing_until

    def covers_new_requests(self) -> bool:
        """Whether a release after a request sent now will be reported."""
        return self.streaming

    def cover_from(self, store: LockStore, operation_time: Any) -> bool:
        """Make sure releases from ``operation_time`` on are reported; False if they may not be.

        Starts the stream at ``operation_time`` if it is not running. False means it runs from a
        later position, and the caller must look at the lock again itself.
        """
        if self.running:
            if self._start_at is None or operation_time is None:
                return True
            return bool(self._start_at <= operation_time)
        if time.monotonic() < self._failing_until:
            return True  # no stream for now: waiters poll
        self._start_at = operation_time
        self._task = asyncio.get_running_loop().create_task(
            self._run(store), name="mongolock-release-watcher", context=contextvars.Context()
        )
        return True

    async def _run(self, store: LockStore) -> None:
        start_at, idle_since = self._start_at, None
        max_await_ms = _max_await_ms(store.client)
        try:
            while True:
                stream = None
                try:
                    stream = await store.watch(
                        token_prefix=self.token_prefix, max_await_ms=max_await_ms, start_at=start_at
                    )
                    self._failing_until = 0.0
                    # Every head looks again once the stream is open: opened at "now", it missed
                    # what came before. Opened at an attempt's operationTime, it may have too:
                    # mongod answers a write with that write's own optime (computeOperationTime in
                    # src/mongo/db/service_entry_point_common.cpp), but a server that answers with
                    # its latest cluster time (the embedded test server does) starts the stream
                    # past writes that followed ours, such as the hand-off to our place.
                    self._wake_all()
                    start_at = self._start_at = None
                    while stream.alive:
                        change = await stream.try_next()
                        if change is not None:
                            self._reopen.attempt = 0
                            self._dispatch(change)
                        if self._has_waiters():
                            idle_since = None
                        elif idle_since is None:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since >= LINGER:
                            return
                    logger.debug("change stream on %s ended (invalidated); reopening", self._full_name)
                except InvalidOperation:
                    return  # the client was closed
                except PyMongoError as error:
                    delay = self._reopen.next_delay() + _REOPEN_BASE
                    self._failing_until = time.monotonic() + delay
                    # Once per watcher at WARNING what retrying cannot fix (a role without the
                    # changeStream action): every wait then costs polling, which an operator should know.
                    refused = retrying_cannot_fix(error) or getattr(error, "code", None) == _UNAUTHORIZED
                    level = logging.WARNING if refused and not self._refusal_reported else logging.DEBUG
                    self._refusal_reported = self._refusal_reported or refused
                    logger.log(
                        level,
                        "change stream on %s failed (%s); waiters poll for %.1f s%s",
                        self._full_name,
                        error,
                        delay,
                        " (give the user the changeStream action on the lock collection)" if refused else "",
                    )
                    self._wake_all()
                    if not self._has_waiters():
                        return
                    await asyncio.sleep(delay)
                finally:
                    if stream is not None:
                        with contextlib.suppress(BaseException):
                            await asyncio.shield(stream.close())
        finally:
            if self._task is asyncio.current_task():
                self._task = None
            self._wake_all()

    def _queues(self) -> list[LocalQueue]:
        return queues_on(self._client_id, self._full_name)

    def _has_waiters(self) -> bool:
        return any(queue.waiters for queue in self._queues())

    def _wake_all(self) -> None:
        for queue in self._queues():
            queue.on_news()

    def _dispatch(self, change: dict[str, Any]) -> None:
        operation = change.get("operationType")
        if operation not in ("update", "replace", "delete"):
            self._wake_all()  # drop, rename, dropDatabase, invalidate: look at everything again
            return
        name = (change.get("documentKey") or {}).get("_id")
        for queue in self._queues():
            if queue.name == name:
                _report(queue, operation, change)


def _report(queue: LocalQueue, operation: str, change: dict[str, Any]) -> None:
    """Tell ``queue`` what a change to its lock's document means for its waiters."""
    if operation == "delete":
        queue.on_news()
        return
    if operation == "update":
        fields = (change.get("updateDescription") or {}).get("updatedFields") or {}
    else:
        fields = change.get("fullDocument") or {}
        if fields.get("kind") in PERMIT_KINDS:
            # A whole document does not tell a freed permit from any other write: look again.
            queue.on_news()
            return
    if "freed" in fields or ("owner" in fields and fields["owner"] is None):
        queue.on_news()  # released (a semaphore: a permit freed): the first waiter tries
    elif operation == "update" and isinstance(fields.get("handedOffTo"), str):
        # Handed to one place, or (a read-write lock's readers) to several at once: then each has
        # its own fencing token, which the claim that takes it reads back.
        handed = fields["handedOffTo"].split(" ")
        for token in handed:
            if token == queue.slot:
                queue.on_handed_to_place(token, fields.get("fence") if len(handed) == 1 else None)
    elif isinstance(fields.get("owner"), str):
        queue.on_handed_to_place(fields["owner"], fields.get("fence"))


_watchers: WeakIdentityMap[Any, PerLoop[dict[str, ReleaseWatcher]]] = WeakIdentityMap()


def watcher_for(store: LockStore) -> ReleaseWatcher:
    """The running loop's watcher of ``store``'s collection, created on first use.

    Keyed weakly by client (identity) and loop: a stopped watcher holds neither, so a client that
    is closed and dropped leaves nothing behind.
    """
    watchers = _watchers.setdefault(store.client, lambda: PerLoop(dict)).get()
    watcher = watchers.get(store.full_name)
    if watcher is None:
        watcher = watchers[store.full_name] = ReleaseWatcher(id(store.client), store.full_name)
    return watcher


def _max_await_ms(client: AsyncClient) -> int:
    """``maxAwaitTimeMS`` for the stream's getMores: short enough to end well within the client's
    own operation timeout (``timeoutMS``), which would otherwise cut every idle getMore off. A
    third of it: the other two thirds are the round trip's, on a loaded machine too."""
    timeout = getattr(getattr(client, "options", None), "timeout", None)
    if isinstance(timeout, int | float) and timeout > 0:
        return max(1, min(_MAX_AWAIT_MS, int(timeout * 1000 / 3)))
    return _MAX_AWAIT_MS
