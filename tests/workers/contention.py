"""What the contention workers (``*_worker.py``) share: when to stop contending."""

from __future__ import annotations

import time
from collections.abc import Sized

GRACE = 30.0
"""Seconds a worker may go on past its deadline for the sections its test needs."""


def keep_going(stop_at: float, sections: Sized, enough: int) -> bool:
    """Until ``stop_at``, and past it (for at most ``GRACE`` s) until there are ``enough``
    sections: on a loaded machine a few seconds can give too few for the test to judge."""
    now = time.monotonic()
    return now < stop_at or (now < stop_at + GRACE and len(sections) < enough)
