"""What a holder believes, observed the way the library promises it.

A holder believes it holds a lease only while its handle says so: ``handle.deadline`` is the local
``time.monotonic()`` until which the lease is known held (None once it is not held, or lost), so
each observation reads the clock first, then the deadline, and counts only if the clock is before
it. A critical section is [the first such observation, min(the last observation, the last deadline
the handle reported while live)]; a section whose entry is observed past the deadline is none. So
a holder paused past its TTL that wakes and notices its loss (``LockLostError`` from ``async
with``, or a handle no longer live) overlaps nobody: nothing it did after its deadline was done
believing. One that does not notice is still caught: its handle goes on saying it holds.

The contention workers (``from belief import Belief``, this directory) and the tests
(``tests.workers.belief``) share it. The deliberately broken locks of the controls have a
``deadline`` too: ``math.inf`` from their entry to their exit, as they believe.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from mongolock_async import LockLostError


class Belief:
    """One holding of one handle, observed at the moments the holder acts."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.entered: float | None = None
        self.left: float | None = None
        self._deadline = -math.inf
        self._over = False

    def holds(self) -> bool:
        """Observe now: whether the handle says its lease is live, as it said at every earlier
        observation (once it is not, the holding is over)."""
        now = time.monotonic()
        if self._over:
            return False
        if not self._live(now):
            self._end(now)
            return False
        return True

    def leaves(self) -> None:
        """The holder is done (its block ends, or it learned of its loss): a last observation,
        then the section ends now or at the last deadline reported while live, whichever is
        first. Only the first call counts."""
        now = time.monotonic()
        if not self._over:
            self._live(now)
            self._end(now)

    @property
    def section(self) -> tuple[float, float] | None:
        """(entered, left) on the machine's monotonic clock; None if it never held while live."""
        if self.entered is None or self.left is None:
            return None
        return self.entered, self.left

    def _live(self, now: float) -> bool:
        deadline = self.handle.deadline
        if deadline is None or now >= deadline:
            return False
        if self.entered is None:
            self.entered = now
        self._deadline = deadline
        return True

    def _end(self, now: float) -> None:
        self._over = True
        if self.entered is not None:
            self.left = min(now, self._deadline)


def believes(handle: Any) -> bool:
    """Whether ``handle`` says now that its lease is live. Asked after another handle's acquire
    returned True, True means the two held at once (that grant came before this moment)."""
    now = time.monotonic()
    deadline = handle.deadline
    return deadline is not None and now < deadline


async def release_as_promised(handle: Any) -> bool:
    """Release ``handle``'s lease. It may find the lease gone (False) only once the handle's
    deadline has passed: the server keeps a lease past that, so gone before it means someone took
    it early. Nothing else may have broken it (no operator's forced release)."""
    deadline = handle.deadline
    released: bool = await handle.release()
    assert released or deadline is None or time.monotonic() >= deadline, (
        f"{handle.name!r}: the release found the lease gone before its local deadline"
    )
    return released


async def hold_for_a_moment(handle: Any, shortest: float, longest: float) -> tuple[float, float, int | None] | None:
    """``async with handle``, its body a sleep of ``shortest`` to ``longest`` seconds: the section it
    believed it held (entered, left, its fencing token), or None if it never held while live. A
    loss (``LockLostError``) ends the section where the belief ended; the caller goes on."""
    belief, token = Belief(handle), None
    try:
        async with handle:
            if belief.holds():
                token = handle.fencing_token
            await asyncio.sleep(random.uniform(shortest, longest))
            belief.leaves()
    except LockLostError:
        belief.leaves()
    return None if belief.section is None else (*belief.section, token)
