"""What one page of the dashboard shows: a window of the locks (a page of them, by name, filtered by
what the name contains or starts with, and by state), so that a collection of 100,000 locks costs a
page its window and the window's changes, never the whole collection.

Pages are keyed by name, not numbered: a page is "the first ``limit`` matching names after (or
before) this one", which stays put while locks come and go elsewhere. The names are kept sorted as
they change (one insertion per new lock), so finding a window is a binary search and a walk.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

from .._util.inert import printable
from .operations import LockInfo

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
STATES = ("held", "released", "released by force", "expired", "free", "unreadable")
"""What ``state`` may select: ``held`` (a live lease or permit), or a lock's ``status``."""


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """Which locks a page shows: names containing ``contains`` (case-insensitive, in the printable
    form the page shows) and starting with ``prefix``, in ``state``; ``limit`` of them after the
    name ``after`` (exclusive), or the last ``limit`` before ``before``."""

    contains: str = ""
    prefix: str = ""
    state: str = ""
    after: str | None = None
    before: str | None = None
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_query(cls, query: str) -> WindowSpec:
        """From a URL's query string (``contains``, ``prefix``, ``state``, ``after``, ``before``,
        ``limit``); ``ValueError`` for a bad one."""
        fields = {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}
        unknown = set(fields) - {"contains", "prefix", "state", "after", "before", "limit"}
        if unknown:
            raise ValueError(f"unknown window parameters: {', '.join(sorted(unknown))}")
        state = fields.get("state", "")
        if state and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        try:
            limit = int(fields.get("limit", DEFAULT_LIMIT))
        except ValueError:
            raise ValueError("limit must be a whole number") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be 1 to {MAX_LIMIT}")
        if fields.get("after") and fields.get("before"):
            raise ValueError("give after or before, not both")
        return cls(
            contains=fields.get("contains", "").lower(),
            prefix=fields.get("prefix", ""),
            state=state,
            after=fields.get("after") or None,
            before=fields.get("before") or None,
            limit=limit,
        )

    def matches(self, name: str, info: LockInfo | None) -> bool:
        """Whether the lock ``name`` (``info``: its state; None: gone) is one this page can show."""
        if info is None or not name.startswith(self.prefix):
            return False
        if self.state == "held" and not info.held:
            return False
        if self.state and self.state != "held" and info.status != self.state:
            return False
        return not self.contains or self.contains in printable(name).lower()

    def covers(self, name: str) -> bool:
        """Whether ``name`` is one this page can show in some state (its events are the page's)."""
        return name.startswith(self.prefix) and (not self.contains or self.contains in printable(name).lower())

    def as_dict(self) -> dict[str, object]:
        return {"contains": self.contains, "prefix": self.prefix, "state": self.state, "after": self.after,
                "before": self.before, "limit": self.limit}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Window:
    """A page's locks: their names in order, whether matching names lie before and after them, and
    how many names match in all."""

    names: tuple[str, ...]
    more_before: bool
    more_after: bool
    matching: int


class NameIndex:
    """Every lock name of a view, sorted."""

    def __init__(self) -> None:
        self._names: list[str] = []

    def __len__(self) -> int:
        return len(self._names)

    def reset(self, names: Iterable[str]) -> None:
        self._names = sorted(names)

    def add(self, name: str) -> None:
        index = bisect.bisect_left(self._names, name)
        if index == len(self._names) or self._names[index] != name:
            self._names.insert(index, name)

    def remove(self, name: str) -> None:
        index = bisect.bisect_left(self._names, name)
        if index < len(self._names) and self._names[index] == name:
            del self._names[index]

    def window(self, spec: WindowSpec, locks: Mapping[str, LockInfo], matching: int | None = None) -> Window:
        """The window ``spec`` asks for; ``matching`` as counted before (counted here when None:
        a walk over every name with the prefix)."""
        start, end = self._range(spec.prefix)
        names = self._names
        shown: list[str] = []
        if spec.before is not None:
            index = bisect.bisect_left(names, spec.before, start, end) - 1
            while index >= start and len(shown) < spec.limit:
                if spec.matches(names[index], locks.get(names[index])):
                    shown.append(names[index])
                index -= 1
            shown.reverse()
        else:
            index = start if spec.after is None else bisect.bisect_right(names, spec.after, start, end)
            while index < end and len(shown) < spec.limit:
                if spec.matches(names[index], locks.get(names[index])):
                    shown.append(names[index])
                index += 1
        before = bisect.bisect_left(names, shown[0], start, end) if shown else start
        after = bisect.bisect_right(names, shown[-1], start, end) if shown else end
        return Window(
            names=tuple(shown),
            more_before=self._any(spec, locks, range(before - 1, start - 1, -1)),
            more_after=self._any(spec, locks, range(after, end)),
            matching=self.count(spec, locks) if matching is None else matching,
        )

    def count(self, spec: WindowSpec, locks: Mapping[str, LockInfo]) -> int:
        """How many names ``spec`` matches (a walk over the names with its prefix)."""
        start, end = self._range(spec.prefix)
        if not (spec.contains or spec.state):
            return end - start
        return sum(spec.matches(name, locks.get(name)) for name in self._names[start:end])

    def _any(self, spec: WindowSpec, locks: Mapping[str, LockInfo], indexes: range) -> bool:
        return any(spec.matches(self._names[index], locks.get(self._names[index])) for index in indexes)

    def _range(self, prefix: str) -> tuple[int, int]:
        if not prefix:
            return 0, len(self._names)
        return bisect.bisect_left(self._names, prefix), bisect.bisect_left(self._names, prefix + "\U0010ffff")
