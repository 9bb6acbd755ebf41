"""The overlap detector of the concurrency tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def most_at_once(sections: Sequence[Sequence[Any]]) -> int:
    """The largest number of sections (each starting with its enter and exit times) running at one
    moment: a sweep over entries and exits, an exit before an entry at the same moment."""
    events = sorted([(section[0], 1) for section in sections] + [(section[1], -1) for section in sections])
    inside = peak = 0
    for _, step in events:
        inside += step
        peak = max(peak, inside)
    return peak
