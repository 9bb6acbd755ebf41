"""A transaction on either driver's client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


@contextlib.asynccontextmanager
async def transaction(client: Any) -> AsyncIterator[Any]:
    """A session in a transaction, committed at the end of the block, aborted on an error (either driver)."""
    session = client.start_session()
    if asyncio.iscoroutine(session) or asyncio.isfuture(session):  # Motor's start_session is awaited
        session = await session
    async with session:
        started = session.start_transaction()
        if asyncio.iscoroutine(started):  # PyMongo's async start_transaction is awaited
            started = await started
        async with started:
            yield session
