"""Initiate the MongoDB deployments of replica-set.yml, sharded.yml, access-control.yml or tls.yml
once their containers run.

    python .ci/mongodb/initiate.py replica-set|sharded|access-control
    python .ci/mongodb/initiate.py tls CA_FILE

Waits (up to two minutes) for each member, initiates each replica set, waits for its primary, and
for the sharded cluster adds both shards through the mongos. For access-control (a member started
with a keyfile, so it enforces roles; run this on the same host, where MongoDB's localhost exception
lets the first user be created) it also creates the roles docs/deploying.md gives, from
mongolock_async.privileges (so this needs the package installed), and a user for each: see
``create_test_users``. For tls it connects with TLS, verifying the server with CA_FILE. Otherwise
it needs only pymongo.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

DEADLINE = time.monotonic() + 120
TLS: dict[str, Any] = {}
"""Client options for a server that speaks TLS only (tls.yml): set from the command line."""
ALREADY_INITIALIZED = 23
UNAUTHORIZED, USER_EXISTS = 13, 51003


def client(port: int, **options: Any) -> MongoClient[dict[str, Any]]:
    return MongoClient(
        f"mongodb://localhost:{port}/", directConnection=True, serverSelectionTimeoutMS=2000, **TLS, **options
    )


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


# What the access-controlled test run uses: the administrator creates, shards and drops the test
# collections and the roles (MONGOLOCK_TEST_ADMIN_URI); the application's and the operator's users
# have the documented roles and nothing else (MONGODB_URI). Passwords of a throwaway CI server.
ADMIN = ("mongolock-admin", "admin-password")
USERS = {"mongolock-app": ("app-password", "mongolockUser"), "mongolock-ops": ("ops-password", "mongolockOperator")}
# The databases the suite's lock and command tests use (mongolock_async.testing.clients' TEST_DATABASE, test_cli's
# and the command's default), each test in a fresh collection: the roles grant docs/deploying.md's
# privileges on every collection of these databases (collection ""), where an application's role
# names its one lock collection.
TEST_DATABASES = ("mongolock_tests", "mongolock_cli", "mongolock")


def create_test_users(admin: MongoClient[dict[str, Any]]) -> None:
    """Create (or recreate) the roles mongolockUser and mongolockOperator as docs/deploying.md
    defines them, over ``TEST_DATABASES``, and the users of ``USERS`` with them."""
    from mongolock_async.privileges import lock_privileges, operator_privileges

    lock = [privilege for database in TEST_DATABASES for privilege in lock_privileges(database, "")]
    operator = [privilege for database in TEST_DATABASES for privilege in operator_privileges(database, "")]
    database = admin.admin
    for user in USERS:
        if database.command("usersInfo", user)["users"]:
            database.command("dropUser", user)
    for role in ("mongolockOperator", "mongolockUser"):
        if database.command("rolesInfo", role)["roles"]:
            database.command("dropRole", role)
    database.command("createRole", "mongolockUser", privileges=lock, roles=[])
    database.command(
        "createRole", "mongolockOperator", privileges=operator, roles=[{"role": "mongolockUser", "db": "admin"}]
    )
    for user, (password, role) in USERS.items():
        database.command("createUser", user, pwd=password, roles=[{"role": role, "db": "admin"}])
    print("users:", ", ".join(f"{user} ({role})" for user, (_, role) in USERS.items()), flush=True)


def access_control() -> None:
    """The keyfile member: initiate it and create the administrator through the localhost
    exception, then the roles and users as the administrator."""
    initiate(27017, "rs0", "localhost:27017")
    with client(27017) as member:
        try:
            member.admin.command("createUser", ADMIN[0], pwd=ADMIN[1], roles=["root"])
        except OperationFailure as error:
            # A second run: the user exists (51003), or the localhost exception closed with the
            # first user (13, Unauthorized).
            if error.code not in (UNAUTHORIZED, USER_EXISTS):
                raise
    with client(27017, username=ADMIN[0], password=ADMIN[1], authSource="admin") as admin:
        create_test_users(admin)


def main(topology: str) -> None:
    if topology in ("replica-set", "tls"):
        initiate(27017, "rs0", "localhost:27017")
        return
    if topology == "access-control":
        access_control()
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
    if sys.argv[1:2] == ["tls"] and len(sys.argv) == 3:
        TLS.update(tls=True, tlsCAFile=sys.argv[2])
    elif len(sys.argv) != 2 or sys.argv[1] not in ("replica-set", "sharded", "access-control"):
        raise SystemExit(__doc__)
    main(sys.argv[1])
