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


async def run_shielded(
    request: Coroutine[Any, Any, T],
    *,
    grace: float,
    on_cancelled: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """Await ``request``; if the caller is cancelled meanwhile, let it finish first.

    After a cancellation the request gets up to ``grace`` more seconds; when it completes in time,
    ``on_cancelled(result)`` runs (also shielded, also within ``grace``). Then the cancellation is
    re-raised. Without a cancellation this is a plain await: the driver's own timeouts apply.
    """
    task = asyncio.ensure_future(request)
    cancellation: asyncio.CancelledError | None = None
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError as error:
        cancellation = error
    if await _finish(task, grace) and task.exception() is None and on_cancelled is not None:
        await _finish(asyncio.ensure_future(on_cancelled(task.result())), grace)
    raise cancellation


async def _finish(task: asyncio.Future[Any], grace: float) -> bool:
    """Wait up to ``grace`` seconds for ``task`` despite further cancellations; cancel it if late.

    Returns whether it completed. anyio re-delivers a scope's cancellation on every loop iteration,
    hence the loop.
    """
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + grace
    while not task.done() and loop.time() < give_up_at:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=give_up_at - loop.time())
    if not task.done():
        task.cancel()
        return False
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
    return not task.cancelled()
