"""Every MongoDB query the library sends, and nothing else.

One document per lock name:

```text
{_id: <name>, owner: <token> | null, expiresAt: <server date>, fence: <int64>, ttlMs: <int>,
 holder: {host, pid, label}, acquiredAt, renewedAt, releasedAt, releasedOwner, recentReleases,
 handedOffAt, handedOffTo, queue: [{t: <token>, ttlMs, holder, at: <server date>, exp: <server date>}, ...],
 renewal: <tick>}
```

Time is always the server's: expiry is written and compared with ``$$NOW`` inside the query, never
with a client clock. ``$$NOW`` goes through ``{$toDate: {$toLong: "$$NOW"}}``, which is the identity
on MongoDB and works around an embedded test server that compares raw ``$$NOW`` with stored dates
wrongly. Array fields are read with ``$map``/``$filter`` rather than ``"$queue.t"`` paths, which
that server does not resolve.

Release clears ``owner`` instead of deleting the document, so ``fence`` survives. Fencing tokens are
``max(previous + 1, server clock in microseconds)``: the floor keeps them increasing even after an
idle document was purged and re-created (a purge needs at least an hour of idleness, in which the
floor grows by 3.6e9).

``queue`` holds one *place* per waiting process: the owner token the lease is handed to when the
place's turn comes. Places expire (``exp``) unless their process refreshes them; expired or
malformed places are ignored and pruned by the next write. A release hands the lease straight to
the next place in the same write, so a hand-off costs no extra request and no race.

Every pipeline first checks that the fields it relies on have the types this library writes
(``_sane``); on a document edited into another shape it changes nothing, and the caller raises
``LockDataError`` from ``LockState`` parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, NamedTuple, TypeVar

from bson.codec_options import DatetimeConversion
from pymongo import ReadPreference, ReturnDocument, UpdateOne
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
)
from pymongo.read_concern import ReadConcern
from pymongo.server_type import SERVER_TYPE
from pymongo.topology_description import TOPOLOGY_TYPE
from pymongo.write_concern import WriteConcern

from ._diagnosis import cause_of, retrying_cannot_fix
from ._shield import RequestTimeout, run_shielded
from ._weak import WeakIdentityMap
from .documents import EXPIRY_HORIZON, JOB_KIND, MAX_FENCE, MAX_PERMITS, PERMIT_KINDS, LockReport, LockState
from .errors import LockDataError, ServerTooOldError

logger = logging.getLogger("mongolock_async")
T = TypeVar("T")

SERVER_NOW: dict[str, Any] = {"$toDate": {"$toLong": "$$NOW"}}
# MongoDB 5.0 (wire version 13): the oldest release the library is tested and supported on.
_MIN_WIRE_VERSION = 13
_RELEASES = {6: "3.6", 7: "4.0", 8: "4.2", 9: "4.4"}
_WRITABLE = (SERVER_TYPE.RSPrimary, SERVER_TYPE.Mongos, SERVER_TYPE.Standalone)
_checked_clients: WeakIdentityMap[Any, bool] = WeakIdentityMap()
IDLE_CLEANUP_INDEX = "mongolock_idle_cleanup"
# The longest lease a handle may ask for. A stored expiry further ahead than this (plus a day for
# clock differences) was not written by this library, and a lease that never expires is refused.
MAX_TTL_MS = 366 * 86_400_000  # _validate.MAX_TTL
_EXPIRY_HORIZON_MS = int(EXPIRY_HORIZON.total_seconds() * 1000)
# Racing upserts of a new name can fail with a duplicate key; the retry then finds the document.
_UPSERT_RACE_RETRIES = 10

# What acquires and releases read back: the fields their callers decide on (less to send back,
# decode and check than the whole document).
_DECIDING_FIELDS = {"owner": 1, "expiresAt": 1, "fence": 1, "queue": 1, "kind": 1, "limit": 1, "holders": 1, "job": 1}
_NOW = "$_now"  # in pipelines, after the first stage has computed it once
_TEMPORARY = [
    "_v", "_now", "_sane", "_q", "_live", "_mine", "_ahead", "_claim", "_take", "_own", "_c", "_h", "_handed",
    "_remote", "_hs", "_nf", "_rest", "_room", "_held", "_gone", "_hand", "_r",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ForcedRelease:
    """A lease broken by ``LockStore.force_release``, as it was (read leniently: it may be corrupt)."""

    name: str
    owner: str | None
    holder: Mapping[str, Any]
    fencing_token: int | None
    permits: tuple[tuple[str, Mapping[str, Any], int | None], ...] = ()
    """For a semaphore: the broken permits, as (owner token, holder, fencing token)."""


class PlaceRequest(NamedTuple):
    """What a waiting process asks to be handed: its token, the lease length and who it is.

    ``follower`` is the place for the process's next waiting task: whichever write gives this
    place the lease queues the follower last in the same write, so the process stays in line
    without another request.
    """

    token: str
    ttl_ms: int
    holder: Mapping[str, Any]
    follower: PlaceRequest | None = None
    weight: int = 1
    """What the place asks for of a semaphore's or read-write lock's limit (see ``Permits``)."""


class Permits(NamedTuple):
    """What a request for a permit is for: a semaphore's (``kind`` "semaphore", one permit of
    ``limit``), a read-write lock's (``kind`` "rwlock": a reader weighs 1, a writer the whole
    ``limit``) or an election's leadership (``kind`` "election", the one permit of a limit of 1).
    Holders' weights add up to at most ``limit``."""

    kind: str
    limit: int
    weight: int = 1


class JobSchedule(NamedTuple):
    """When a job may run (see ``LockStore.start_job``), in milliseconds."""

    every_ms: int | None = None
    """Run at most once per slot of this length of the server's clock; None: no slots."""
    offset_ms: int = 0
    """Slots start this long after each multiple of ``every_ms`` since the Unix epoch."""
    min_interval_ms: int | None = None
    """Start no run sooner than this after the last run ended."""
    max_attempts: int = 1
    """Runs allowed per slot (with ``every_ms``)."""


_stores: WeakIdentityMap[Any, list[LockStore]] = WeakIdentityMap()


def store_for(collection: Any, write_concern: WriteConcern) -> LockStore:
    """The ``LockStore`` of ``collection`` with ``write_concern``, shared by every handle made from
    the same collection object: a store holds a copy of the collection with its own options, which
    costs some hundreds of bytes and microseconds per handle that services make per request."""
    stores = _stores.setdefault(collection, list)
    for store in stores:
        if store.write_concern is write_concern or store.write_concern == write_concern:
            return store
    store = LockStore(collection, write_concern)
    stores.append(store)
    return store


class LockStore:
    """The lock collection, with the write concern and read preference the promises need.

    ``collection`` is a PyMongo ``AsyncCollection`` or a Motor collection: only the awaitable
    methods the two share are used. Dates are decoded as aware UTC datetimes, and dates outside
    Python's range as ``DatetimeMS`` (so a corrupt document yields a clear error, not an
    ``OverflowError`` inside the driver).
    """

    def __init__(self, collection: Any, write_concern: WriteConcern) -> None:
        codec_options = collection.codec_options.with_options(
            document_class=dict, tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
        )
        self._collection = collection.with_options(
            codec_options=codec_options, write_concern=write_concern, read_preference=ReadPreference.PRIMARY
        )
        self._codec_options = codec_options
        self._write_concern_document = write_concern.document
        self.client: Any = collection.database.client
        self.full_name: str = collection.full_name
        self.write_concern = write_concern
        self.answered_at = 0.0
        """Monotonic time at which a request of this store last got an answer (see ``send``)."""

    @functools.cached_property
    def _majority_reads(self) -> Any:
        # What operators and `locked()` are shown: only state a majority has, which no failover
        # rolls back (a deposed primary's, or a write that fails over before it replicates, could be).
        return self._collection.with_options(read_concern=ReadConcern("majority"))

    async def send(
        self,
        request: Coroutine[Any, Any, T],
        *,
        bound: float,
        on_cancelled: Callable[[T], Awaitable[None]] | None = None,
    ) -> T:
        """Run one of this store's requests to completion within ``bound`` seconds, whatever happens
        to the caller (see :func:`~mongolock_async._shield.run_shielded`); past the bound it raises
        ``RequestTimeout``. While the client knows no server to write to, a request still waiting
        after :data:`NO_SERVER_WARNING_AFTER` seconds logs a warning saying so: no silent waits.
        An answer sets ``answered_at``."""
        warning = None
        if bound > NO_SERVER_WARNING_AFTER and not _writable_server_known(self.client):
            loop = asyncio.get_running_loop()
            warning = loop.call_later(NO_SERVER_WARNING_AFTER, _warn_no_server, self.client, bound)
        try:
            result = await run_shielded(request, bound=bound, on_cancelled=on_cancelled)
            self.answered_at = time.monotonic()
            return result
        except RequestTimeout:
            if _writable_server_known(self.client):
                raise
            # Still no server to send it to: what the driver itself reports as a server selection
            # timeout (a request it never sent), with what its monitoring ran into.
            cause = _what_the_servers_ran_into(self.client) or "no server answered"
            message = f"no MongoDB server to write to within {bound:.3g} s: {cause}"
            raise ServerSelectionTimeoutError(message) from None
        finally:
            if warning is not None:
                warning.cancel()

    # -- acquire, release, renew ------------------------------------------------------------------

    async def check_server(self) -> None:
        """Refuse a server older than MongoDB 5.0, once per client, with a clear error.

        Judged by the wire version each server announced to the driver's monitoring, after a
        ``ping`` (a command every version knows; ``hello`` is unknown before 4.4.2) has made sure
        the server this client writes to is known.
        """
        if _checked_clients.get(self.client):
            return
        await self.client.admin.command("ping")
        description = self.client.topology_description
        # A load balancer hides the servers' versions; MongoDB supports load-balanced mode from 5.0.
        if description.topology_type != TOPOLOGY_TYPE.LoadBalanced:
            wire_version = oldest_wire_version(description.server_descriptions().values())
            if wire_version is not None and wire_version < _MIN_WIRE_VERSION:
                release = _RELEASES.get(wire_version)
                raise ServerTooOldError(
                    f"mongolock-async needs MongoDB 5.0 or newer; the server at {self.full_name} speaks wire "
                    f"version {wire_version}{f' (MongoDB {release})' if release else ''}, and 5.0 is "
                    f"{_MIN_WIRE_VERSION}"
                )
        _checked_clients.setdefault(self.client, lambda: True)

    async def try_acquire(
        self,
        name: str,
        owner: str,
        ttl_ms: int,
        holder: Mapping[str, Any],
        *,
        enqueue: bool = False,
        fair: bool = False,
        follower: PlaceRequest | None = None,
        session: Any = None,
        permits: Permits | None = None,
    ) -> LockState:
        """Take ``name`` for ``owner`` if it is free or expired; return the document either way.

        One round trip: an upserting ``findAndModify`` whose pipeline decides on the server. If the
        lease was handed to ``owner`` (its place's turn came), this claims it: the expiry restarts
        from now and the fencing token stays the one issued at the hand-off. ``enqueue`` adds (or
        refreshes) ``owner``'s place in the queue when the lock is not taken; ``fair`` refuses a free
        lock while an older place waits. ``follower`` (see ``PlaceRequest``) is queued in the
        same write when the lock is taken, and recorded with the place when it is not.

        With ``permits``, ``name`` is a semaphore or a read-write lock: ``owner`` takes a permit while
        the holders' weights leave room for it (or claims one handed to it). ``LockDataError`` if the
        document is of another kind.
        """
        await self.check_server()
        place = PlaceRequest(owner, ttl_ms, holder, follower)
        if permits is None:
            pipeline = _acquire_pipeline(place, enqueue=enqueue, fair=fair)
        else:
            pipeline = semaphore_acquire_pipeline(place, permits, enqueue=enqueue, fair=fair)
        return of_kind(await self._upsert(name, pipeline, session=session), permits)

    async def _upsert(self, name: str, pipeline: list[dict[str, Any]], *, session: Any = None) -> LockState:
        """``_find_and_modify`` of ``name``'s document with ``upsert``, sent again when racing upserts
        of a new name collide (a duplicate key on ``_id``)."""
        for _ in range(_UPSERT_RACE_RETRIES):
            try:
                doc = await self._find_and_modify({"_id": name}, pipeline, upsert=True, session=session)
            except DuplicateKeyError as error:
                if (error.details or {}).get("keyPattern", {"_id": 1}) != {"_id": 1}:
                    raise  # another unique index of the user's: not the upsert race
                continue
            if doc is not None:  # the embedded server may return None on the same race
                return LockState.from_document(doc)
        raise RuntimeError(f"acquire of {name!r} kept racing with concurrent upserts")

    async def start_job(
        self, name: str, owner: str, ttl_ms: int, holder: Mapping[str, Any], schedule: JobSchedule
    ) -> LockState:
        """Take the lease of the job ``name`` for ``owner`` if the job is due; return its document
        either way (taken: ``owner`` holds it; else ``job.skipped`` says why, as decided now).

        One round trip, an upserting ``findAndModify``: on the server's clock it computes the
        current slot, and takes the lease only if nobody holds it, no run succeeded in the slot, the
        slot's attempts are not used up, and the last run ended at least ``min_interval_ms`` ago;
        the run is recorded in the same write. A run whose lease expired unfinished (its process
        died, or lost the lease) is recorded as lost. A free lock's document of the same name (a
        ``run_once`` of an earlier version) becomes the job's; ``LockDataError`` if the name is a
        semaphore's, a read-write lock's or an election's.
        """
        await self.check_server()
        state = await self._upsert(name, _job_start_pipeline(owner, ttl_ms, holder, schedule))
        return state if state.kind == "lock" else of_kind(state, None, kind=JOB_KIND)

    async def finish_job(
        self,
        name: str,
        owner: str,
        *,
        outcome: str,
        error: Mapping[str, str] | None = None,
        hold_at_least_ms: int | None = None,
    ) -> bool:
        """End ``owner``'s run of the job ``name`` and record how it ended (``outcome``, one of
        ``documents.JOB_OUTCOMES``, and for a failure the error's type and message); a success
        marks its slot done. The lease ends too, unless ``hold_at_least_ms`` after the run's start is
        still ahead: then it is kept until then (ShedLock's ``lockAtLeastFor``), unrenewed.

        Returns whether this ended ``owner``'s live run (False: its lease had expired, or was
        broken). A finish sent again after a lost reply recognises its own earlier success.
        """
        query = {"_id": name, "$or": [{"owner": owner}, {"job.finished": owner}]}
        doc = await self._find_and_modify(query, _job_finish_pipeline(owner, outcome, error, hold_at_least_ms))
        if doc is None:
            return False
        job = doc.get("job")
        finished = job.get("finished") if isinstance(job, Mapping) else None
        return isinstance(finished, list) and owner in finished

    async def release(
        self,
        name: str,
        owner: str,
        *,
        successor: PlaceRequest | None = None,
        fair: bool = False,
        successor_first: bool = True,
        permits: Permits | None = None,
    ) -> LockState | None:
        """End ``owner``'s live lease on ``name`` and hand it on; None if it was not live.

        In the same write the lease goes to the next place in the queue, or to ``successor`` (a task
        of this process waiting for it), or nobody. Default order: ``successor`` first while
        ``successor_first``, else the oldest place of another process, else ``successor``. With
        ``fair``: the oldest place, ``successor`` queued at the end. The place that gets the lease
        leaves the queue and its follower joins it at the end. Returns the document after the write.

        The write records ``owner`` as ``releasedOwner`` and in ``recentReleases`` (with the expiry
        its lease had), and a document that records it matches too (and is left as it is): so a
        release sent again because the reply to an earlier one was lost (a write concern error, a
        timeout) recognises that earlier success instead of reporting the lease gone, also after
        later holders released in between. A copy can arrive only while that lease would still
        have been live (the caller stops sending it at the lease's local deadline), so a release
        is forgotten once that expiry has passed, or after ``_LOCK_RELEASES_REMEMBERED`` later
        releases of the name. Owner tokens are never reused, so only our own release writes it.
        With ``permits``, ``owner``'s permit is returned and handed on the same way (to as many of the
        oldest places as its weight makes room for), and the last released owners are remembered in
        ``releasedOwners``.
        """
        if permits is None:
            query = {"_id": name, "$or": [{"owner": owner}, {"releasedOwner": owner}, {"recentReleases.o": owner}]}
            pipeline = _release_pipeline(owner, successor, fair=fair, successor_first=successor_first)
        else:
            query = {"_id": name, "$or": [{"holders.o": owner}, {"releasedOwners": owner}]}
            pipeline = semaphore_release_pipeline(owner, successor, permits, fair=fair, successor_first=successor_first)
        doc = await self._find_and_modify(query, pipeline)
        if doc is None:
            return None
        state = of_kind(LockState.from_document(doc), permits)
        return None if state.holds(owner) else state  # still ours: it had expired, nothing was released

    async def _find_and_modify(
        self, query: Mapping[str, Any], pipeline: list[dict[str, Any]], *, upsert: bool = False, session: Any = None
    ) -> Mapping[str, Any] | None:
        """The ``findAndModify`` of acquires and releases, sent as a plain command; the document
        after the write (its deciding fields), or None if nothing matched.

        Sent with ``database.command`` rather than ``find_one_and_update``: the collection method's
        retryable-write bookkeeping costs about a tenth of an acquire + release in client CPU, and
        adds nothing here, where every request is safe to send again with the same owner token (an
        acquire claims what an earlier copy took, a release recognises its own ``releasedOwner``).
        A plain command does not raise a write concern error by itself (``Database.command`` leaves
        ``writeConcernError`` in the reply), so this does.
        """
        command = {
            "findAndModify": self._collection.name,
            "query": query,
            "update": pipeline,
            "fields": _DECIDING_FIELDS,
            "new": True,
            "upsert": upsert,
            "writeConcern": self._write_concern_document,
        }
        reply = await self._collection.database.command(command, codec_options=self._codec_options, session=session)
        error = reply.get("writeConcernError")
        if error is not None:
            raise WriteConcernError(error.get("errmsg", "write concern error"), error.get("code"), reply)
        value: Mapping[str, Any] | None = reply.get("value")
        return value

    async def leave(self, name: str, tokens: Sequence[str], *, fair: bool, permits: Permits | None = None) -> None:
        """Withdraw the places holding ``tokens``; if the lease (or, with ``permits``, a permit) was
        handed to one of them meanwhile, hand it on (or release it).

        The tokens are remembered as withdrawn, so that an attempt of theirs the server applies
        later (one cut off by its bound, still on its way) neither queues them again nor takes the
        lock for a waiter that is gone. So this writes even when no place of theirs is there yet.
        """
        if permits is None:
            pipeline = _release_pipeline(None, None, fair=fair, successor_first=False, leaving=tokens)
        else:
            pipeline = semaphore_release_pipeline(None, None, permits, fair=fair, successor_first=False, leaving=tokens)
        await self._collection.update_one({"_id": name}, pipeline)

    async def guard_transaction(
        self, name: str, owner: str, fence: int, session: Any, *, permits: Permits | None = None
    ) -> bool:
        """Inside ``session``'s transaction, write to ``owner``'s lease if it is live on the server's
        clock; False if it is not (expired, released, or another owner's now).

        Why this protects the transaction's other writes (MongoDB's documentation, "In-progress
        Transactions and Write Conflicts"; the server's jstests/core/txns/write_conflicts_with_non_txns.js):
        a write outside a transaction to a document the transaction has written waits until the
        transaction commits or aborts, so a takeover of this lease is ordered after the commit; and a
        transaction that writes a document changed since its snapshot fails with WriteConflict
        (labelled TransientTransactionError), so a takeover before this write aborts the transaction.
        """
        stamp = _stamp()
        if permits is None:
            query: dict[str, Any] = {"_id": name, "owner": owner, "fence": fence}
            live: Any = _LEASE_LIVE
        else:
            query = {"_id": name, "holders": {"$elemMatch": {"o": owner, "fence": fence}}}
            mine = {"$and": [{"$eq": ["$$this.o", owner]}, {"$eq": ["$$this.fence", fence]}]}
            live = {"$gt": [{"$size": {"$filter": {"input": _live_holders(SERVER_NOW), "cond": mine}}}, 0]}
        doc = await self._collection.find_one_and_update(
            query,
            [{"$set": {"guard": {"$cond": [live, stamp, "$guard"]}}}],
            projection={"guard": 1},
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        return doc is not None and doc.get("guard") == stamp

    async def extend(self, name: str, owner: str, ttl_ms: int, *, permits: Permits | None = None) -> bool:
        """Give ``owner``'s live lease (or semaphore permit) a new expiry ``ttl_ms`` from now; False
        if it is not live."""
        result = await self._collection.update_one(*_renewal_of(name, owner, ttl_ms, _stamp(), permits))
        return bool(result.modified_count)

    async def put_place_first(self, name: str, owner: str, place: str, *, permits: Permits) -> bool:
        """Move the queue place ``place`` of ``name`` to the front, so that the next hand-off goes
        to it; only while ``owner`` holds a permit there and the place waits. True if it was moved
        (or was first already)."""
        query = {"_id": name, "kind": permits.kind, "holders.o": owner, "queue.t": place}
        token = {"$literal": place}  # read from the document: never taken for a field path
        first = {"$filter": {"input": "$queue", "cond": {"$eq": ["$$this.t", token]}}}
        rest = {"$filter": {"input": "$queue", "cond": {"$ne": ["$$this.t", token]}}}
        pipeline = [{"$set": {"queue": {"$concatArrays": [first, rest]}}}]
        result = await self._collection.update_one(query, pipeline)
        return bool(result.matched_count)

    async def renew(self, leases: Sequence[tuple[str, str, int, Permits | None]]) -> set[tuple[str, str]]:
        """Renew each live lease among ``(name, owner, ttl_ms, permits)`` (``permits`` set for a
        semaphore's permit); return the ``(name, owner)`` pairs this write renewed.

        One request: an unordered batch of single-document updates, each matching its own name and
        owner by equality (the ``_id`` index), so the server's work per lease does not depend on how
        many are sent. Every renewed document is stamped with a value unique to this request; when
        fewer were renewed than sent, the renewed ones are found by that stamp, so a lease is
        confirmed only by the write that renewed it, never by a later read.
        """
        tick = _stamp()
        requests = [UpdateOne(*_renewal_of(name, owner, ttl, tick, permits)) for name, owner, ttl, permits in leases]
        try:
            result = await self._collection.bulk_write(requests, ordered=False)
            renewed = result.modified_count
        except BulkWriteError as error:
            if error.details.get("writeConcernErrors"):
                raise
            renewed = -1  # some statements failed: find out which renewals were applied
        if renewed == len(leases):
            return {(name, owner) for name, owner, _, _ in leases}
        names = [name for name, _, _, _ in leases]
        query = {"_id": {"$in": names}, "$or": [{"renewal": tick}, {"holders.r": tick}]}
        cursor = self._collection.find(query, {"owner": 1, "renewal": 1, "holders": 1})
        confirmed: set[tuple[str, str]] = set()
        for doc in await cursor.to_list(None):
            if doc.get("renewal") == tick and isinstance(doc.get("owner"), str):
                confirmed.add((doc["_id"], doc["owner"]))
            for entry in doc.get("holders") if isinstance(doc.get("holders"), list) else ():
                if isinstance(entry, Mapping) and entry.get("r") == tick and isinstance(entry.get("o"), str):
                    confirmed.add((doc["_id"], entry["o"]))
        return confirmed

    async def refresh_places(self, places: Sequence[tuple[str, str, int]]) -> set[str] | None:
        """Push back the expiry of each queue place ``(name, token, ttl_ms)``.

        One request, like ``renew``. Returns None if every place was there to be refreshed,
        else the tokens of those still there: a place that is gone (expired and pruned, or its turn
        came) is missing, and its waiter must queue again.
        """
        requests = [
            UpdateOne({"_id": name, "queue.t": token}, _refresh_place(token, ttl_ms)) for name, token, ttl_ms in places
        ]
        result = await self._collection.bulk_write(requests, ordered=False)
        if result.matched_count == len(places):
            return None
        tokens = {token for _, token, _ in places}
        cursor = self._collection.find({"_id": {"$in": [name for name, _, _ in places]}}, {"queue": 1})
        return {
            entry["t"]
            for doc in await cursor.to_list(None)
            if isinstance(doc.get("queue"), list)
            for entry in doc["queue"]
            if isinstance(entry, Mapping) and entry.get("t") in tokens
        }

    # -- reads ------------------------------------------------------------------------------------

    async def is_held(self, name: str, owner: str | None = None, *, permits: Permits | None = None) -> bool:
        """Whether anyone (or ``owner``) holds a live lease on ``name``, on the server's clock, as a
        majority of the replica set knows it (read concern ``majority``, as every read here).

        With ``permits``: whether ``owner`` holds a live permit, or without ``owner``, whether the
        live holders leave no room for a permit of this weight (as ``asyncio.Semaphore.locked``)."""
        if permits is None:
            match: dict[str, Any] = {"_id": name, "owner": {"$type": "string"} if owner is None else owner}
            live: Any = _LEASE_LIVE
        else:
            match = {"_id": name, "kind": permits.kind}
            holders = _live_holders(SERVER_NOW)
            if owner is None:
                live = {
                    "$gt": [{"$add": [_weight_of(holders), permits.weight]}, {"$ifNull": ["$limit", permits.limit]}]
                }
            else:
                match["holders.o"] = owner
                live = {"$in": [owner, _holder_tokens(holders)]}
        pipeline = [{"$match": match}, {"$project": {"live": live}}]
        cursor = await _maybe_await(self._majority_reads.aggregate(pipeline))
        return any(doc.get("live") is True for doc in await cursor.to_list(None))

    async def read(self, name: str) -> LockState | None:
        """The document for ``name`` as stored, or None if there is none."""
        doc = await self._majority_reads.find_one({"_id": name})
        return None if doc is None else LockState.from_document(doc)

    async def report(self, names: Iterable[str] | None = None, *, prefix: str | None = None) -> list[LockReport]:
        """Lock documents (all, those named, or those whose name starts with ``prefix``) with their
        remaining lease on the server's clock. A corrupt document is reported with its error."""
        match: dict[str, Any] = {}
        if names is not None:
            match["_id"] = {"$in": list(names)}
        elif prefix:
            match["_id"] = {"$gte": prefix, "$lt": prefix + "\U0010ffff"}
        pipeline = [
            {"$match": match},
            {"$sort": {"_id": 1}},
            {
                "$addFields": {
                    "_serverNow": SERVER_NOW,
                    "_remainingMs": {
                        "$cond": [
                            _LEASE_LIVE,
                            {"$subtract": ["$expiresAt", SERVER_NOW]},
                            None,
                        ]
                    },
                    # A semaphore's live permits: [owner token, milliseconds left] (left as they
                    # are on a corrupt document, whose parsing reports it).
                    "_permitsLeft": {
                        "$cond": [
                            {"$in": ["$kind", list(PERMIT_KINDS)]},
                            {
                                "$map": {
                                    "input": {
                                        "$filter": {
                                            "input": _live_holders(SERVER_NOW),
                                            "cond": {"$eq": [{"$type": "$$this.exp"}, "date"]},
                                        }
                                    },
                                    "in": ["$$this.o", {"$subtract": ["$$this.exp", SERVER_NOW]}],
                                }
                            },
                            [],
                        ]
                    },
                }
            },
        ]
        cursor = await _maybe_await(self._majority_reads.aggregate(pipeline))
        reports = []
        for doc in await cursor.to_list(None):
            remaining = doc.pop("_remainingMs", None)
            permits_left = doc.pop("_permitsLeft", None)
            server_time = doc.pop("_serverNow", None)
            try:
                state = LockState.from_document(doc)
            except LockDataError as error:
                reports.append(LockReport(name=doc.get("_id"), state=None, remaining_ms=None, error=error))
                continue
            if state.limit is not None:
                left = {token: int(ms) for token, ms in permits_left or ()}
                longest = max(left.values(), default=None)
                reports.append(LockReport(state.name, state, longest, permits_left_ms=left, server_time=server_time))
                continue
            remaining_ms = _int_or_none(remaining)
            reports.append(LockReport(state.name, state, remaining_ms, server_time=server_time))
        return reports

    # -- operators --------------------------------------------------------------------------------

    async def force_release(self, name: str, holder: str | None = None) -> ForcedRelease | None:
        """Break whatever lease ``name`` has, whoever owns it; return what was broken.

        On a semaphore, a read-write lock or an election, breaks every live permit and wakes the
        waiters. With ``holder``, breaks only the one live holder it selects: the one whose owner
        token is ``holder``, else the only one whose owner token starts with it (what ``mongolock
        inspect`` shows as ``owner``). The owner tokens of one process's waiting places share their
        start, so a short start can name several permits of one process: that is refused, never
        taken as all of them. On a lock, ``holder`` must select its live owner. When ``holder``
        selects none or several, nothing is broken.

        Without ``holder``, also repairs a document whose lock fields were corrupted (they are reset;
        ``fence`` is kept when it is a valid token, else restarted from the server clock's floor).
        The broken lease is recorded in the document's ``forcedRelease`` field for the record. None
        if there was no live lease (or, with ``holder``, the selected one ended before the write) and
        nothing to repair.

        :raises TypeError: ``holder`` is not a string (before any I/O).
        :raises ValueError: ``holder`` is empty (before any I/O), or several live holders' owner
            tokens start with it; the message lists them.
        :raises LookupError: ``holder`` selects no live holder (the message lists the live ones),
            there is no lock ``name``, or its document is corrupt (break it without ``holder`` to
            repair it).
        """
        if holder is not None:
            if not isinstance(holder, str):
                raise TypeError(f"holder must be a str (an owner token, or its start), not {type(holder).__name__}")
            if not holder:
                raise ValueError("holder must not be empty: it would select every holder (pass None for that)")
        owner: str | None = None
        if holder is not None:
            reports = await self.report([name])
            if not reports:
                raise LookupError(f"no lock named {name!r} in {self.full_name}")
            state = reports[0].state
            if state is None:
                raise LookupError(
                    f"{name!r} is unreadable ({reports[0].error}): break it without a holder to repair it"
                )
            if state.limit is None:
                live = [(state.owner, state.holder)] if state.owner and reports[0].remaining_ms is not None else []
            else:
                live = [(permit.token, permit.holder) for permit in reports[0].live_permits]
            # An exact token always selects its holder, even if another token starts with it.
            matches = [entry for entry in live if entry[0] == holder] or [
                entry for entry in live if entry[0].startswith(holder)
            ]

            def listing(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
                return ", ".join(
                    f"{token} ({who.get('label') or 'unlabelled'}, {who.get('host', '?')} pid {who.get('pid', '?')})"
                    for token, who in entries
                )

            if not matches:
                raise LookupError(
                    f"no live holder of {name!r} has an owner token starting with {holder!r}; "
                    f"its live holders: {listing(live) or 'none'}"
                )
            if len(matches) > 1:
                raise ValueError(
                    f"holder {holder!r} matches {len(matches)} holders of {name!r}: {listing(matches)}; "
                    "give the whole owner token of the one to break"
                )
            owner = matches[0][0]
            if state.limit is not None:
                return await self._force_release_permits(name, owner)
        else:
            current = await self._collection.find_one({"_id": name}, {"kind": 1})
            if current is not None and current.get("kind") in PERMIT_KINDS:
                return await self._force_release_permits(name, None)
        stamp = _stamp()
        broken = "$_break"
        # A job's lease is a lock's (its record stays: a run whose lease was broken shows as lost).
        sane = {"$and": [_LEASE_FIELDS_SANE, {"$or": [_type_in("$kind", "missing", "null"), _JOB_KIND_IS]}]}
        # With a holder: only that owner's lease, and never a corrupt document's "repair".
        selected = {} if owner is None else {"owner": owner, "$expr": sane}
        doc = await self._collection.find_one_and_update(
            {"_id": name, **selected},
            [
                {"$set": {"_break": {"$or": [{"$not": [sane]}, _LEASE_LIVE]}}},
                {
                    "$set": {
                        "forcedRelease": {
                            "$cond": [
                                broken,
                                {
                                    "by": stamp,
                                    "at": SERVER_NOW,
                                    "owner": "$owner",
                                    "holder": "$holder",
                                    "fence": "$fence",
                                },
                                "$forcedRelease",
                            ]
                        },
                        "owner": {"$cond": [broken, None, "$owner"]},
                        "expiresAt": {"$cond": [broken, SERVER_NOW, "$expiresAt"]},
                        "releasedAt": {"$cond": [broken, SERVER_NOW, "$releasedAt"]},
                        "fence": {"$cond": [{"$or": [{"$not": [broken]}, _FENCE_OK]}, "$fence", {"$literal": 0}]},
                        "queue": {"$cond": [{"$or": [{"$not": [broken]}, {"$isArray": "$queue"}]}, "$queue", []]},
                    }
                },
                {"$unset": "_break"},
            ],
            return_document=ReturnDocument.AFTER,
        )
        record = (doc or {}).get("forcedRelease")
        if not isinstance(record, Mapping) or record.get("by") != stamp:
            return None
        owner, holder, fence = record.get("owner"), record.get("holder"), record.get("fence")
        return ForcedRelease(
            name=name,
            owner=owner if isinstance(owner, str) else None,
            holder=holder if isinstance(holder, Mapping) else {},
            fencing_token=fence if isinstance(fence, int) and not isinstance(fence, bool) else None,
        )

    async def _force_release_permits(self, name: str, owner: str | None) -> ForcedRelease | None:
        """Break every live permit of ``name``, or only the one of ``owner`` (a whole owner token)."""
        stamp = _stamp()
        chosen: Any = True
        selected: dict[str, Any] = {}
        if owner is not None:
            chosen = {"$eq": ["$$this.o", {"$literal": owner}]}
            # Only a document that still lists that permit, and never a corrupt one's "repair".
            selected = {"holders.o": owner, "$expr": _permits_sane("$kind")}
        doc = await self._collection.find_one_and_update(
            {"_id": name, "kind": {"$in": list(PERMIT_KINDS)}, **selected},
            [
                {"$set": {"_now": SERVER_NOW, "_sane": _permits_sane("$kind")}},
                {
                    "$set": {
                        # A corrupt document: every permit is broken and the fields are reset.
                        "_broken": {
                            "$cond": [
                                "$_sane",
                                {"$filter": {"input": _LIVE_HOLDERS, "cond": chosen}},
                                _array_or_empty("$holders"),
                            ]
                        }
                    }
                },
                {"$set": {"_break": {"$or": [{"$not": ["$_sane"]}, {"$gt": [{"$size": "$_broken"}, 0]}]}}},
                {
                    "$set": {
                        "forcedRelease": {
                            "$cond": ["$_break", {"by": stamp, "at": _NOW, "permits": "$_broken"}, "$forcedRelease"]
                        },
                        "holders": {
                            "$cond": [
                                "$_sane",
                                {"$filter": {"input": _LIVE_HOLDERS, "cond": {"$not": [chosen]}}},
                                [],
                            ]
                        },
                        "limit": {"$cond": ["$_sane", "$limit", 1]},
                        "fence": {"$cond": [_FENCE_OK, "$fence", {"$literal": 0}]},
                        "queue": _array_or_empty("$queue"),
                        "freed": {"$cond": ["$_break", stamp, "$freed"]},
                        "releasedAt": {"$cond": ["$_break", _NOW, "$releasedAt"]},
                    }
                },
                {"$unset": ["_now", "_sane", "_broken", "_break"]},
            ],
            return_document=ReturnDocument.AFTER,
        )
        record = (doc or {}).get("forcedRelease")
        if not isinstance(record, Mapping) or record.get("by") != stamp:
            return None
        permits = [entry for entry in record.get("permits") or () if isinstance(entry, Mapping)]
        return ForcedRelease(
            name=name,
            owner=None,
            holder={},
            fencing_token=None,
            permits=tuple(
                (str(entry.get("o")), _mapping_or_empty(entry.get("holder")), _int_or_none(entry.get("fence")))
                for entry in permits
            ),
        )

    async def ensure_idle_cleanup_index(self, idle_after: int) -> str:
        """Create (or change) the TTL index that deletes lock documents idle for ``idle_after`` seconds."""
        for index in await (await _maybe_await(self._collection.list_indexes())).to_list(None):
            if index.get("name") == IDLE_CLEANUP_INDEX and index.get("expireAfterSeconds") != idle_after:
                await self._collection.database.command(
                    {
                        "collMod": self._collection.name,
                        "index": {"name": IDLE_CLEANUP_INDEX, "expireAfterSeconds": idle_after},
                    }
                )
        name: str = await self._collection.create_index(
            "expiresAt", expireAfterSeconds=idle_after, name=IDLE_CLEANUP_INDEX
        )
        return name

    # -- wake-ups ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        """A client session, to learn the ``operationTime`` of a request sent in it."""
        session = await _maybe_await(self.client.start_session(causal_consistency=False))
        try:
            yield session
        finally:
            await _maybe_await(session.end_session())

    async def watch(self, *, token_prefix: str, max_await_ms: int, start_at: Any = None) -> Any:
        """Open a change stream of the writes that can end a wait: releases (of a lock, or of a
        semaphore's permit), deletions, and hand-offs to this process's places (whose owner tokens
        start with ``token_prefix``).

        Renewals, claims, queue updates, acquisitions and other processes' hand-offs are filtered
        out on the server, so a hand-off wakes only the process it goes to. Pipeline-style updates
        arrive as ``update`` events listing the changed fields, or as ``replace`` events where the
        server logs full documents (mongodb/mongo jstests/change_streams/pipeline_style_updates.js);
        replacements are all let through. Needs a replica set or a sharded cluster.
        """
        pipeline = [
            {
                "$match": {
                    "$or": [
                        {"operationType": {"$nin": ["insert", "update", "replace"]}},
                        {"operationType": "update", "updateDescription.updatedFields.owner": {"$type": "null"}},
                        # A semaphore's permit freed without a hand-off.
                        {"operationType": "update", "updateDescription.updatedFields.freed": {"$exists": True}},
                        {
                            "operationType": "update",
                            # One token, or (a read-write lock's readers) several separated by spaces.
                            "updateDescription.updatedFields.handedOffTo": {
                                "$regex": f"(^| ){re.escape(token_prefix)}"
                            },
                        },
                        {"operationType": "replace"},
                    ]
                }
            }
        ]
        return await _maybe_await(
            self._collection.watch(pipeline, max_await_time_ms=max_await_ms, start_at_operation_time=start_at)
        )

    async def watch_name(self, name: str, *, max_await_ms: int) -> Any:
        """Open a change stream of every write to ``name``'s document (its observers read the
        document again on each). Needs a replica set or a sharded cluster."""
        pipeline = [{"$match": {"documentKey._id": name}}]
        return await _maybe_await(self._collection.watch(pipeline, max_await_time_ms=max_await_ms))


# -- expressions ----------------------------------------------------------------------------------


def _array_or_empty(field: str) -> dict[str, Any]:
    """The array at ``field``, or an empty one where the document has none (or something else)."""
    return {"$cond": [{"$isArray": field}, field, {"$literal": []}]}


def _type_in(expression: str, *types: str) -> dict[str, Any]:
    return {"$in": [{"$type": expression}, list(types)]}


def _server_plus(start: Any, ttl_ms: Any) -> dict[str, Any]:
    # $add of a date and milliseconds, not $dateAdd: that one is missing from the Stable API (V1)
    # of MongoDB 5.0.0 to 5.0.x before SERVER-60899, so a strict-API client there would be refused.
    return {"$add": [start, ttl_ms]}


def _not_before(moment: Any, now: Any) -> dict[str, Any]:
    """``now``, or ``moment`` (a place's ``at``) if that is a later date.

    A write's ``$$NOW`` is fixed when the server parses the command, also through the retries of
    a write conflict (src/mongo/db/commands/find_and_modify.cpp and write_commands.cpp set the
    runtime constants once per command; a mongos sets them for the shards,
    src/mongo/s/commands/cluster_find_and_modify_cmd.cpp): a release that waited out a conflict can
    be applied after a place's later write with an earlier ``$$NOW``. The waiter counts its lease
    from that write's send time, so a hand-off runs from the place's ``at`` at the earliest.
    """
    return {"$cond": [{"$eq": [{"$type": moment}, "date"]}, {"$max": [moment, now]}, now]}


# A live lease, judged without the pipelines' temporary fields (in reads and single-stage updates).
_LEASE_LIVE: dict[str, Any] = {
    "$and": [
        {"$eq": [{"$type": "$owner"}, "string"]},
        {"$eq": [{"$type": "$expiresAt"}, "date"]},
        {"$gt": ["$expiresAt", SERVER_NOW]},
    ]
}
_FENCE_OK: dict[str, Any] = {
    "$or": [
        _type_in("$fence", "missing", "null"),
        {"$and": [_type_in("$fence", "int", "long"), {"$gte": ["$fence", 0]}, {"$lt": ["$fence", MAX_FENCE]}]},
    ]
}
# The fields a decision depends on have the types this library writes. Expressions on a corrupt
# document would otherwise fail on the server, or worse, succeed with a wrong answer (a date of
# year 9999 would be a lease that never expires).
_LEASE_FIELDS_SANE: dict[str, Any] = {
    "$and": [
        _type_in("$owner", "missing", "null", "string"),
        {
            "$or": [
                {"$and": [_type_in("$expiresAt", "missing", "null"), {"$ne": [{"$type": "$owner"}, "string"]}]},
                {
                    "$and": [
                        {"$eq": [{"$type": "$expiresAt"}, "date"]},
                        {"$lte": ["$expiresAt", _server_plus(SERVER_NOW, _EXPIRY_HORIZON_MS)]},
                    ]
                },
            ]
        },
        _FENCE_OK,
        _type_in("$queue", "missing", "null", "array"),
    ]
}
_SANE: dict[str, Any] = {"$and": [_LEASE_FIELDS_SANE, _type_in("$kind", "missing", "null")]}
"""A lock's document (a job's has the same lease fields: see ``_JOB_SANE``)."""
_LIVE: dict[str, Any] = {"$and": ["$_sane", {"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", _NOW]}]}
_NEXT_FENCE: dict[str, Any] = {
    "$max": [
        {"$add": [{"$toLong": {"$ifNull": ["$fence", 0]}}, 1]},
        {"$multiply": [{"$toLong": _NOW}, 1000]},
    ]
}
# The next fence, only on a sane document: $toLong of a fence edited into NaN, a string, an object or
# a number beyond a long fails the whole request (ExpressionConvert in
# src/mongo/db/pipeline/expression.cpp raises ConversionFailure "... with no onError value"), where
# the caller should get LockDataError for an unchanged document. $cond evaluates only the branch it
# takes (ExpressionCond::evaluate, same file).
_NEXT_FENCE_IF_SANE: dict[str, Any] = {"$cond": ["$_sane", _NEXT_FENCE, None]}


def _live_places(excluding: str | None = None) -> dict[str, Any]:
    """The queue's well-formed, unexpired places, oldest first (optionally without the one whose
    token is at the field path ``excluding``)."""
    conditions: list[Any] = [
        {"$eq": [{"$type": "$$this.t"}, "string"]},
        {"$eq": [{"$type": "$$this.exp"}, "date"]},
        {"$in": [{"$type": "$$this.ttlMs"}, ["int", "long"]]},
        {"$gte": ["$$this.ttlMs", 1]},
        {"$lte": ["$$this.ttlMs", MAX_TTL_MS]},
        {"$gt": ["$$this.exp", _NOW]},
        # A place's weight (a semaphore's or a read-write lock's) is 1 unless it says otherwise.
        # ("null" too: the embedded test server types a missing field of $$this as null.)
        {"$in": [{"$type": "$$this.w"}, ["missing", "null", "int", "long"]]},
    ]
    if excluding is not None:
        conditions.append({"$ne": ["$$this.t", excluding]})
    return {
        "$filter": {
            "input": _array_or_empty("$queue"),
            "cond": {"$and": conditions},
        }
    }


def _without(places: Any, token: str) -> dict[str, Any]:
    """``places`` without the one holding ``token`` (a field path, such as ``$_v.me``)."""
    return {"$filter": {"input": places, "cond": {"$ne": ["$$this.t", token]}}}


def _tokens(places: Any) -> dict[str, Any]:
    return {"$map": {"input": places, "in": "$$this.t"}}


def _new_place(token: str, ttl: str, holder: str, follower: tuple[str, str] | None = None) -> dict[str, Any]:
    """A place written now, from field paths of the request's values (see :func:`_values`)."""
    written: dict[str, Any] = {"t": token, "ttlMs": ttl, "holder": holder, "at": _NOW, "exp": _server_plus(_NOW, ttl)}
    if follower is not None:
        written["n"], written["nttl"] = follower
    return written


def _with_place(places: Any, token: Any, place: dict[str, Any]) -> dict[str, Any]:
    """``places`` with ``place`` (the place of ``token``) rewritten where ``token`` stands (its
    length is the new one's, its ``at`` not moved back), or queued last."""
    return {
        "$cond": [
            {"$in": [token, _tokens(places)]},
            {
                "$map": {
                    "input": places,
                    "in": {
                        "$cond": [
                            {"$eq": ["$$this.t", token]},
                            {"$mergeObjects": [place, {"at": _not_before("$$this.at", _NOW)}]},
                            "$$this",
                        ]
                    },
                }
            },
            {"$concatArrays": [places, [place]]},
        ]
    }


def _follow_up(handee: str) -> dict[str, Any]:
    """The place for the follower recorded in ``handee`` (a place expression), as a 0- or 1-element array."""
    ttl = f"{handee}.nttl"
    well_formed = {
        "$and": [
            {"$eq": [{"$type": f"{handee}.n"}, "string"]},
            {"$in": [{"$type": ttl}, ["int", "long"]]},
            {"$gte": [ttl, 1]},
            {"$lte": [ttl, MAX_TTL_MS]},
        ]
    }
    # The follower's place counts as written when the handee's was (the hand-off's $$NOW can be older).
    place = {
        "t": f"{handee}.n",
        "ttlMs": ttl,
        "holder": f"{handee}.holder",
        "at": _not_before(f"{handee}.at", _NOW),
        "exp": _server_plus(_NOW, ttl),
    }
    return {"$cond": [well_formed, [place], {"$literal": []}]}


# Withdrawn place tokens a document remembers: an attempt of a waiter that gave up, cut off by its
# bound and applied by the server after the withdrawal, must not queue the place again (or take
# the lock for nobody). Tokens are never reused, so remembering the last few is enough.
_WITHDRAWALS_REMEMBERED = 64


def _withdrawn(token: Any) -> dict[str, Any]:
    """Whether ``token``'s place was withdrawn: its owner gave up waiting."""
    return {"$in": [token, _array_or_empty("$withdrawn")]}


def _remember_withdrawals() -> dict[str, Any]:
    """``withdrawn`` with the tokens of a ``leaving`` request added (the last few kept)."""
    earlier = _array_or_empty("$withdrawn")
    return {"$slice": [{"$concatArrays": [earlier, "$_v.leaving"]}, -_WITHDRAWALS_REMEMBERED]}


# Releases of a lock a document remembers at most (see ``LockStore.release``): each is forgotten
# once the lease it ended would have expired, and this bounds the list on a name handed on faster
# than that.
_LOCK_RELEASES_REMEMBERED = 256


def _remember_release() -> dict[str, Any]:
    """``recentReleases`` after a release of the lease (``$owner`` until ``$expiresAt``, as the
    document had them), without the releases whose leases would have expired by now; unchanged
    unless the release ended our live lease (``$_own``)."""
    still_resendable = {
        "$filter": {"input": _array_or_empty("$recentReleases"), "cond": {"$gt": ["$$this.until", _NOW]}}
    }
    remembered = {"$concatArrays": [still_resendable, [{"o": "$owner", "until": "$expiresAt"}]]}
    return {"$cond": ["$_own", {"$slice": [remembered, -_LOCK_RELEASES_REMEMBERED]}, "$recentReleases"]}


def _first_or_null(array: Any) -> dict[str, Any]:
    return {"$ifNull": [{"$first": [array]}, None]}


def _values(**values: Any) -> dict[str, Any]:
    """The first stage of a pipeline: the request's own values, in the temporary field ``_v``.

    Every later stage refers to them as ``$_v.<name>``, so the stages are constants built once per
    shape of request (cached), and a request builds only this one small stage: rebuilding a whole
    pipeline, some hundreds of objects, for each request cost more client CPU than sending it.
    ``$literal`` keeps a value from being read as an expression (a label may start with ``$``).
    """
    return {"$set": {"_v": {"$literal": values}}}


def _acquire_pipeline(place: PlaceRequest, *, enqueue: bool, fair: bool) -> list[dict[str, Any]]:
    values = {"me": place.token, "ttl": place.ttl_ms, "holder": dict(place.holder)}
    if place.follower is not None:
        follower = place.follower
        values.update(next=follower.token, nextTtl=follower.ttl_ms, nextHolder=dict(follower.holder))
    return [_values(**values), *_acquire_stages(enqueue=enqueue, fair=fair, follower=place.follower is not None)]


@functools.cache
def _acquire_stages(*, enqueue: bool, fair: bool, follower: bool) -> tuple[dict[str, Any], ...]:
    me = "$_v.me"
    my_place = _new_place(me, "$_v.ttl", "$_v.holder", ("$_v.next", "$_v.nextTtl") if follower else None)
    my_tokens_index = {"$indexOfArray": [_tokens("$_q"), me]}
    got_it = {"$or": ["$_claim", "$_take"]}
    waiting_queue: Any = _with_place("$_q", me, my_place) if enqueue else "$queue"
    taken_queue: Any = _without("$_q", me)
    if follower:
        follower_place = _new_place("$_v.next", "$_v.nextTtl", "$_v.nextHolder")
        taken_queue = {"$concatArrays": [_without(taken_queue, "$_v.next"), [follower_place]]}
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": _SANE, "_q": _live_places()}},
        {"$set": {"_live": _LIVE, "_mine": {"$eq": ["$owner", me]}, "_gone": _withdrawn(me)}},
        # Places ahead of ours: all live places if we have none yet.
        {
            "$set": {
                "_ahead": {"$cond": [{"$eq": [my_tokens_index, -1]}, {"$size": "$_q"}, my_tokens_index]} if fair else 0
            }
        },
        {
            "$set": {
                "_claim": {"$and": ["$_live", "$_mine", {"$not": ["$_gone"]}]},
                "_take": {"$and": ["$_sane", {"$not": ["$_live"]}, {"$eq": ["$_ahead", 0]}, {"$not": ["$_gone"]}]},
            }
        },
        {
            "$set": {
                "owner": {"$cond": [got_it, me, "$owner"]},
                "expiresAt": {"$cond": [got_it, _server_plus(_NOW, "$_v.ttl"), "$expiresAt"]},
                "fence": {"$cond": ["$_take", _NEXT_FENCE, "$fence"]},
                "ttlMs": {"$cond": [got_it, "$_v.ttl", "$ttlMs"]},
                "holder": {"$cond": [got_it, "$_v.holder", "$holder"]},
                "acquiredAt": {"$cond": ["$_take", _NOW, "$acquiredAt"]},
                "renewedAt": {"$cond": [got_it, _NOW, "$renewedAt"]},
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": [got_it, taken_queue, {"$cond": ["$_gone", "$_q", waiting_queue]}]},
                    ]
                },
            }
        },
        {"$unset": _TEMPORARY},
    )


def _release_pipeline(
    owner: str | None,
    successor: PlaceRequest | None,
    *,
    fair: bool,
    successor_first: bool,
    leaving: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Release ``owner``'s lease and hand it on. With ``leaving`` instead (a process withdrawing its
    places), the places are removed, and the lease is handed on only if it was handed to one of them."""
    values: dict[str, Any] = {"me": owner, "leaving": list(leaving)}
    if successor is not None:
        values.update(successor=successor.token, successorTtl=successor.ttl_ms, successorHolder=dict(successor.holder))
        if successor.follower is not None:
            values.update(next=successor.follower.token, nextTtl=successor.follower.ttl_ms)
    shape = {
        "successor": successor is not None,
        "follower": successor is not None and successor.follower is not None,
        "fair": fair,
        "successor_first": successor_first,
        "leaving": bool(leaving),
    }
    return [_values(**values), *_release_stages(**shape)]


@functools.cache
def _release_stages(
    *, successor: bool, follower: bool, fair: bool, successor_first: bool, leaving: bool
) -> tuple[dict[str, Any], ...]:
    mine = {"$in": ["$owner", "$_v.leaving"]} if leaving else {"$eq": ["$owner", "$_v.me"]}
    # Candidates for the lease: live places (ours removed), with the successor queued last.
    candidates: Any = "$_q"
    handee: Any
    if not successor:
        handee = _first_or_null("$_q")
    else:
        next_place = ("$_v.next", "$_v.nextTtl") if follower else None
        successor_place = _new_place("$_v.successor", "$_v.successorTtl", "$_v.successorHolder", next_place)
        candidates = _with_place("$_q", "$_v.successor", successor_place)
        others = _without("$_q", "$_v.successor")
        if fair:
            handee = _first_or_null(candidates)
        elif successor_first:
            handee = successor_place
        else:
            handee = {"$ifNull": [{"$first": [others]}, successor_place]}
    # The handee leaves the queue; its follower (if any) joins it last.
    remaining = {"$concatArrays": [_without(_without("$_c", "$_h.t"), "$_h.n"), _follow_up("$_h")]}
    live_places: Any = _live_places(excluding="$_v.me")
    if leaving:
        live_places = {"$filter": {"input": live_places, "cond": {"$not": [{"$in": ["$$this.t", "$_v.leaving"]}]}}}
    successor_token = "$_v.successor" if successor else None
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": _SANE, "_q": live_places}},
        {"$set": {"_own": {"$and": [_LIVE, mine]}, "_c": candidates}},
        {"$set": {"_h": {"$cond": ["$_own", handee, None]}}},
        {
            "$set": {
                "_handed": {"$ne": ["$_h", None]},
                "_remote": {"$and": [{"$ne": ["$_h", None]}, {"$ne": ["$_h.t", successor_token]}]},
            }
        },
        {
            "$set": {
                "owner": {"$cond": ["$_own", {"$cond": ["$_handed", "$_h.t", None]}, "$owner"]},
                "expiresAt": {
                    "$cond": [
                        "$_own",
                        {"$cond": ["$_handed", _server_plus(_not_before("$_h.at", _NOW), "$_h.ttlMs"), _NOW]},
                        "$expiresAt",
                    ]
                },
                "fence": {"$cond": ["$_handed", _NEXT_FENCE, "$fence"]},
                "ttlMs": {"$cond": ["$_handed", "$_h.ttlMs", "$ttlMs"]},
                "holder": {"$cond": ["$_handed", "$_h.holder", "$holder"]},
                "acquiredAt": {"$cond": ["$_handed", _NOW, "$acquiredAt"]},
                "renewedAt": {"$cond": ["$_handed", _NOW, "$renewedAt"]},
                "handedOffAt": {"$cond": ["$_remote", _NOW, "$handedOffAt"]},
                # The change stream looks for this field: a new owner token on every hand-off,
                # where two in one millisecond write the same handedOffAt, which a change event
                # then leaves out of updatedFields as unchanged.
                "handedOffTo": {"$cond": ["$_remote", "$_h.t", "$handedOffTo"]},
                "releasedAt": {"$cond": ["$_own", _NOW, "$releasedAt"]},
                "releasedOwner": {"$cond": ["$_own", "$owner", "$releasedOwner"]},
                # A withdrawal passes on a lease handed to a place that gave up: no release of
                # that token is ever sent again.
                "recentReleases": "$recentReleases" if leaving else _remember_release(),
                "withdrawn": {"$cond": ["$_sane", _remember_withdrawals(), "$withdrawn"]} if leaving else "$withdrawn",
                "queue": {"$cond": [{"$not": ["$_sane"]}, "$queue", {"$cond": ["$_own", remaining, "$_q"]}]},
            }
        },
        {"$unset": _TEMPORARY},
    )


def _renewal(ttl_ms: int, stamp: str) -> list[dict[str, Any]]:
    """A new expiry ``ttl_ms`` from now, for a document already matched by name and owner, if its
    lease is still live; else no change at all (so the write does not count as modified)."""
    live = "$_live"
    return [
        {"$set": {"_live": _LEASE_LIVE}},
        {
            "$set": {
                "expiresAt": {"$cond": [live, _server_plus(SERVER_NOW, ttl_ms), "$expiresAt"]},
                "ttlMs": {"$cond": [live, ttl_ms, "$ttlMs"]},
                "renewedAt": {"$cond": [live, SERVER_NOW, "$renewedAt"]},
                "renewal": {"$cond": [live, {"$literal": stamp}, "$renewal"]},
            }
        },
        {"$unset": "_live"},
    ]


def _stamp() -> str:
    return secrets.token_hex(8)


def _renewal_of(name: str, owner: str, ttl_ms: int, stamp: str, permits: Permits | None) -> tuple[dict[str, Any], Any]:
    """The filter and update that renew ``owner``'s live lease on ``name`` (a permit, with ``permits``)."""
    if permits is None:
        return {"_id": name, "owner": owner}, _renewal(ttl_ms, stamp)
    return {"_id": name, "kind": permits.kind, "holders.o": owner}, _permit_renewal(owner, ttl_ms, stamp)


def _permit_renewal(owner: str, ttl_ms: int, stamp: str) -> list[dict[str, Any]]:
    """A new expiry for ``owner``'s permit if it is still live; else no change at all (so the write
    does not count as modified)."""
    live = {"$and": [{"$eq": ["$$this.o", {"$literal": owner}]}, {"$gt": ["$$this.exp", SERVER_NOW]}]}
    renewed = {"exp": _server_plus(SERVER_NOW, ttl_ms), "ttlMs": ttl_ms, "renewedAt": SERVER_NOW, "r": stamp}
    return [
        {
            "$set": {
                "_live": {
                    "$and": [
                        {"$isArray": "$holders"},
                        {"$gt": [{"$size": {"$filter": {"input": "$holders", "cond": live}}}, 0]},
                    ]
                }
            }
        },
        {
            "$set": {
                "holders": {
                    "$cond": [
                        "$_live",
                        {
                            "$map": {
                                "input": "$holders",
                                "in": {"$cond": [live, {"$mergeObjects": ["$$this", renewed]}, "$$this"]},
                            }
                        },
                        "$holders",
                    ]
                }
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_live", _latest_expiry(SERVER_NOW), "$expiresAt"]}}},
        {"$unset": "_live"},
    ]


_KIND_NAMES = {
    "lock": "a lock",
    "semaphore": "a semaphore",
    "rwlock": "a read-write lock",
    "election": "an election",
    JOB_KIND: "a job",
}


def of_kind(state: LockState, permits: Permits | None, *, kind: str | None = None) -> LockState:
    """``state``, if it is of the kind the caller asked for: ``kind``, else a lock without
    ``permits``, else the permits' kind."""
    wanted_kind = kind or ("lock" if permits is None else permits.kind)
    if state.kind != wanted_kind:
        kind, wanted = _KIND_NAMES.get(state.kind, state.kind), _KIND_NAMES[wanted_kind]
        detail = f"says this name is {kind}, not {wanted}"
        raise LockDataError(state.name, "kind", detail, "a name is of one kind: use another name")
    return state


def _refresh_place(token: str, ttl_ms: int) -> list[dict[str, Any]]:
    return [
        {
            "$set": {
                "queue": {
                    "$map": {
                        "input": "$queue",
                        "in": {
                            "$cond": [
                                {"$eq": ["$$this.t", {"$literal": token}]},
                                {
                                    "$mergeObjects": [
                                        "$$this",
                                        {
                                            "exp": _server_plus(SERVER_NOW, ttl_ms),
                                            "at": _not_before("$$this.at", SERVER_NOW),
                                        },
                                    ]
                                },
                                "$$this",
                            ]
                        },
                    }
                }
            }
        }
    ]


# -- jobs ---------------------------------------------------------------------------------------
#
# A job's document is a lock's (owner, expiresAt, fence, ttlMs, holder, ...) with kind "job" and
# the job's record: job: {every, offset, minInterval, maxAttempts (the schedule as last asked for),
# slot and attempts (runs started in that slot), doneSlot (the latest slot a run succeeded in),
# run: {o, slot, attempt, startedAt, holder} (the run holding the lease, or null), last: (the latest
# run that ended, with endedAt, outcome, error: {type, message}), lastEndedAt, seen: {slot, why}
# (the latest decision not to run), finished: [the last owner tokens that finished a run]}.
# A slot is floor((server time in ms - offset) / every): periods of the server's clock, so
# clients' clocks never decide whether a slot is done.

_JOB_KIND_IS: dict[str, Any] = {"$eq": ["$kind", JOB_KIND]}
_JOB_SANE: dict[str, Any] = {
    "$and": [
        _LEASE_FIELDS_SANE,
        {"$or": [_type_in("$kind", "missing", "null"), _JOB_KIND_IS]},
        _type_in("$job", "missing", "null", "object"),
        _type_in("$job.slot", "missing", "null", "int", "long"),
        _type_in("$job.attempts", "missing", "null", "int", "long"),
        _type_in("$job.doneSlot", "missing", "null", "int", "long"),
        _type_in("$job.run", "missing", "null", "object"),
        _type_in("$job.lastEndedAt", "missing", "null", "date"),
    ]
}
"""A job's document, or a lock's (a ``run_once`` of an earlier version kept its job in one)."""
_FINISHED_REMEMBERED = 16
_JOB_TEMPORARY = ["_v", "_now", "_sane", "_j", "_live", "_slot", "_lost", "_attempts", "_lastEnd", "_why", "_take",
                  "_own", "_until", "_keep"]  # fmt: skip


def _job_start_pipeline(owner: str, ttl_ms: int, holder: Mapping[str, Any], schedule: JobSchedule) -> list[Any]:
    values = {
        "me": owner,
        "ttl": ttl_ms,
        "holder": dict(holder),
        "every": schedule.every_ms,
        "offset": schedule.offset_ms,
        "minInterval": schedule.min_interval_ms,
        "maxAttempts": schedule.max_attempts,
    }
    return [_values(**values), *_JOB_START_STAGES]


def _if(condition: Any, then: Any, otherwise: Any) -> dict[str, Any]:
    return {"$cond": [condition, then, otherwise]}


def _job_start_stages() -> tuple[dict[str, Any], ...]:
    slot = {
        "$toLong": {"$floor": {"$divide": [{"$subtract": [{"$toLong": _NOW}, "$_v.offset"]}, "$_v.every"]}}
    }
    has_run = {"$eq": [{"$type": "$_j.run"}, "object"]}
    slotted = {"$ne": ["$_slot", None]}
    too_soon = {
        "$and": [
            {"$ne": ["$_v.minInterval", None]},
            {"$eq": [{"$type": "$_lastEnd"}, "date"]},
            {"$lt": [_NOW, {"$add": ["$_lastEnd", "$_v.minInterval"]}]},
        ]
    }
    why = _if(
        {"$not": ["$_sane"]},
        "corrupt",
        _if(
            "$_live",
            _if(has_run, "running", "held"),
            _if(
                {"$and": [slotted, {"$eq": ["$_j.doneSlot", "$_slot"]}]},
                "done",
                _if(
                    {"$and": [slotted, {"$gte": ["$_attempts", "$_v.maxAttempts"]}]},
                    "failed",
                    _if(too_soon, "too_soon", None),
                ),
            ),
        ),
    )
    attempt = {"$add": ["$_attempts", 1]}
    run = {"o": "$_v.me", "slot": "$_slot", "attempt": attempt, "startedAt": _NOW, "holder": "$_v.holder"}
    record = {
        "$mergeObjects": [
            "$_j",
            {
                "every": "$_v.every",
                "offset": "$_v.offset",
                "minInterval": "$_v.minInterval",
                "maxAttempts": "$_v.maxAttempts",
                "slot": _if("$_take", "$_slot", "$_j.slot"),
                "attempts": _if("$_take", attempt, "$_j.attempts"),
                "run": _if("$_take", run, _if("$_lost", None, "$_j.run")),
                "last": _if(
                    "$_lost", {"$mergeObjects": ["$_j.run", {"endedAt": "$expiresAt", "outcome": "lost"}]}, "$_j.last"
                ),
                "lastEndedAt": "$_lastEnd",
                "seen": _if("$_take", "$_j.seen", {"slot": "$_slot", "why": "$_why"}),
            },
        ]
    }
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": _JOB_SANE, "_j": {"$cond": [{"$eq": [{"$type": "$job"}, "object"]}, "$job", {}]}}},
        {
            "$set": {
                "_live": {"$and": ["$_sane", {"$eq": [{"$type": "$owner"}, "string"]}, {"$gt": ["$expiresAt", _NOW]}]},
                "_slot": _if({"$eq": ["$_v.every", None]}, None, slot),
            }
        },
        {
            "$set": {
                "_lost": {"$and": ["$_sane", {"$not": ["$_live"]}, has_run]},
                "_attempts": _if({"$eq": ["$_j.slot", "$_slot"]}, {"$ifNull": ["$_j.attempts", 0]}, 0),
            }
        },
        # A run lost with its lease ended when the lease expired: that counts for min_interval.
        {"$set": {"_lastEnd": _if("$_lost", {"$max": ["$_j.lastEndedAt", "$expiresAt"]}, "$_j.lastEndedAt")}},
        {"$set": {"_why": why}},
        {"$set": {"_take": {"$and": ["$_sane", {"$eq": ["$_why", None]}]}}},
        {
            "$set": {
                "kind": _if("$_take", JOB_KIND, "$kind"),
                "owner": _if("$_take", "$_v.me", "$owner"),
                "expiresAt": _if("$_take", _server_plus(_NOW, "$_v.ttl"), "$expiresAt"),
                "fence": _if("$_take", _NEXT_FENCE, "$fence"),
                "ttlMs": _if("$_take", "$_v.ttl", "$ttlMs"),
                "holder": _if("$_take", "$_v.holder", "$holder"),
                "acquiredAt": _if("$_take", _NOW, "$acquiredAt"),
                "renewedAt": _if("$_take", _NOW, "$renewedAt"),
                # A lock's document (a run_once of an earlier version) gets a record only when taken.
                "job": _if({"$and": ["$_sane", {"$or": ["$_take", _JOB_KIND_IS]}]}, record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_START_STAGES = _job_start_stages()


def _job_finish_pipeline(
    owner: str, outcome: str, error: Mapping[str, str] | None, hold_at_least_ms: int | None
) -> list[Any]:
    error_record = None if error is None else dict(error)
    values = {"me": owner, "outcome": outcome, "error": error_record, "hold": hold_at_least_ms}
    return [_values(**values), *_JOB_FINISH_STAGES]


def _job_finish_stages() -> tuple[dict[str, Any], ...]:
    released = {"$and": ["$_own", {"$not": ["$_keep"]}]}
    succeeded_in_a_slot = {
        "$and": [{"$eq": ["$_v.outcome", "succeeded"]}, {"$ne": [{"$ifNull": ["$_j.run.slot", None]}, None]}]
    }
    record = {
        "$mergeObjects": [
            "$_j",
            {
                "run": None,
                "last": {
                    "$mergeObjects": ["$_j.run", {"endedAt": _NOW, "outcome": "$_v.outcome", "error": "$_v.error"}]
                },
                "lastEndedAt": _NOW,
                "doneSlot": _if(succeeded_in_a_slot, "$_j.run.slot", "$_j.doneSlot"),
                "finished": {
                    "$slice": [
                        {"$concatArrays": [_array_or_empty("$_j.finished"), ["$_v.me"]]},
                        -_FINISHED_REMEMBERED,
                    ]
                },
            },
        ]
    }
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": {"$and": [_JOB_SANE, _JOB_KIND_IS]}, "_j": "$job"}},
        {
            "$set": {
                "_own": {
                    "$and": [
                        "$_sane",
                        {"$eq": ["$owner", "$_v.me"]},
                        {"$gt": ["$expiresAt", _NOW]},
                        {"$eq": ["$_j.run.o", "$_v.me"]},
                    ]
                }
            }
        },
        {"$set": {"_until": _if({"$eq": ["$_v.hold", None]}, None, {"$add": ["$_j.run.startedAt", "$_v.hold"]})}},
        {"$set": {"_keep": {"$and": ["$_own", {"$eq": [{"$type": "$_until"}, "date"]}, {"$gt": ["$_until", _NOW]}]}}},
        {
            "$set": {
                "owner": _if(released, None, "$owner"),
                "expiresAt": _if("$_own", _if("$_keep", "$_until", _NOW), "$expiresAt"),
                "releasedAt": _if(released, _NOW, "$releasedAt"),
                "releasedOwner": _if(released, "$_v.me", "$releasedOwner"),
                "job": _if("$_own", record, "$job"),
            }
        },
        {"$unset": _JOB_TEMPORARY},
    )


_JOB_FINISH_STAGES = _job_finish_stages()


def oldest_wire_version(servers: Iterable[Any]) -> int | None:
    """The lowest maximum wire version among the servers that take writes (a replica set's primary,
    every mongos, a standalone), from the driver's server descriptions; None if none is known."""
    versions = [server.max_wire_version for server in servers if server.server_type in _WRITABLE]
    return min(versions, default=None)


def _mapping_or_empty(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def _maybe_await(value: Any) -> Any:
    # PyMongo's async API returns coroutines where Motor returns cursors or sessions directly.
    if hasattr(value, "__await__"):
        return await value
    return value


NO_SERVER_WARNING_AFTER = 2.0
"""Seconds a request may wait for a server before a warning says so (no silent waits)."""


def _what_the_servers_ran_into(client: Any) -> str | None:
    """The cause of the last error the driver's monitoring recorded for any server, if any."""
    errors = [server.error for server in client.topology_description.server_descriptions().values()]
    seen = [error for error in errors if error is not None]
    return cause_of(*seen) if seen else None


_NO_SERVER_WARNING_INTERVAL = 10.0
_warned_no_server: WeakIdentityMap[Any, list[float]] = WeakIdentityMap()


def _warn_no_server(client: Any, bound: float) -> None:
    # Once per client and outage (every request of an acquire that retries would say it again).
    warned = _warned_no_server.setdefault(client, lambda: [-_NO_SERVER_WARNING_INTERVAL])
    now = time.monotonic()
    if now - warned[0] < _NO_SERVER_WARNING_INTERVAL:
        return
    warned[0] = now
    servers = client.topology_description.server_descriptions()
    # An SRV URI's host has no port until its lookup succeeds.
    hosts = ", ".join(host if port is None else f"{host}:{port}" for host, port in servers)
    cause = _what_the_servers_ran_into(client)
    seen = f": {cause}" if cause else ""
    waits = min(bound, client.options.server_selection_timeout)
    logger.warning(
        "no MongoDB server to write to has answered at %s for %.0f s%s; waiting up to %.0f s more",
        hosts or "the URI's hosts",
        NO_SERVER_WARNING_AFTER,
        seen,
        waits - NO_SERVER_WARNING_AFTER,
    )


_WRITABLE_OR_BALANCED = (*_WRITABLE, SERVER_TYPE.LoadBalancer)
_last_seen: WeakIdentityMap[Any, list[Any]] = WeakIdentityMap()


def _writable_server_known(client: Any) -> bool:
    """Whether the client's monitoring knows a server it can write to (cached per description: the
    driver replaces the immutable description object whenever something changes)."""
    description = client.topology_description
    seen = _last_seen.setdefault(client, lambda: [None, False])
    if seen[0] is not description:
        servers = description.server_descriptions().values()
        seen[:] = [description, any(server.server_type in _WRITABLE_OR_BALANCED for server in servers)]
    return bool(seen[1])


def is_transient(error: PyMongoError) -> bool:
    """Whether ``error`` may pass when the request is sent again: network errors and timeouts,
    server selection, elections (NotWritablePrimary and kin), write-concern waits, and what the
    server labels retryable; not configuration that retrying cannot fix (a TLS certificate that
    does not verify, a missing client certificate, rejected credentials)."""
    return (
        isinstance(error, ConnectionFailure | WriteConcernError | ExecutionTimeout)
        or bool(getattr(error, "timeout", False))
        or error.has_error_label("RetryableWriteError")
    ) and not retrying_cannot_fix(error)


# -- semaphores and read-write locks -------------------------------------------------------------
#
# One document per name: {_id, kind: "semaphore" | "rwlock" | "election", limit, fence, expiresAt,
# holders: [{o: <token>, w: <weight>, exp, fence, ttlMs, holder, at, renewedAt, r}],
# queue: [places, as a lock's, with their weight w], handedOffTo: "<token> <token> ...", handedOffAt, freed,
# releasedAt, releasedOwners, withdrawn}. Holders' weights add up to at most ``limit``: a
# semaphore's permits weigh 1; a read-write lock's readers 1 and a writer the whole limit. Each
# holder has its own fencing token, from the document's one counter. A release hands the weight it
# frees to the longest run of the oldest places that fits, in the same write. An election is a
# semaphore of one permit whose candidates are always served in turn.

_HOLDER_WELL_FORMED: dict[str, Any] = {
    "$and": [
        {"$eq": [{"$type": "$$this.o"}, "string"]},
        {"$eq": [{"$type": "$$this.exp"}, "date"]},
        {"$lte": ["$$this.exp", _server_plus(SERVER_NOW, _EXPIRY_HORIZON_MS)]},
        _type_in("$$this.fence", "int", "long"),
        {"$gte": ["$$this.fence", 0]},
        {"$lt": ["$$this.fence", MAX_FENCE]},
        {
            "$or": [
                _type_in("$$this.w", "missing", "null"),
                {
                    "$and": [
                        _type_in("$$this.w", "int", "long"),
                        {"$gte": ["$$this.w", 1]},
                        {"$lte": ["$$this.w", MAX_PERMITS]},
                    ]
                },
            ]
        },
    ]
}


def _permits_sane(kind: Any) -> dict[str, Any]:
    """A document of ``kind`` with the fields its decisions read in the shapes written here, or a
    new document (the upsert's bare _id). A document of another kind, or one edited into another
    shape, is left as it is, and the caller raises LockDataError from LockState parsing."""
    return {
        "$or": [
            {
                "$and": [
                    _type_in("$kind", "missing"),
                    _type_in("$owner", "missing"),
                    _type_in("$fence", "missing"),
                    _type_in("$holders", "missing"),
                ]
            },
            {
                "$and": [
                    {"$eq": ["$kind", kind]},
                    _type_in("$limit", "int", "long"),
                    {"$gte": ["$limit", 1]},
                    {"$lte": ["$limit", MAX_PERMITS]},
                    _type_in("$owner", "missing", "null"),
                    _FENCE_OK,
                    _type_in("$queue", "missing", "null", "array"),
                    {"$isArray": "$holders"},
                    {
                        "$eq": [
                            {"$size": {"$filter": {"input": "$holders", "cond": {"$not": [_HOLDER_WELL_FORMED]}}}},
                            0,
                        ]
                    },
                ]
            },
        ]
    }


def _live_holders(now: Any) -> dict[str, Any]:
    """The holders whose permits have not expired at ``now``."""
    return {
        "$filter": {
            "input": _array_or_empty("$holders"),
            "cond": {"$gt": ["$$this.exp", now]},
        }
    }


_LIVE_HOLDERS = _live_holders(_NOW)


def _weight(entry: str) -> dict[str, Any]:
    """The weight of a holder or place (``$$this``, say): 1 unless it says otherwise."""
    return {"$ifNull": [f"{entry}.w", 1]}


def _weight_of(holders: Any) -> dict[str, Any]:
    return {"$sum": {"$map": {"input": holders, "in": _weight("$$this")}}}


def _latest_expiry(now: Any) -> dict[str, Any]:
    """``expiresAt`` of the document: its latest permit's expiry, or ``now`` (what the idle cleanup
    index counts from)."""
    return {"$max": [now, {"$max": {"$map": {"input": "$holders", "in": "$$this.exp"}}}]}


def _holder_tokens(holders: Any) -> dict[str, Any]:
    return {"$map": {"input": holders, "in": "$$this.o"}}


def _new_permit(token: Any, ttl: Any, holder: Any, fence: Any, weight: Any, start: Any = _NOW) -> dict[str, Any]:
    return {
        "o": token,
        "w": weight,
        "exp": _server_plus(start, ttl),
        "fence": fence,
        "ttlMs": ttl,
        "holder": holder,
        "at": _NOW,
        "renewedAt": _NOW,
    }


def _permit_values(place: PlaceRequest, permits: Permits) -> dict[str, Any]:
    return {
        "me": place.token,
        "ttl": place.ttl_ms,
        "holder": dict(place.holder),
        "limit": permits.limit,
        "weight": permits.weight,
        "kind": permits.kind,
    }


def semaphore_acquire_pipeline(
    place: PlaceRequest, permits: Permits, *, enqueue: bool, fair: bool
) -> list[dict[str, Any]]:
    """The acquire of a permit (a semaphore's or a read-write lock's): see ``_semaphore_acquire_stages``."""
    return [_values(**_permit_values(place, permits)), *_semaphore_acquire_stages(enqueue=enqueue, fair=fair)]


@functools.cache
def _semaphore_acquire_stages(*, enqueue: bool, fair: bool) -> tuple[dict[str, Any], ...]:
    """Drop expired holders; claim a permit already handed to ``me``, or take one when the live
    holders' weights leave room for ours under the request's ``limit`` (and, with ``fair``, no
    older place waits); else queue."""
    me = "$_v.me"
    my_place = {**_new_place(me, "$_v.ttl", "$_v.holder"), "w": "$_v.weight"}
    my_tokens_index = {"$indexOfArray": [_tokens("$_q"), me]}
    waiting_queue: Any = _with_place("$_q", me, my_place) if enqueue else "$queue"
    renewed_mine = {
        "$map": {
            "input": "$_hs",
            "in": {
                "$cond": [
                    {"$eq": ["$$this.o", me]},
                    {
                        "$mergeObjects": [
                            "$$this",
                            {"exp": _server_plus(_NOW, "$_v.ttl"), "ttlMs": "$_v.ttl", "renewedAt": _NOW},
                        ]
                    },
                    "$$this",
                ]
            },
        }
    }
    new_permit = _new_permit(me, "$_v.ttl", "$_v.holder", "$_nf", "$_v.weight")
    got_it = {"$or": ["$_claim", "$_take"]}
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": _permits_sane("$_v.kind")}},
        {"$set": {"_q": _live_places(), "_hs": {"$cond": ["$_sane", _LIVE_HOLDERS, []]}}},
        {
            "$set": {
                "_mine": {"$in": [me, _holder_tokens("$_hs")]},
                "_gone": _withdrawn(me),
                "_ahead": {"$cond": [{"$eq": [my_tokens_index, -1]}, {"$size": "$_q"}, my_tokens_index]} if fair else 0,
                "_nf": _NEXT_FENCE_IF_SANE,
                "_room": {"$lte": [{"$add": [_weight_of("$_hs"), "$_v.weight"]}, "$_v.limit"]},
            }
        },
        {
            "$set": {
                "_claim": {"$and": ["$_sane", "$_mine", {"$not": ["$_gone"]}]},
                "_take": {
                    "$and": ["$_sane", {"$not": ["$_mine"]}, {"$not": ["$_gone"]}, "$_room", {"$eq": ["$_ahead", 0]}]
                },
            }
        },
        {
            "$set": {
                "kind": {"$cond": ["$_sane", "$_v.kind", "$kind"]},
                "limit": {"$cond": ["$_sane", "$_v.limit", "$limit"]},
                "fence": {"$cond": ["$_take", "$_nf", "$fence"]},
                "holders": {
                    "$cond": [
                        "$_claim",
                        renewed_mine,
                        {
                            "$cond": [
                                "$_take",
                                {"$concatArrays": ["$_hs", [new_permit]]},
                                {"$cond": ["$_sane", "$_hs", "$holders"]},
                            ]
                        },
                    ]
                },
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": [got_it, _without("$_q", me), {"$cond": ["$_gone", "$_q", waiting_queue]}]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_sane", _latest_expiry(_NOW), "$expiresAt"]}}},
        {"$unset": _TEMPORARY},
    )


def semaphore_release_pipeline(
    owner: str | None,
    successor: PlaceRequest | None,
    permits: Permits,
    *,
    fair: bool,
    successor_first: bool,
    leaving: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Return ``owner``'s permit and hand the weight it frees on, as ``_release_pipeline`` does a
    lock's lease; with ``leaving``, withdraw those places, and hand on a permit handed to one of
    them meanwhile."""
    values: dict[str, Any] = {"me": owner, "leaving": list(leaving), "stamp": _stamp(), "kind": permits.kind}
    if successor is not None:
        values.update(
            successor=successor.token,
            successorTtl=successor.ttl_ms,
            successorHolder=dict(successor.holder),
            successorWeight=successor.weight,
        )
    shape = {"successor": successor is not None, "fair": fair, "successor_first": successor_first}
    return [_values(**values), *_semaphore_release_stages(**shape, leaving=bool(leaving))]


# Released owner tokens a document remembers, so that a release sent again after a lost reply
# recognises its own success among the releases of other holders meanwhile.
_RELEASES_REMEMBERED = 64


# A release's server work must grow linearly with the places queued (a read-write lock's writer
# hands the lock to every reader queued before the next writer, up to MAX_PERMITS of them), so
# nothing below grows a string or an array inside $reduce: $concat and $concatArrays copy their
# inputs (ExpressionConcat/ExpressionConcatArrays::evaluate build a new value each time,
# src/mongo/db/pipeline/expression.cpp), which there made the work quadratic in the places.

# Tokens joined per run in a round of ``_joined``, and its rounds: _JOIN_RUN ** _JOIN_ROUNDS >
# MAX_PERMITS, the most places one release can hand to (each weighs at least 1).
_JOIN_RUN = 22
_JOIN_ROUNDS = math.ceil(math.log(MAX_PERMITS + 1, _JOIN_RUN))


def _joined(tokens: Any) -> dict[str, Any]:
    """``tokens`` in one string, separated by spaces. Each round joins every run of ``_JOIN_RUN``
    neighbours into one string, so a token is copied at most ``_JOIN_RUN`` times per round and
    ``_JOIN_ROUNDS`` rounds make one string: work linear in the tokens, where appending each to
    one growing string copied every earlier one again."""
    joined: Any = "$$t"
    for _ in range(_JOIN_ROUNDS):
        run = {
            "$reduce": {
                "input": {"$slice": ["$$a", "$$i", _JOIN_RUN]},
                "initialValue": "",
                "in": {"$cond": [{"$eq": ["$$value", ""]}, "$$this", {"$concat": ["$$value", " ", "$$this"]}]},
            }
        }
        runs = {"$map": {"input": {"$range": [0, {"$size": "$$a"}, _JOIN_RUN]}, "as": "i", "in": run}}
        joined = {"$let": {"vars": {"a": joined}, "in": runs}}
    return {"$let": {"vars": {"t": tokens}, "in": {"$ifNull": [{"$first": [joined]}, ""]}}}


def _fitting_count(places: Any, room: Any) -> dict[str, Any]:
    """How many of ``places``, from the first, fit in ``room`` together (the longest such run).
    Only numbers are carried from one place to the next."""
    fits = {"$and": ["$$value.open", {"$lte": [_weight("$$this"), "$$value.left"]}]}
    run = {
        "$reduce": {
            "input": places,
            "initialValue": {"left": room, "n": 0, "open": True},
            "in": {
                "$cond": [
                    fits,
                    {
                        "left": {"$subtract": ["$$value.left", _weight("$$this")]},
                        "n": {"$add": ["$$value.n", 1]},
                        "open": True,
                    },
                    {"left": "$$value.left", "n": "$$value.n", "open": False},
                ]
            },
        }
    }
    return {"$let": {"vars": {"run": run}, "in": "$$run.n"}}


def _position_in_order(index: Any, successor_at: Any, size: Any, *, successor_first: bool) -> dict[str, Any]:
    """Where the candidate at ``index`` of ``_c`` stands in the order of hand-offs, which moves the
    successor (at ``successor_at`` in ``_c``, or -1) to the front or to the back."""
    moved: Any
    if successor_first:
        moved, before, after = 0, {"$add": [index, 1]}, index
    else:
        moved, before, after = {"$subtract": [size, 1]}, index, {"$subtract": [index, 1]}
    return {
        "$cond": [
            {"$lt": [successor_at, 0]},
            index,
            {
                "$cond": [
                    {"$eq": [index, successor_at]},
                    moved,
                    {"$cond": [{"$lt": [index, successor_at]}, before, after]},
                ]
            },
        ]
    }


@functools.cache
def _semaphore_release_stages(
    *, successor: bool, fair: bool, successor_first: bool, leaving: bool
) -> tuple[dict[str, Any], ...]:
    gone: Any = {"$in": ["$$this.o", "$_v.leaving"]} if leaving else {"$eq": ["$$this.o", "$_v.me"]}
    # Candidates for the freed weight: live places (ours removed), with the successor (a waiting
    # task of this process) rewritten where it stands or queued last; never a token that holds a
    # permit already (the successor's own attempt may have taken one), nor one that held a permit
    # and returned it, or gave up waiting: a release that was delayed past those would hand a
    # permit to nobody, which then stayed idle for its whole TTL.
    candidates: Any = "$_q"
    if successor:
        successor_place = {
            **_new_place("$_v.successor", "$_v.successorTtl", "$_v.successorHolder"),
            "w": "$_v.successorWeight",
        }
        candidates = _with_place("$_q", "$_v.successor", successor_place)
    candidates = {"$filter": {"input": candidates, "cond": {"$not": [{"$in": ["$$this.t", "$_held"]}]}}}
    order: Any = "$_c"
    # Where the successor stands in _c (-1: nowhere, or not moved), for the remaining queue below.
    successor_at: Any = -1
    if successor and not fair:
        mine = {"$filter": {"input": "$_c", "cond": {"$eq": ["$$this.t", "$_v.successor"]}}}
        others = _without("$_c", "$_v.successor")
        order = {"$concatArrays": [mine, others] if successor_first else [others, mine]}
        successor_at = {"$indexOfArray": [_tokens("$_c"), "$_v.successor"]}
    # The queue after the hand-off, in _c's order: the candidates whose place in the hand-off order
    # is past the ones handed (the first _r.k of that order). Where the handed ones are the first of
    # _c too (the successor not moved), a slice; else the rest picked by index.
    size_c = {"$size": "$_c"}
    handed = "$_r.k"
    position = _position_in_order("$$i", "$$m", size_c, successor_first=successor_first)
    picked = {
        "$map": {
            "input": {"$filter": {"input": {"$range": [0, size_c]}, "as": "i", "cond": {"$gte": [position, handed]}}},
            "as": "i",
            "in": {"$arrayElemAt": ["$_c", "$$i"]},
        }
    }
    natural = 0 if successor_first else {"$subtract": [size_c, 1]}
    in_place = {"$or": [{"$lt": ["$$m", 0]}, {"$eq": ["$$m", natural]}]}
    remaining_queue = {
        "$let": {
            "vars": {"m": successor_at},
            "in": {
                "$cond": [
                    {"$eq": [handed, 0]},
                    "$_c",
                    {"$cond": [in_place, {"$slice": ["$_c", handed, {"$max": [size_c, 1]}]}, picked]},
                ]
            },
        }
    }
    live_places: Any = _live_places(excluding="$_v.me")
    if leaving:
        live_places = {"$filter": {"input": live_places, "cond": {"$not": [{"$in": ["$$this.t", "$_v.leaving"]}]}}}
    successor_token = "$_v.successor" if successor else None
    handed_permits = {
        "$map": {
            "input": {"$range": [0, {"$size": "$_hand"}]},
            "as": "i",
            "in": {
                "$let": {
                    "vars": {"h": {"$arrayElemAt": ["$_hand", "$$i"]}},
                    "in": _new_permit(
                        "$$h.t",
                        "$$h.ttlMs",
                        "$$h.holder",
                        {"$add": ["$_nf", "$$i"]},
                        _weight("$$h"),
                        start=_not_before("$$h.at", _NOW),
                    ),
                }
            },
        }
    }
    remote = {"$filter": {"input": _tokens("$_r.hand"), "as": "t", "cond": {"$ne": ["$$t", successor_token]}}}
    room = {"$subtract": ["$limit", _weight_of("$_rest")]}
    fitting = {"$cond": ["$_own", _fitting_count("$$o", room), 0]}
    handed_off = {
        "$let": {
            "vars": {"o": order},
            "in": {"$let": {"vars": {"k": fitting}, "in": {"k": "$$k", "hand": {"$slice": ["$$o", "$$k"]}}}},
        }
    }
    # Served in turn, waiters all queue behind the oldest place; when the weight freed does not fit
    # it (readers leaving before a waiting writer), nobody could come in, and waking every waiting
    # process would only send an attempt from each to the one document, delaying the release that
    # will hand the writer its turn.
    nobody_blocks: Any = {"$eq": [{"$size": "$_c"}, 0]} if fair else True
    return (
        {"$set": {"_now": SERVER_NOW}},
        {"$set": {"_sane": {"$and": [_permits_sane("$_v.kind"), {"$eq": ["$kind", "$_v.kind"]}]}}},
        {
            "$set": {
                "_q": live_places,
                "_hs": {"$cond": ["$_sane", _LIVE_HOLDERS, []]},
                "_nf": _NEXT_FENCE_IF_SANE,
            }
        },
        {
            "$set": {
                "_own": {"$gt": [{"$size": {"$filter": {"input": "$_hs", "cond": gone}}}, 0]},
                "_rest": {"$filter": {"input": "$_hs", "cond": {"$not": [gone]}}},
            }
        },
        {
            "$set": {
                "_held": {
                    "$concatArrays": [
                        _holder_tokens("$_rest"),
                        _array_or_empty("$releasedOwners"),
                        _array_or_empty("$withdrawn"),
                    ]
                }
            }
        },
        {"$set": {"_c": candidates}},
        # The freed weight goes to the oldest places that fit under the stored limit (a lowered
        # limit revokes nobody; the weight above it is not handed on): _r.k of them, _r.hand.
        # (No more stages than needed: each one costs the embedded test server a copy of the
        # whole document, temporaries and all.)
        {"$set": {"_r": handed_off}},
        {"$set": {"_hand": "$_r.hand", "_handed": {"$gt": ["$_r.k", 0]}, "_remote": remote}},
        {
            "$set": {
                "holders": {
                    "$cond": ["$_own", {"$concatArrays": ["$_rest", handed_permits]}, "$holders"],
                },
                "fence": {"$cond": ["$_handed", {"$add": ["$_nf", {"$size": "$_hand"}, -1]}, "$fence"]},
                "handedOffAt": {"$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, _NOW, "$handedOffAt"]},
                # The change stream looks for the tokens of the places handed to, in one string: a
                # change event reports a changed array element by element ("handedOffTo.0"), which a
                # filter on the field would miss; a string is reported whole. Written when another
                # process's place got a permit, naming every place that got one (the releaser's
                # successor too): a process that finds its token alone there takes the document's
                # fence as its permit's, which holds only when one permit was handed.
                "handedOffTo": {
                    "$cond": [{"$gt": [{"$size": "$_remote"}, 0]}, _joined(_tokens("$_hand")), "$handedOffTo"]
                },
                # What the change stream wakes other processes' waiters with: a value new on every
                # release that frees a permit without handing it on, and that a waiter could take.
                "freed": {"$cond": [{"$and": ["$_own", {"$not": ["$_handed"]}, nobody_blocks]}, "$_v.stamp", "$freed"]},
                "releasedAt": {"$cond": ["$_own", _NOW, "$releasedAt"]},
                "withdrawn": {"$cond": ["$_sane", _remember_withdrawals(), "$withdrawn"]} if leaving else "$withdrawn",
                "releasedOwners": {
                    "$cond": [
                        {"$and": ["$_own", not leaving]},
                        {
                            "$slice": [
                                {"$concatArrays": [{"$ifNull": ["$releasedOwners", []]}, ["$_v.me"]]},
                                -_RELEASES_REMEMBERED,
                            ]
                        },
                        "$releasedOwners",
                    ]
                },
                "queue": {
                    "$cond": [
                        {"$not": ["$_sane"]},
                        "$queue",
                        {"$cond": ["$_own", remaining_queue, "$_q"]},
                    ]
                },
            }
        },
        {"$set": {"expiresAt": {"$cond": ["$_own", _latest_expiry(_NOW), "$expiresAt"]}}},
        {"$unset": _TEMPORARY},
    )
