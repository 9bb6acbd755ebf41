"""Finish a request the server may already be applying, even when the caller is cancelled.

A request cut off mid-flight leaves its outcome unknown: an acquire may have taken the lock for a
task that is gone. So lock requests run to completion in their own task, and a cancellation that
arrives meanwhile is held back until the outcome is known and cleaned up, then re-raised as itself.
This works for plain ``Task.cancel()`` (``asyncio.timeout``, ``wait_for``, a web server dropping a
request) as well as anyio cancel scopes; anyio's own shielding does not stop the former.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class NoAnswerError(Exception):
    """The request got no answer within its limit; it was abandoned and its outcome is unknown."""


async def run_shielded(
    request: Coroutine[Any, Any, T],
    *,
    limit: float,
    on_cancelled: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """Await ``request`` to completion or for ``limit`` seconds, whichever comes first.

    If the caller is cancelled meanwhile, the request still completes; then ``on_cancelled(result)``
    runs (also shielded) and the cancellation is re-raised. Raises :class:`NoAnswerError` when the
    limit passes first (or the cancellation, if one arrived).
    """
    task = asyncio.ensure_future(request)
    cancellation = await _wait_uncancellable(task, limit)
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await _wait_uncancellable(task, 1.0)
        if cancellation is not None:
            raise cancellation
        raise NoAnswerError(f"no answer within {limit:g} s")
    if cancellation is None:
        return task.result()
    if task.exception() is None and on_cancelled is not None:
        cleanup = asyncio.ensure_future(on_cancelled(task.result()))
        await _wait_uncancellable(cleanup, limit)
        if not cleanup.done():
            cleanup.cancel()
    raise cancellation


async def _wait_uncancellable(task: asyncio.Future[Any], limit: float) -> asyncio.CancelledError | None:
    """Wait up to ``limit`` seconds for ``task``; return the first cancellation that hit the caller."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    cancellation: asyncio.CancelledError | None = None
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError as error:
            # anyio re-delivers a scope's cancellation on every loop iteration; keep the first.
            cancellation = cancellation or error
    return cancellation
