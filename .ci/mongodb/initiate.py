"""Initiate the MongoDB deployments of replica-set.yml or sharded.yml once their containers run.

    python .ci/mongodb/initiate.py replica-set|sharded

Waits (up to two minutes) for each member, initiates each replica set, waits for its primary, and
for the sharded cluster adds both shards through the mongos. Needs only pymongo.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

DEADLINE = time.monotonic() + 120
ALREADY_INITIALIZED = 23


def client(port: int, **options: Any) -> MongoClient[dict[str, Any]]:
    return MongoClient(f"mongodb://localhost:{port}/", directConnection=True, serverSelectionTimeoutMS=2000, **options)


def retry(what: str, step: Any) -> Any:
    while True:
        try:
            return step()
        except PyMongoError as error:
            if time.monotonic() > DEADLINE:
                raise SystemExit(f"gave up on {what}: {error}") from error
            time.sleep(1)


def initiate(port: int, name: str, host: str, **config: Any) -> None:
    """Initiate a one-member replica set whose member is ``host`` and wait for it to be primary."""
    with client(port) as member:

        def send() -> None:
            try:
                member.admin.command("replSetInitiate", {"_id": name, "members": [{"_id": 0, "host": host}], **config})
            except OperationFailure as error:
                if error.code != ALREADY_INITIALIZED:
                    raise

        def primary() -> None:
            if not member.admin.command("hello").get("isWritablePrimary"):
                raise OperationFailure(f"{name} has no primary yet")

        retry(f"initiating {name}", send)
        retry(f"{name}'s primary", primary)
    print(f"{name}: primary {host}", flush=True)


def main(topology: str) -> None:
    if topology == "replica-set":
        initiate(27017, "rs0", "localhost:27017")
        return
    initiate(27019, "config", "config:27019", configsvr=True)
    initiate(27018, "shard1", "shard1:27018")
    initiate(27020, "shard2", "shard2:27020")
    mongos: MongoClient[dict[str, Any]]
    with MongoClient("mongodb://localhost:27017/", serverSelectionTimeoutMS=2000) as mongos:
        for shard in ("shard1/shard1:27018", "shard2/shard2:27020"):
            retry(f"adding {shard}", lambda shard=shard: mongos.admin.command("addShard", shard))
        print("mongos: shards", [shard["_id"] for shard in mongos.admin.command("listShards")["shards"]], flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("replica-set", "sharded"):
        raise SystemExit(__doc__)
    main(sys.argv[1])
