"""How a blocked acquire waits: in-process release wake-ups and jittered exponential backoff."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# (collection full name, lock name)
LockKey = tuple[str, str]

_waiters: dict[LockKey, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}


@contextmanager
def release_signal(key: LockKey) -> Iterator[asyncio.Event]:
    """An event set whenever this process releases ``key``, registered for the ``with`` block.

    Register before the first attempt, so a release between an attempt and the wait is not missed.
    """
    entry = (asyncio.get_running_loop(), asyncio.Event())
    _waiters.setdefault(key, set()).add(entry)
    try:
        yield entry[1]
    finally:
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
