"""The implementation of ``mongolock_async.privileges`` (its public path; the user guide is there)."""

from __future__ import annotations

from typing import Any

__all__ = ["lock_privileges", "operator_privileges"]


def lock_privileges(database: str, collection: str) -> list[dict[str, Any]]:
    """What an application needs to take, renew, release and wait for locks in ``database.collection``
    (and to tie transactions to them), for ``createRole``'s ``privileges``."""
    actions = ["changeStream", "find", "insert", "update"]
    return [{"resource": {"db": database, "collection": collection}, "actions": actions}]


def operator_privileges(database: str, collection: str) -> list[dict[str, Any]]:
    """What ``mongolock list``/``inspect``/``release --force``/``check`` and
    [`ensure_idle_cleanup_index`][mongolock_async.ensure_idle_cleanup_index] need on top of
    [`lock_privileges`][mongolock_async.privileges.lock_privileges]. ``remove`` is for
    ``mongolock check`` alone, which removes the scratch locks it writes (the library never deletes a
    lock document)."""
    return [
        {"resource": {"db": database, "collection": ""}, "actions": ["listCollections"]},
        {
            "resource": {"db": database, "collection": collection},
            "actions": ["collMod", "createIndex", "listIndexes", "remove"],
        },
    ]
