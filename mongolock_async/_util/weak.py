"""A weak mapping keyed by object identity.

``weakref.WeakKeyDictionary`` compares keys with ``==``; PyMongo clients compare equal when they
point at the same servers, so two clients would share one entry.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class WeakIdentityMap(Generic[K, V]):
    """Values per key object, forgotten when the key is garbage-collected."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else None

    def setdefault(self, key: K, make: Callable[[], V]) -> V:
        value = self.get(key)
        if value is None:
            ident = id(key)
            value = make()
            self._entries[ident] = (weakref.ref(key, lambda _ref: self._entries.pop(ident, None)), value)
        return value


class PerLoop(Generic[V]):
    """A value per event loop, made on first use and forgotten with its loop.

    Looked up on every acquire and release, so the loop used last is remembered (weakly): a
    ``WeakKeyDictionary`` lookup makes a weak reference each time.
    """

    def __init__(self, make: Callable[[], V]) -> None:
        self._make = make
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, V] = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], V] | None = None

    def get(self) -> V:
        """The running loop's value."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._make()
        self._last = (weakref.ref(loop), value)
        return value
