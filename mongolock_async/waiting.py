"""How a blocked acquire waits: release wake-ups and jittered exponential backoff.

A waiter wakes at once when a handle in this process releases the name, and, where the deployment
has change streams, when any process releases it: one change stream per collection and event loop,
open while someone waits. Without change streams the waiter relies on backoff and on the holder's
expiry time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pymongo.errors import PyMongoError

from .store import LockStore

logger = logging.getLogger("mongolock_async")
# After a change stream failed to open or broke, waiters of that collection use backoff alone this long.
_STREAM_RETRY_AFTER = 30.0

# (collection full name, lock name)
LockKey = tuple[str, str]

_waiters: dict[LockKey, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}


@contextmanager
def release_signal(store: LockStore, name: str) -> Iterator[asyncio.Event]:
    """An event set whenever ``name`` is released, registered for the ``with`` block.

    Register before the first attempt, so a release between an attempt and the wait is not missed.
    """
    key = (store.full_name, name)
    loop = asyncio.get_running_loop()
    entry = (loop, asyncio.Event())
    _waiters.setdefault(key, set()).add(entry)
    watcher = _watcher_for(loop, store)
    watcher.interested(+1)
    try:
        yield entry[1]
    finally:
        watcher.interested(-1)
        entries = _waiters.get(key)
        if entries is not None:
            entries.discard(entry)
            if not entries:
                del _waiters[key]


def announce_release(key: LockKey) -> None:
    """Wake every waiter of this process that waits for ``key``, whichever event loop it runs on."""
    current = _running_loop()
    for loop, event in list(_waiters.get(key, ())):
        if loop is current:
            event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(event.set)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class ReleaseWatcher:
    """A change stream on one collection, open while at least one waiter of this loop waits on it."""

    def __init__(self, store: LockStore) -> None:
        self._store = store
        self._waiting = 0
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0

    def interested(self, delta: int) -> None:
        self._waiting += delta
        if self._waiting > 0 and self._task is None and time.monotonic() >= self._retry_at:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mongolock-release-watcher")
        elif self._waiting == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        stream = None
        try:
            # Motor opens the stream lazily, so "not supported here" may only show at the first change.
            stream = await self._store.watch_releases()
            while True:
                announce_release((self._store.full_name, await stream.next_released()))
        except PyMongoError as error:
            logger.debug("no change stream on %s (%s); waiters use backoff", self._store.full_name, error)
            self._retry_at = time.monotonic() + _STREAM_RETRY_AFTER
            if self._task is asyncio.current_task():
                self._task = None
        finally:
            if stream is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(stream.close())


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str, str], ReleaseWatcher]] = (
    weakref.WeakKeyDictionary()
)


def _watcher_for(loop: asyncio.AbstractEventLoop, store: LockStore) -> ReleaseWatcher:
    watchers = _watchers.setdefault(loop, {})
    watcher = watchers.get(store.group_key)
    if watcher is None:
        watcher = watchers[store.group_key] = ReleaseWatcher(store)
    return watcher


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter: the n-th delay is uniform in [0, min(cap, base * 2**n)]."""

    base: float
    cap: float
    attempt: int = field(default=0)

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2 ** min(self.attempt, 32))
        self.attempt += 1
        return random.uniform(0, ceiling)
