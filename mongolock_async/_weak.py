"""A weak mapping keyed by object identity.

``weakref.WeakKeyDictionary`` compares keys with ``==``; PyMongo clients compare equal when they
point at the same servers, so two clients would share one entry.
"""

from __future__ import annotations

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
