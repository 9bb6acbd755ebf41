"""``LockStore``: the lock collection, and one method per request the library sends to it.

Each method is thin: it picks the queries of the document's kind (``kinds.queries_for``), sends
them (within ``bound`` seconds when given: see ``send``) and parses the reply (``documents``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, overload

from bson.codec_options import DatetimeConversion
from pymongo import ReadPreference, ReturnDocument, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from .._util.collection_types import AsyncClient, AsyncCollection
from .._util.weak import WeakIdentityMap
from . import jobs, reports, sending, streams, views
from .documents import JOB_KIND, PERMIT_KINDS, Leadership, LockReport, LockState
from .expressions import new_stamp, refresh_place
from .kinds import PermitQueries, of_kind, queries_for
from .requests import Permits, Pipeline, PlaceRequest, Renewal

T = TypeVar("T")

IDLE_CLEANUP_INDEX = "mongolock_idle_cleanup"

_stores: WeakIdentityMap[Any, list[LockStore]] = WeakIdentityMap()


async def _awaited(request: Awaitable[T]) -> T:
    """``request`` (a driver's coroutine, or Motor's future) as a coroutine, which ``send`` drives
    step by step (``run_shielded``)."""
    return await request


def store_for(collection: AsyncCollection, write_concern: WriteConcern) -> LockStore:
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

    Every request method takes ``bound``: the seconds within which it is answered or given up
    (``RequestTimeout``), run to its end whatever happens to its caller (see ``send``). Without
    ``bound`` it is awaited as it is (the command line's reads, tests).
    """

    def __init__(self, collection: AsyncCollection, write_concern: WriteConcern) -> None:
        codec_options = collection.codec_options.with_options(
            document_class=dict, tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
        )
        self._collection = collection.with_options(
            codec_options=codec_options, write_concern=write_concern, read_preference=ReadPreference.PRIMARY
        )
        self._codec_options = codec_options
        self._write_concern_document = write_concern.document
        self.client: AsyncClient = collection.database.client
        self.full_name: str = collection.full_name
        self.write_concern = write_concern
        self.answered_at = 0.0
        """Monotonic time at which a request of this store last got an answer (see ``send``)."""
        self._driver_waits = sending.driver_waits(self.client.options)
        self._server_checked = False

    @functools.cached_property
    def _majority_reads(self) -> Any:
        # What operators and `locked()` are shown: only state a majority has, which no failover
        # rolls back (a deposed primary's, or a write that fails over before it replicates, could be).
        return self._collection.with_options(read_concern=ReadConcern("majority"))

    async def send(
        self,
        request: Coroutine[Any, Any, T],
        *,
        bound: float | None,
        on_cancelled: Callable[[T], Awaitable[None]] | None = None,
    ) -> T:
        """Run one of this store's requests to completion within ``bound`` seconds, whatever happens
        to the caller (see ``run_shielded``); past the bound it raises
        ``RequestTimeout`` (or, while no server is known, ``ServerSelectionTimeoutError``). An
        answer sets ``answered_at``. Without ``bound``, ``request`` is awaited as it is."""
        if bound is None:
            return await request
        result = await sending.send(
            self.client, request, bound=bound, waits=self._driver_waits, on_cancelled=on_cancelled
        )
        self.answered_at = time.monotonic()
        return result

    # -- acquire, release, renew ------------------------------------------------------------------

    async def check_server(self) -> None:
        """Refuse a server older than MongoDB 5.0, once per client, with a clear error."""
        if not self._server_checked:  # most often: the acquires' requests skip a look-up per client
            await sending.check_server(self.client, self.full_name)
            self._server_checked = True

    @overload
    async def try_acquire(
        self,
        name: str,
        owner: str,
        ttl_ms: int,
        holder: Mapping[str, Any],
        *,
        enqueue: bool = ...,
        fair: bool = ...,
        follower: PlaceRequest | None = ...,
        keep_expiry: bool = ...,
        permits: Permits | None = ...,
        operation_time: Literal[False] = ...,
        bound: float | None = ...,
        on_cancelled: Callable[[LockState], Awaitable[None]] | None = ...,
    ) -> LockState: ...

    @overload
    async def try_acquire(
        self,
        name: str,
        owner: str,
        ttl_ms: int,
        holder: Mapping[str, Any],
        *,
        enqueue: bool = ...,
        fair: bool = ...,
        follower: PlaceRequest | None = ...,
        keep_expiry: bool = ...,
        permits: Permits | None = ...,
        operation_time: Literal[True],
        bound: float | None = ...,
        on_cancelled: None = ...,
    ) -> tuple[LockState, Any]: ...

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
        keep_expiry: bool = False,
        permits: Permits | None = None,
        operation_time: bool = False,
        bound: float | None = None,
        on_cancelled: Callable[[Any], Awaitable[None]] | None = None,
    ) -> LockState | tuple[LockState, Any]:
        """Take ``name`` for ``owner`` if it is free or expired; return the document either way.

        One round trip: an upserting ``findAndModify`` whose pipeline decides on the server. If the
        lease was handed to ``owner`` (its place's turn came), this claims it: the expiry restarts
        from now and the fencing token stays the one issued at the hand-off. ``enqueue`` adds (or
        refreshes) ``owner``'s place in the queue when the lock is not taken; ``fair`` refuses a free
        lock while an older place waits. ``follower`` (see ``PlaceRequest``) is queued in the
        same write when the lock is taken, and recorded with the place when it is not.
        ``keep_expiry`` claims without moving the expiry (see ``PlaceRequest.keep_expiry``).
        ``operation_time`` sends it in a session and returns the document with the request's
        ``operationTime`` (where a change stream that must report every later write starts).

        With ``permits``, ``name`` is a semaphore or a read-write lock: ``owner`` takes a permit while
        the holders' weights leave room for it (or claims one handed to it). ``LockDataError`` if the
        document is of another kind.
        """
        place = PlaceRequest(owner, ttl_ms, holder, follower, keep_expiry=keep_expiry)
        pipeline = queries_for(permits).acquire(place, enqueue=enqueue, fair=fair)
        # ``{_id: name}`` alone: MongoDB's find-by-_id path (IDHACK), not a plan (see kinds.py).
        command = sending.find_and_modify_command(
            self._collection.name, self._write_concern_document, {"_id": name}, pipeline, upsert=True
        )

        async def acquire() -> LockState | tuple[LockState, Any]:
            if not self._server_checked:
                await self.check_server()
            if not operation_time:
                doc = await sending.upsert(self._collection, command, self._codec_options)
                return of_kind(LockState.from_reply(doc), permits)
            async with streams.session(self.client) as session:
                doc = await sending.upsert(self._collection, command, self._codec_options, session=session)
                return of_kind(LockState.from_reply(doc), permits), session.operation_time

        return await self.send(acquire(), bound=bound, on_cancelled=on_cancelled)

    async def release(
        self,
        name: str,
        owner: str,
        *,
        successor: PlaceRequest | None = None,
        fair: bool = False,
        successor_first: bool = True,
        permits: Permits | None = None,
        bound: float | None = None,
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
        is forgotten once that expiry has passed, or after a bounded number of later releases of
        the name. Owner tokens are never reused, so only our own release writes it. With
        ``permits``, ``owner``'s permit is returned and handed on the same way (to as many of the
        oldest places as its weight makes room for), and the last released owners are remembered in
        ``releasedOwners``.
        """
        query, pipeline = queries_for(permits).release(
            name, owner, successor, fair=fair, successor_first=successor_first
        )
        command = sending.find_and_modify_command(self._collection.name, self._write_concern_document, query, pipeline)

        async def release() -> LockState | None:
            doc = await sending.find_and_modify(self._collection, command, self._codec_options)
            if doc is None:
                return None
            state = of_kind(LockState.from_reply(doc), permits)
            return None if state.holds(owner) else state  # still ours: it had expired, nothing was released

        return await self.send(release(), bound=bound)

    async def leave(
        self,
        name: str,
        tokens: Sequence[str],
        *,
        fair: bool,
        permits: Permits | None = None,
        bound: float | None = None,
    ) -> None:
        """Withdraw the places holding ``tokens``; if the lease (or, with ``permits``, a permit) was
        handed to one of them meanwhile, hand it on (or release it).

        The tokens are remembered as withdrawn, so that an attempt of theirs the server applies
        later (one cut off by its bound, still on its way) neither queues them again nor takes the
        lock for a waiter that is gone. So this writes even when no place of theirs is there yet,
        and creates the document when there is none yet: the attempt it withdraws may be the one
        that would create it, landing after this.
        """
        pipeline = queries_for(permits).leave(tokens, fair=fair)
        await self.send(self._upsert_once(name, pipeline), bound=bound)

    async def _upsert_once(self, name: str, pipeline: Pipeline) -> None:
        """``update_one`` of ``name``'s document with ``upsert``, sent again when it raced another
        request's upsert of the same new name (a duplicate key on ``_id``: the document is there now)."""
        try:
            await self._collection.update_one({"_id": name}, pipeline, upsert=True)
        except DuplicateKeyError as error:
            if (error.details or {}).get("keyPattern", {"_id": 1}) != {"_id": 1}:
                raise  # another unique index of the user's: not the upsert race
            await self._collection.update_one({"_id": name}, pipeline)

    async def guard_transaction(
        self,
        name: str,
        owner: str,
        fence: int,
        session: Any,
        *,
        permits: Permits | None = None,
        bound: float | None = None,
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
        stamp = new_stamp()
        query, live = queries_for(permits).guard(name, owner, fence)
        doc = await self.send(
            _awaited(
                self._collection.find_one_and_update(
                    query,
                    [{"$set": {"guard": {"$cond": [live, stamp, "$guard"]}}}],
                    projection={"guard": 1},
                    return_document=ReturnDocument.AFTER,
                    session=session,
                )
            ),
            bound=bound,
        )
        return doc is not None and doc.get("guard") == stamp

    async def extend(
        self, name: str, owner: str, ttl_ms: int, *, permits: Permits | None = None, bound: float | None = None
    ) -> bool:
        """Give ``owner``'s live lease (or semaphore permit) a new expiry ``ttl_ms`` from now; False
        if it is not live."""
        update = queries_for(permits).renewal(name, owner, ttl_ms, new_stamp())
        result = await self.send(_awaited(self._collection.update_one(*update)), bound=bound)
        return bool(result.modified_count)

    async def put_candidate_first(
        self, name: str, owner: str, label: str, *, permits: Permits, bound: float | None = None
    ) -> bool:
        """Move the oldest live place labelled ``label`` to the front of ``name``'s queue (an
        election's, or a semaphore's), so that the next hand-off goes to it; only while ``owner``
        holds a permit there. True if such a place is first now (it was moved, or was first already)."""
        query, pipeline = PermitQueries(permits).put_first(name, owner, label)
        doc = await self.send(
            _awaited(
                self._collection.find_one_and_update(
                    query, pipeline, projection={"queue": 1}, return_document=ReturnDocument.AFTER
                )
            ),
            bound=bound,
        )
        if doc is None:
            return False
        state = LockState.from_document({"_id": name, **doc})
        return bool(state.queue) and state.queue[0].holder.get("label") == label

    async def renew(self, leases: Sequence[Renewal], *, bound: float | None = None) -> set[tuple[str, str]]:
        """Renew each live lease among ``leases``; return the ``(name, owner)`` pairs this write
        renewed.

        One request: an unordered batch of single-document updates, each matching its own name and
        owner by equality (the ``_id`` index), so the server's work per lease does not depend on how
        many are sent. Every renewed document is stamped with a value unique to this request; when
        fewer were renewed than sent, the renewed ones are found by that stamp, so a lease is
        confirmed only by the write that renewed it, never by a later read.
        """
        return await self.send(self._renew(leases), bound=bound)

    async def _renew(self, leases: Sequence[Renewal]) -> set[tuple[str, str]]:
        tick = new_stamp()
        requests = [
            UpdateOne(*queries_for(lease.permits).renewal(lease.name, lease.owner, lease.ttl_ms, tick))
            for lease in leases
        ]
        try:
            result = await self._collection.bulk_write(requests, ordered=False)
            renewed = result.modified_count
        except BulkWriteError as error:
            if error.details.get("writeConcernErrors"):
                raise
            renewed = -1  # some statements failed: find out which renewals were applied
        if renewed == len(leases):
            return {(lease.name, lease.owner) for lease in leases}
        # ``$in`` on ``_id`` is answered by the ``_id`` index like an equality (src/mongo/db/query/
        # indexability.h, ``Indexability::nodeCanUseIndexOnOwnField`` lists EQ and MATCH_IN; see
        # kinds.py): one point per name, at most a chunk's, whatever the collection holds.
        query = {"_id": {"$in": [lease.name for lease in leases]}, "$or": [{"renewal": tick}, {"holders.r": tick}]}
        cursor = self._collection.find(query, {"owner": 1, "renewal": 1, "holders": 1})
        confirmed: set[tuple[str, str]] = set()
        for doc in await cursor.to_list(None):
            if doc.get("renewal") == tick and isinstance(doc.get("owner"), str):
                confirmed.add((doc["_id"], doc["owner"]))
            for entry in doc.get("holders") if isinstance(doc.get("holders"), list) else ():
                if isinstance(entry, Mapping) and entry.get("r") == tick and isinstance(entry.get("o"), str):
                    confirmed.add((doc["_id"], entry["o"]))
        return confirmed

    async def refresh_places(
        self, places: Sequence[tuple[str, str, int]], *, bound: float | None = None
    ) -> set[str] | None:
        """Push back the expiry of each queue place ``(name, token, ttl_ms)``.

        One request, like ``renew``. Returns None if every place was there to be refreshed,
        else the tokens of those still there: a place that is gone (expired and pruned, or its turn
        came) is missing, and its waiter must queue again.
        """
        return await self.send(self._refresh_places(places), bound=bound)

    async def _refresh_places(self, places: Sequence[tuple[str, str, int]]) -> set[str] | None:
        requests = [
            UpdateOne({"_id": name, "queue.t": token}, refresh_place(token, ttl_ms)) for name, token, ttl_ms in places
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

    # -- jobs -------------------------------------------------------------------------------------

    async def start_job(
        self,
        name: str,
        owner: str,
        ttl_ms: int,
        holder: Mapping[str, Any],
        schedule: jobs.JobSchedule,
        *,
        bound: float | None = None,
        on_cancelled: Callable[[LockState], Awaitable[None]] | None = None,
    ) -> LockState:
        """Take the lease of the job ``name`` for ``owner`` if the job is due; return its document
        either way (taken: ``owner`` holds it; else ``job.skipped`` says why, as decided now).

        One round trip, an upserting ``findAndModify``: on the server's clock it computes the
        current period of ``schedule`` (its start and end), and takes the lease only if nobody
        holds it, no run that started in the period (or later) succeeded, fewer than its
        ``max_attempts`` runs started in it, and the last run ended at least ``min_interval_ms``
        ago; the run is recorded in the same write. A run whose lease expired unfinished (its
        process died, or lost the lease) is recorded as lost. A free lock's document of the same
        name (a ``run_once`` of an earlier version) becomes the job's; ``LockDataError`` if the
        name is a semaphore's, a read-write lock's or an election's.
        """
        pipeline = jobs.start_pipeline(owner, ttl_ms, holder, schedule)
        command = sending.find_and_modify_command(
            self._collection.name, self._write_concern_document, {"_id": name}, pipeline, upsert=True
        )

        async def start() -> LockState:
            await self.check_server()
            state = LockState.from_document(await sending.upsert(self._collection, command, self._codec_options))
            return state if state.kind == "lock" else of_kind(state, None, kind=JOB_KIND)

        return await self.send(start(), bound=bound, on_cancelled=on_cancelled)

    async def finish_job(
        self,
        name: str,
        owner: str,
        *,
        outcome: str,
        error: Mapping[str, str] | None = None,
        hold_at_least_ms: int | None = None,
        bound: float | None = None,
    ) -> bool:
        """End ``owner``'s run of the job ``name`` and record how it ended (``outcome``, one of
        ``documents.JOB_OUTCOMES``, and for a failure the error's type and message); a success
        marks its period done. The lease ends too, unless ``hold_at_least_ms`` after the run's
        start is still ahead: then it is kept until then (ShedLock's ``lockAtLeastFor``), unrenewed.
        A run that lost its lease reports it with ``outcome="lost"`` and the reason in ``error``:
        recorded while the job's record still shows that run (nobody started another since).

        Returns whether this recorded ``owner``'s run (False: its lease had expired, or was broken,
        or another run started since). A finish sent again after a lost reply recognises its own
        earlier success.
        """
        query = {"_id": name, "$or": [{"owner": owner}, {"job.finished": owner}, {"job.run.o": owner}]}
        pipeline = jobs.finish_pipeline(owner, outcome, error, hold_at_least_ms)
        command = sending.find_and_modify_command(self._collection.name, self._write_concern_document, query, pipeline)
        doc = await self.send(sending.find_and_modify(self._collection, command, self._codec_options), bound=bound)
        if doc is None:
            return False
        job = doc.get("job")
        finished = job.get("finished") if isinstance(job, Mapping) else None
        return isinstance(finished, list) and owner in finished

    # -- reads ------------------------------------------------------------------------------------

    async def is_held(
        self, name: str, owner: str | None = None, *, permits: Permits | None = None, bound: float | None = None
    ) -> bool:
        """Whether anyone (or ``owner``) holds a live lease on ``name``, on the server's clock, as a
        majority of the replica set knows it (read concern ``majority``, as every read here).

        With ``permits``: whether ``owner`` holds a live permit, or without ``owner``, whether the
        live holders leave no room for a permit of this weight (as ``asyncio.Semaphore.locked``)."""
        return await self.send(reports.is_held(self._majority_reads, name, owner, permits), bound=bound)

    async def read(self, name: str, *, bound: float | None = None) -> LockState | None:
        """The document for ``name`` as stored, or None if there is none."""
        return await self.send(reports.read(self._majority_reads, name), bound=bound)

    async def report(
        self, names: Iterable[str] | None = None, *, prefix: str | None = None, bound: float | None = None
    ) -> list[LockReport]:
        """Lock documents (all, those named, or those whose name starts with ``prefix``) with their
        remaining lease on the server's clock. A corrupt document is reported with its error."""
        return await self.send(reports.report(self._majority_reads, names, prefix), bound=bound)

    def iterate_reports(
        self,
        *,
        prefix: str | None = None,
        after: str | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> AsyncGenerator[LockReport, None]:
        """Lock documents as ``report`` reports them, in name order, read a batch at a time
        (see ``reports.iterate``): for listings of any size. Unbounded: the caller stops reading.
        Judged at ``now`` on the server's clock if given (a view that has just read it), else at
        the server's clock read first."""

        async def server_time() -> datetime:
            return now if now is not None else await self.server_time()

        return reports.iterate(self._majority_reads, server_time, prefix, after, limit)

    async def leadership(self, name: str, *, bound: float | None = None) -> Leadership | None:
        """Who leads the election ``name`` now, on the server's clock; None if nobody does.
        ``LockDataError`` if the name is not an election's."""
        return reports.leadership(name, await self.report([name], bound=bound))

    # -- operators --------------------------------------------------------------------------------

    async def force_release(self, name: str, holder: str | None = None) -> reports.ForcedRelease | None:
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
            found = await self.report([name])
            if not found:
                raise LookupError(f"no lock named {name!r} in {self.full_name}")
            owner, of_permits = reports.selected_holder(name, found[0], holder)
            if of_permits:
                return await reports.force_release_permits(self._collection, name, owner)
            return await reports.force_release_lease(self._collection, name, owner)
        current = await self._collection.find_one({"_id": name}, {"kind": 1})
        if current is not None and current.get("kind") in PERMIT_KINDS:
            return await reports.force_release_permits(self._collection, name, None)
        return await reports.force_release_lease(self._collection, name, None)

    async def repair(self, name: str) -> reports.ForcedRelease | None:
        """Reset the lock fields of ``name``'s document if they are corrupt when the write lands
        (as ``force_release`` without ``holder`` does), never breaking a live lease of a sane
        one: a document repaired by someone else meanwhile, and leased again, is left alone.
        What was reset (the corrupt fields, read leniently), or None."""
        current = await self._collection.find_one({"_id": name}, {"kind": 1})
        if current is not None and current.get("kind") in PERMIT_KINDS:
            return await reports.force_release_permits(self._collection, name, None, live=False)
        return await reports.force_release_lease(self._collection, name, None, live=False)

    async def ensure_idle_cleanup_index(self, idle_after: int) -> str:
        """Create (or change) the TTL index that deletes lock documents idle for ``idle_after`` seconds."""
        for index in await (await sending.maybe_await(self._collection.list_indexes())).to_list(None):
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
        async with streams.session(self.client) as session:
            yield session

    async def watch(self, *, token_prefix: str, max_await_ms: int, start_at: Any = None) -> Any:
        """A change stream of the writes that can end a wait (see ``streams.watch``)."""
        return await streams.watch(self._collection, token_prefix=token_prefix, max_await_ms=max_await_ms,
                                   start_at=start_at)  # fmt: skip

    async def watch_name(self, name: str, *, max_await_ms: int) -> Any:
        """A change stream of every write to ``name``'s document (see ``streams.watch_name``)."""
        return await streams.watch_name(self._collection, name, max_await_ms=max_await_ms)

    # -- the operators' live views ----------------------------------------------------------------

    async def collection_exists(self) -> bool:
        """Whether the lock collection exists (see ``views.collection_exists``)."""
        return await views.collection_exists(self._collection)

    async def watch_every_write(self, *, prefix: str, max_await_ms: int) -> Any:
        """An open change stream of every write to the documents whose name starts with ``prefix``,
        each with the document as it is now, majority-committed (see ``views.watch_every_write``)."""
        return await views.watch_every_write(self._majority_reads, prefix=prefix, max_await_ms=max_await_ms)

    async def server_time(self) -> datetime:
        """The server's clock now (see ``views.server_time``)."""
        return await views.server_time(self.client)
