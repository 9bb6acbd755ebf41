"""What a client sent: a command and connection-pool listener that tests count requests with."""

from __future__ import annotations

import asyncio
from typing import Any

from pymongo import monitoring


class CommandCounter(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Records every command a client starts (command monitoring), how many change-stream
    ``getMore``s returned events, and the connections the pool opened and closed (CMAP)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.answered: list[str] = []
        """The names of the commands that got a reply (or failed), in order."""
        self.commands: list[dict[str, Any]] = []
        self.events_delivered = 0
        """``getMore`` replies that carried at least one change event (the embedded server also
        answers idle ones early with empty batches whenever anything is written; MongoDB waits)."""
        self.changes: list[dict[str, Any]] = []
        """Every change event those replies carried, in order."""
        self.connections_created = 0
        self.connections_closed = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)
        self.commands.append(dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.answered.append(event.command_name)
        if event.command_name == "getMore" and event.reply.get("cursor", {}).get("nextBatch"):
            self.events_delivered += 1
            self.changes += event.reply["cursor"]["nextBatch"]

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.answered.append(event.command_name)

    async def settled(self) -> None:
        """Wait until a change stream is open (its first getMore sent) and every attempt
        (findAndModify) sent meanwhile has its answer: the waiters look once more as the stream
        opens, and a count taken before that look ends would include it."""
        while self.count("getMore") == 0:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.01)
        # The look is sent as the stream's first getMore is; 0.1 s for it was too little once under
        # python -O in 8 workers (the look counted after, as if a renewal had woken the waiter).
        await asyncio.sleep(0.5)
        while self.count("findAndModify") > self.answered.count("findAndModify"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    async def queued(self, sent_before: int) -> None:
        """Wait until a new waiter's place is stored: an attempt after the first ``sent_before``
        was sent, then ``settled``."""
        while self.count("findAndModify") <= sent_before:  # noqa: ASYNC110 - polls a command listener
            await asyncio.sleep(0.01)
        await self.settled()

    def count(self, *names: str) -> int:
        return sum(1 for name in self.names if name in names)

    def clear(self) -> None:
        self.names.clear()
        self.answered.clear()
        self.commands.clear()
        self.changes.clear()
        self.events_delivered = self.connections_created = self.connections_closed = 0

    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None:
        self.connections_created += 1

    def connection_closed(self, event: monitoring.ConnectionClosedEvent) -> None:
        self.connections_closed += 1

    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None:
        pass

    def pool_ready(self, event: monitoring.PoolReadyEvent) -> None:
        pass

    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None:
        pass

    def pool_closed(self, event: monitoring.PoolClosedEvent) -> None:
        pass

    def connection_ready(self, event: monitoring.ConnectionReadyEvent) -> None:
        pass

    def connection_check_out_started(self, event: monitoring.ConnectionCheckOutStartedEvent) -> None:
        pass

    def connection_check_out_failed(self, event: monitoring.ConnectionCheckOutFailedEvent) -> None:
        pass

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None:
        pass

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        pass
