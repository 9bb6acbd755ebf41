"""An embedded server whose clock a test sets: SecantusDB under libfaketime (Debian's faketime
package), which reads the clock's offset from a file that the test rewrites. The server's
``$$NOW`` follows within a second (libfaketime reads the file again once a second); monotonic
clocks are left alone, so timeouts still measure real time. Stepping the clock back stands for a
failover to a member whose clock is behind, or a mongos behind another.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType

from pymongo import AsyncMongoClient

from mongolock_async.testing import EmbeddedMongo
from tests.support.libfaketime import preloaded

_SETTLED = timedelta(seconds=0.25)
"""How close the server's clock must come to the time set for it."""


class SteppedServerClock:
    """``async with SteppedServerClock(directory) as clock``: an embedded server started under
    libfaketime (its clock right at first), ``clock.uri``, and ``await clock.set(moment)``."""

    def __init__(self, directory: Path) -> None:
        self._offset_file = directory / "faketime-offset"
        self._offset_file.write_text("+0s\n")
        environment = preloaded(FAKETIME_TIMESTAMP_FILE=str(self._offset_file), FAKETIME_CACHE_DURATION="1")
        self.server = EmbeddedMongo(environment=environment)
        self.client: AsyncMongoClient[dict[str, object]] | None = None

    @property
    def uri(self) -> str:
        return self.server.uri

    async def __aenter__(self) -> SteppedServerClock:
        await self.server.__aenter__()
        self.client = AsyncMongoClient(self.server.uri)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.client is not None:
            await self.client.close()
        await self.server.__aexit__(exc_type, exc, traceback)

    async def now(self) -> datetime:
        """The server's clock (``hello``'s ``localTime``)."""
        assert self.client is not None
        reply = await self.client.admin.command("hello")
        moment: datetime = reply["localTime"]
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment

    async def set(self, moment: datetime) -> None:
        """Make the server's clock read ``moment`` now (and run on from there); return once it does."""
        offset = (moment - datetime.now(UTC)).total_seconds()
        self._offset_file.write_text(f"{offset:+.3f}s\n")
        give_up_at = time.monotonic() + 10
        while abs((await self.now()) - (datetime.now(UTC) + timedelta(seconds=offset))) > _SETTLED:
            assert time.monotonic() < give_up_at, f"the server's clock did not move to {moment} within 10 s"
            await asyncio.sleep(0.1)
