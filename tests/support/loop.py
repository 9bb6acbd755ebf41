"""The event loop, as tests that race a cancellation against news drive it."""

from __future__ import annotations

import asyncio


async def settle() -> None:
    """Let every task that can run do so (a few loop iterations, no time passing)."""
    for _ in range(10):
        await asyncio.sleep(0)
