"""A live view of a lock collection: every lock, semaphore, read-write lock, election and job with
its holders and waiters, kept current from one change stream, and what happens to them as events.
``mongolock watch`` and the dashboard are built on it; so can an app's own page.

```python
from mongolock_async.live import LockWatch

async with LockWatch(collection, prefix="stock:") as watch:
    async for update in watch:
        for event in update.events:
            print(event.at, event.event, event.name, event.describe())
```

**What it costs the deployment.** One change stream per ``LockWatch`` (its ``getMore``s, each
waiting up to ``max_await`` seconds for an event), plus, when it opens and reopens, one ``hello``
for the server's clock and one read of the documents. Each event carries the document as it is
(``fullDocument: "updateLookup"``), so nothing is read per change, and nothing is polled. Where the
deployment has no change streams (a standalone server) or the user may not open one (no
``changeStream`` action), it reads the documents every ``poll_interval`` seconds instead and says so
([`ViewUpdate.note`][mongolock_async.live.ViewUpdate.note]). It never writes: MongoDB's built-in ``read`` role is
enough.

**How events are told.** Each write's document is compared with the one before it, on the
fields the library writes: a new owner token (or permit) is an acquisition; one that left in a
write that also set ``releasedAt`` was released, and if another took it in that same write (its
``acquiredAt`` is that ``releasedAt``), handed off; a new ``forcedRelease`` time is a forced
release; an owner replaced without a release, or a permit dropped after its expiry, was lost.
Expiry writes nothing, so the view keeps the server's clock (read with ``hello`` and moved forward
by each event's ``wallTime``) and a timer at the next expiry: a lease that reaches its
``expiresAt`` unrenewed is reported ``expired`` at that time, once the view has heard from the
server after it (a ``getMore`` that returned, a read), so that a renewal it could not see is never
taken for an expiry. Events of writes that follow each other within one change's lookup are told
from the latest document, so several steps between two events can show as one.

**When MongoDB cannot be reached.** The view says so
([`ViewUpdate.disconnected_since`][mongolock_async.live.ViewUpdate.disconnected_since]: the server
time of its last word from MongoDB) and keeps the last state it knew, stale, without judging any
lease expired meanwhile; when the stream reopens it reads everything and reports what changed.
[`ViewUpdate.note`][mongolock_async.live.ViewUpdate.note] gives the cause in words that name no
host, address or topology (fit for a dashboard's viewers);
[`LockWatch.last_error`][mongolock_async.live.LockWatch.last_error] is the driver's error itself,
for the operator's log.
"""

from .admin.live import EventKind, LockEvent, LockWatch, ViewUpdate, derive_events

__all__ = [
    "derive_events",
    "EventKind",
    "LockEvent",
    "LockWatch",
    "ViewUpdate",
]
