"""Jittered exponential backoff."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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
