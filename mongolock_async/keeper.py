"""The heartbeat: one task per event loop renews every lease held with ``heartbeat`` on.

Each tick costs one ``update_many`` per collection, however many leases are held. A renewal that
fails, for any reason, is retried with backoff until the earliest local deadline among the leases it
covers; a lease whose deadline passes unrenewed, or that the server shows as no longer ours, is
marked lost (which cancels its protected block). The task exists only while there is something to
renew.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import defaultdict

import anyio

from .lease import Lease
from .store import LockStore
from .waiting import Backoff

_RETRY_BASE = 0.05


class LeaseKeeper:
    """Renews the heartbeat leases of one event loop."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def running(self) -> bool:
        """Whether the renewal task exists (it does exactly while leases are kept)."""
        return self._task is not None and not self._task.done()

    def keep(self, lease: Lease) -> None:
        """Renew ``lease`` from now on, until :meth:`drop`."""
        self._leases[lease.owner] = lease
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mongolock-keeper")
        self._changed.set()

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease``; stop the task when nothing is left."""
        self._leases.pop(lease.owner, None)
        if not self._leases and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        last_tick = time.monotonic()
        while self._leases:
            interval = min(lease.heartbeat_interval or lease.ttl for lease in self._leases.values())
            with anyio.move_on_after(last_tick + interval - time.monotonic()):
                # A newly kept lease with a shorter interval shortens this wait.
                await self._changed.wait()
                self._changed.clear()
                continue
            last_tick = time.monotonic()
            groups: dict[tuple[int, str, str], list[Lease]] = defaultdict(list)
            for lease in self._leases.values():
                groups[lease.store.group_key].append(lease)
            async with anyio.create_task_group() as tg:
                for leases in groups.values():
                    tg.start_soon(self._renew_group, leases[0].store, leases)
            for lease in [lease for lease in self._leases.values() if lease.lost_error is not None]:
                self._leases.pop(lease.owner, None)  # a lost lease is never renewed again
        if self._task is asyncio.current_task():
            self._task = None

    async def _renew_group(self, store: LockStore, leases: list[Lease]) -> None:
        backoff = Backoff(base=_RETRY_BASE, cap=max(lease.heartbeat_interval or 0.0 for lease in leases) / 2)
        last_error = "no reply from the server"
        while True:
            now = time.monotonic()
            for lease in leases:
                if lease.deadline <= now:
                    lease.mark_lost(f"the lease could not be renewed before its local deadline ({last_error})")
            leases = [lease for lease in leases if lease.believed_held]
            if not leases:
                return
            pairs = [(lease.name, lease.owner) for lease in leases]
            earliest_deadline = min(lease.deadline for lease in leases)
            sent_at = time.monotonic()
            with anyio.move_on_after(earliest_deadline - sent_at):
                try:
                    matched = await store.renew_all(pairs)
                    live = None if matched == len(pairs) else await store.live_owners(pairs)
                except Exception as error:  # whatever failed, the deadline decides, and the reason says it
                    last_error = f"{type(error).__name__}: {error}"
                    await anyio.sleep(min(backoff.next_delay(), max(0.0, earliest_deadline - time.monotonic())))
                    continue
                for lease in leases:
                    if live is None or lease.owner in live:
                        lease.confirm(sent_at)
                    else:
                        lease.mark_lost("the server shows the lease expired or held by another owner")
                return


_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LeaseKeeper] = weakref.WeakKeyDictionary()


def keeper_for_running_loop() -> LeaseKeeper:
    """The keeper of the running event loop, created on first use."""
    loop = asyncio.get_running_loop()
    keeper = _keepers.get(loop)
    if keeper is None:
        keeper = _keepers[loop] = LeaseKeeper()
    return keeper
