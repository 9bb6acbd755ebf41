"""Every command and query ``mongolock check`` sends to judge a deployment.

The store's rule holds here too: nothing outside the store builds a query. ``store.py`` holds the
locks' own requests, and the check sends those through ``LockStore``; this module holds what only
the check asks: the server's facts (``hello``, ``buildInfo``, its feature compatibility version,
``connectionStatus``), one server's clock (``$$NOW``), the mongos a sharded cluster lists, privilege
attempts that leave nothing written, the collection's health, the raw driver requests the library
is measured against, and the removal of the check's scratch documents.

Every document the check writes has an ``_id`` that starts with its scratch prefix
(``mongolock-check-<random>:``), and is removed by ``remove_scratch``.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bson.codec_options import DatetimeConversion
from pymongo import ReadPreference, UpdateOne
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from .._util.collection_types import AsyncClient
from .expressions import SERVER_NOW, array_or_empty
from .lockstore import LockStore
from .mutex import acquire_pipeline, release_pipeline
from .requests import Pipeline, PlaceRequest
from .sending import DECIDING_FIELDS, maybe_await

SCRATCH_PREFIX = "mongolock-check-"
"""How every scratch lock name of ``mongolock check`` starts (then a random part and ``:``)."""

_UNAUTHORIZED = 13
# Atlas answers some refused actions with its own code and "user is not allowed to do action [...]".
_ATLAS_ERROR = 8000
_MAJORITY = WriteConcern(w="majority")
_DEFAULT_PORT = 27017


def new_scratch_prefix() -> str:
    """A fresh scratch prefix: ``mongolock-check-`` and 12 random hex digits, then ``:``."""
    return f"{SCRATCH_PREFIX}{secrets.token_hex(6)}:"


def _prefix_range(prefix: str) -> dict[str, Any]:
    # Every string that starts with ``prefix``, as an index range on _id (as LockStore.report does).
    return {"$gte": prefix, "$lt": prefix + "\U0010ffff"}


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing an action to this user (not any other failure)."""
    if not isinstance(error, OperationFailure):
        return False
    if error.code == _UNAUTHORIZED:
        return True
    message = str((error.details or {}).get("errmsg", ""))
    return error.code == _ATLAS_ERROR and "not allowed to do action" in message


@dataclass(frozen=True, slots=True)
class ScannedDocuments:
    """What a scan of the lock collection found (the check's own scratch documents left out)."""

    total: int
    """Lock documents in the collection (scratch documents left out), counted on the server."""
    documents: Pipeline
    """Up to the scan's limit, each with ``_size`` (BSON bytes) and ``_expired`` (leases or permits
    past their expiry still stored as held) added by the server."""
    earlier_scratch: int
    """Documents left by an earlier check (their names start with ``mongolock-check-``)."""


class DeploymentProbe:
    """The lock collection ``database.collection`` of ``client``, as ``mongolock check`` reads it.

    ``store`` is the library's own ``LockStore`` on the same collection (majority writes), for the
    requests the check times or tries as the library sends them.
    """

    def __init__(self, client: AsyncClient, database: str, collection: str) -> None:
        self.client = client
        self.database = client[database]
        raw = self.database[collection]
        codec_options = raw.codec_options.with_options(
            tz_aware=True, tzinfo=UTC, datetime_conversion=DatetimeConversion.DATETIME_AUTO
        )
        self.collection = raw.with_options(
            codec_options=codec_options, write_concern=_MAJORITY, read_preference=ReadPreference.PRIMARY
        )
        self.lock_collection = raw
        """The collection as an application passes it to lock handles."""
        self.store = LockStore(raw, _MAJORITY)

    # -- the server ---------------------------------------------------------------------------------

    async def ping(self) -> None:
        """One round trip that the server does nothing for."""
        await self.client.admin.command("ping")

    async def hello(self) -> dict[str, Any]:
        reply: dict[str, Any] = await self.client.admin.command("hello")
        return reply

    async def build_info(self) -> dict[str, Any]:
        reply: dict[str, Any] = await self.client.admin.command("buildInfo")
        return reply

    async def feature_compatibility(self) -> str | None:
        """The feature compatibility version, or None where this user may not read it
        (``getParameter`` needs the cluster's ``getParameter`` action, as ``clusterMonitor`` grants)."""
        try:
            reply = await self.client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
        except OperationFailure as error:
            if is_refusal(error):
                return None
            raise
        version = (reply.get("featureCompatibilityVersion") or {}).get("version")
        return version if isinstance(version, str) else None

    async def authentication(self) -> dict[str, Any]:
        """``connectionStatus`` with ``showPrivileges``: ``authInfo`` with ``authenticatedUsers``,
        ``authenticatedUserRoles`` and ``authenticatedUserPrivileges`` (each privilege a
        ``resource`` and its ``actions``, MongoDB's documented reply). Needs no privilege."""
        reply = await self.client.admin.command("connectionStatus", showPrivileges=True)
        info: dict[str, Any] = reply.get("authInfo") or {}
        return info

    async def server_now(self, client: AsyncClient | None = None) -> datetime:
        """The server's ``$$NOW`` as one read on the lock collection evaluates it (through
        ``client``, default this probe's).

        ``$facet`` emits one document even when the collection is empty or missing, after at most one
        document read (the ``$limit``), and every operator here is in the Stable API's V1 on 5.0, so
        this needs only ``find`` on the lock collection. Through a mongos, ``$$NOW`` is the mongos's:
        it sends its variables to the shards as ``let`` (mongodb/mongo
        src/mongo/db/pipeline/sharded_agg_helpers.cpp, ``genericTransformForShards``)."""
        collection = self.collection if client is None else client[self.database.name][self.collection.name]
        collection = collection.with_options(
            codec_options=self.collection.codec_options, read_preference=ReadPreference.PRIMARY_PREFERRED
        )
        pipeline = [
            {"$limit": 1},
            {"$facet": {"n": [{"$count": "n"}]}},
            {"$project": {"_id": 0, "now": SERVER_NOW}},
        ]
        cursor = await maybe_await(collection.aggregate(pipeline))
        documents = await cursor.to_list(None)
        now = documents[0]["now"] if documents else None
        if not isinstance(now, datetime):
            raise RuntimeError(f"the server answered {documents!r} for $$NOW")
        return now

    async def listed_mongos(self, *, pinged_since: datetime) -> list[str] | None:
        """The mongos a sharded cluster lists as up (``config.mongos``, each ``_id`` its
        ``host:port``, ``ping`` refreshed by each mongos every 30 s), or None where this user may not
        read ``config.mongos`` (``clusterMonitor`` may)."""
        try:
            cursor = self.client["config"]["mongos"].find({"ping": {"$gte": pinged_since}}, {"_id": 1})
            documents = await cursor.to_list(None)
        except OperationFailure as error:
            if is_refusal(error):
                return None
            raise
        return sorted(str(document["_id"]) for document in documents)

    async def listed_as(self, client: AsyncClient) -> str | None:
        """How the mongos that ``client`` reaches lists itself in ``config.mongos``, or None where
        this user may not run ``serverStatus`` (``clusterMonitor`` may).

        A mongos lists itself as ``<its host name>:<its port>`` (``constructInstanceIdString``,
        mongodb/mongo src/mongo/s/sharding_uptime_reporter.cpp), and ``serverStatus`` reports its
        host name, with ``:port`` only off the default port 27017 (``prettyHostName``,
        src/mongo/util/net/socket_utils.cpp; src/mongo/db/commands/server_status.cpp). Behind a
        mapped port (Docker) the address a client uses says nothing of either."""
        try:
            status = await client.admin.command("serverStatus")
        except OperationFailure as error:
            if is_refusal(error):
                return None
            raise
        host = str(status.get("host") or "")
        if not host:
            return None
        return host if ":" in host else f"{host}:{_DEFAULT_PORT}"

    async def read_in_transaction(self) -> None:
        """Read one document inside a transaction and commit it: whether transactions work here."""
        session = await maybe_await(self.client.start_session())
        try:
            await maybe_await(session.start_transaction())
            await self.collection.find_one({}, {"_id": 1}, session=session)
            await session.commit_transaction()
        finally:
            await maybe_await(session.end_session())

    # -- privileges, tried without leaving anything written -------------------------------------------

    async def try_find(self) -> None:
        await self.collection.find_one({"_id": "mongolock-check: nothing"}, {"_id": 1})

    async def try_change_stream(self) -> None:
        pipeline = [{"$match": {"documentKey._id": "mongolock-check: nothing"}}]
        stream = await maybe_await(self.collection.watch(pipeline))
        await stream.close()

    async def try_list_collections(self) -> bool:
        """Whether the lock collection exists (``listCollections`` on its database)."""
        names = await self.database.list_collection_names(filter={"name": self.collection.name})
        return self.collection.name in names

    async def try_list_indexes(self) -> Pipeline:
        """The collection's indexes (``listIndexes``)."""
        cursor = await maybe_await(self.collection.list_indexes())
        indexes: Pipeline = await cursor.to_list(None)
        return indexes

    async def try_create_index(self) -> None:
        """``createIndexes`` of the ``_id`` index, which every collection has: the server checks the
        ``createIndex`` action first, then returns "all indexes already exist" without building
        anything (mongodb/mongo src/mongo/db/commands/create_indexes_cmd.cpp: ``doCheckAuthorization``,
        ``indexesAlreadyExist``). On a missing collection it would create it: call it only on one
        that exists."""
        await self.database.command(
            {"createIndexes": self.collection.name, "indexes": [{"key": {"_id": 1}, "name": "_id_"}]}
        )

    async def try_in_aborted_transaction(self, action: str, name: str) -> None:
        """Send one write of ``action`` ("insert", "update" or "remove") on the scratch lock ``name``
        in a transaction, then abort it: the server checks the action when the command arrives, and
        the abort discards whatever it wrote."""
        session = await maybe_await(self.client.start_session())
        try:
            await maybe_await(session.start_transaction())
            try:
                if action == "insert":
                    await self.collection.insert_one({"_id": name}, session=session)
                elif action == "update":
                    await self.collection.update_one({"_id": name}, {"$set": {"tried": True}}, session=session)
                elif action == "remove":
                    await self.collection.delete_one({"_id": name}, session=session)
                else:
                    raise ValueError(f"no attempt for action {action!r}")
            finally:
                with contextlib.suppress(OperationFailure):  # a refused write may have ended it already
                    await session.abort_transaction()
        finally:
            await maybe_await(session.end_session())

    async def try_update_nothing(self, name: str) -> None:
        """An update of the scratch lock ``name``, which does not exist: checked, matches nothing."""
        await self.collection.update_one({"_id": name}, {"$set": {"tried": True}})

    async def try_remove_nothing(self, prefix: str) -> None:
        """A removal of the scratch documents under ``prefix``; sent before anything was written
        under it, it is checked and removes nothing."""
        await self.collection.delete_many({"_id": _prefix_range(prefix)})

    # -- the collection -------------------------------------------------------------------------------

    async def scan(self, *, limit: int, own_prefix: str) -> ScannedDocuments:
        """Count the collection and read up to ``limit`` documents (the check's scratch documents
        left out), each with its BSON size and how many of its leases are past their expiry on the
        server's clock but still stored as held. Read with read concern majority, as operators'
        reads are."""
        collection = self.collection.with_options(read_concern=ReadConcern("majority"))
        not_scratch = {"_id": {"$not": re.compile(f"^{re.escape(SCRATCH_PREFIX)}")}}
        earlier_scratch = await collection.count_documents({"_id": re.compile(f"^{re.escape(SCRATCH_PREFIX)}")})
        total = await collection.count_documents({})
        holder_expired = {
            "$and": [{"$eq": [{"$type": "$$this.exp"}, "date"]}, {"$lte": ["$$this.exp", SERVER_NOW]}]
        }
        pipeline = [
            {"$match": not_scratch},
            {"$limit": limit},
            {
                "$addFields": {
                    "_size": {"$bsonSize": "$$ROOT"},
                    "_expired": {
                        "$add": [
                            {
                                "$cond": [
                                    {
                                        "$and": [
                                            {"$eq": [{"$type": "$owner"}, "string"]},
                                            {"$eq": [{"$type": "$expiresAt"}, "date"]},
                                            {"$lte": ["$expiresAt", SERVER_NOW]},
                                        ]
                                    },
                                    1,
                                    0,
                                ]
                            },
                            {"$size": {"$filter": {"input": array_or_empty("$holders"), "cond": holder_expired}}},
                        ]
                    },
                }
            },
        ]
        cursor = await maybe_await(collection.aggregate(pipeline))
        documents: Pipeline = await cursor.to_list(None)
        own = await collection.count_documents({"_id": _prefix_range(own_prefix)})
        return ScannedDocuments(total - earlier_scratch, documents, earlier_scratch - own)

    async def scratch_count(self, prefix: str) -> int:
        """Documents under the scratch ``prefix`` (read from the primary)."""
        count: int = await self.collection.count_documents({"_id": _prefix_range(prefix)})
        return count

    async def remove_scratch(self, prefix: str) -> int:
        """Remove every document under the scratch ``prefix``; how many there were."""
        result = await self.collection.delete_many({"_id": _prefix_range(prefix)})
        return int(result.deleted_count)

    # -- raw driver requests, what the library is measured against --------------------------------

    async def raw_acquire_release(self, name: str, holder: Mapping[str, Any], ttl_ms: int) -> None:
        """The two requests an uncontended ``async with lock:`` sends (an acquire that would queue a
        place if the lock were held, and a release), built by the store's own pipeline builders and
        sent straight through ``Database.command``: the library's cost without the library."""
        owner = secrets.token_hex(16)
        common = {"fields": DECIDING_FIELDS, "new": True, "writeConcern": _MAJORITY.document}
        await self.database.command(
            {
                "findAndModify": self.collection.name,
                "query": {"_id": name},
                "update": acquire_pipeline(PlaceRequest(owner, ttl_ms, holder), enqueue=True, fair=False),
                "upsert": True,
                **common,
            }
        )
        await self.database.command(
            {
                "findAndModify": self.collection.name,
                "query": {"_id": name, "$or": [{"owner": owner}, {"releasedOwner": owner}]},
                "update": release_pipeline(owner, None, fair=False, successor_first=True),
                **common,
            }
        )

    async def raw_touch(self, name: str) -> None:
        """A plain majority write of the scratch document ``name``: the least a write that wakes a
        change stream can be."""
        await self.collection.update_one({"_id": name}, [{"$set": {"touchedAt": SERVER_NOW}}], upsert=True)

    async def raw_renew(self, leases: Sequence[tuple[str, str, int]]) -> int:
        """One unordered batch of plain single-document updates that push back the expiry of each
        ``(name, owner, ttl_ms)``: the least a renewal of those leases can cost. How many matched."""
        requests = [
            UpdateOne({"_id": name, "owner": owner}, [{"$set": {"expiresAt": {"$add": [SERVER_NOW, ttl_ms]}}}])
            for name, owner, ttl_ms in leases
        ]
        result = await self.collection.bulk_write(requests, ordered=False)
        return int(result.matched_count)

    @contextlib.asynccontextmanager
    async def watching(self, name: str, client: AsyncClient, *, max_await_ms: int = 200) -> AsyncIterator[Any]:
        """A change stream of every write to ``name`` through ``client`` (another client than this
        probe's: its own connections), closed on the way out."""
        store = LockStore(client[self.database.name][self.collection.name], _MAJORITY)
        stream = await store.watch_name(name, max_await_ms=max_await_ms)
        try:
            yield stream
        finally:
            await stream.close()
