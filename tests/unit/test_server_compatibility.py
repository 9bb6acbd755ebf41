"""What the server cannot take, refused before any request: a server older than MongoDB 5.0 (judged
by the servers that take writes), and input it could not take (a name or label that is not UTF-8,
a TTL above the maximum, a write concern other than majority)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.hello import Hello
from pymongo.server_description import ServerDescription
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoLock,
    ServerTooOldError,
)
from mongolock_async.store import oldest_wire_version, sending
from tests.support.commands import CommandCounter


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"name": "lone \ud800 surrogate"}, ValueError, "name.*UTF-8"),
        ({"label": "bad \udfff label"}, ValueError, "label.*UTF-8"),
        ({"ttl": 400 * 86_400.0}, ValueError, "ttl.*at most"),
        ({"ttl": 1e300}, ValueError, "ttl.*at most"),
        ({"write_concern": WriteConcern(w=1)}, ValueError, "majority"),
        ({"write_concern": WriteConcern(w=2, j=True)}, ValueError, "majority"),
    ],
)
async def test_input_the_server_cannot_take_is_refused_before_io(
    counted_collection: Any, command_counter: CommandCounter, overrides: dict[str, Any], error: type, match: str
) -> None:
    arguments: dict[str, Any] = {"collection": counted_collection, "name": "job", "ttl": 30.0, **overrides}
    with pytest.raises(error, match=match):
        AsyncMongoLock(**arguments)
    assert command_counter.names == []


async def test_a_server_older_than_5_0_is_refused_before_the_first_lock_request(
    counted_collection: Any, command_counter: CommandCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded server speaks a recent wire version; pretend 5.0 were newer than it.
    monkeypatch.setattr(sending, "_MIN_WIRE_VERSION", 99)
    monkeypatch.setattr(sending, "_checked_clients", sending.WeakIdentityMap())
    with pytest.raises(ServerTooOldError, match=r"5\.0 or newer"):
        await AsyncMongoLock(counted_collection, "old", ttl=5.0).acquire()
    assert command_counter.count("findAndModify") == 0
    assert command_counter.names == ["ping"], "one command every server version knows, then nothing"


def _server(max_wire_version: int, **hello: Any) -> ServerDescription:
    return ServerDescription(("db", 27017), Hello({"ok": 1, "maxWireVersion": max_wire_version, **hello}))


def test_the_server_version_is_judged_by_the_servers_that_take_writes() -> None:
    # MongoDB 4.4.0 and older do not know `hello` (it came in 5.0 and 4.4.2): the version is read
    # from what each server announced to the driver's monitoring, not asked with a command.
    primary, secondary = {"isWritablePrimary": True, "setName": "rs"}, {"secondary": True, "setName": "rs"}
    mongos = {"isWritablePrimary": True, "msg": "isdbgrid"}
    assert oldest_wire_version([_server(9, **primary), _server(17, **secondary)]) == 9  # a 4.4 primary
    assert oldest_wire_version([_server(17, **primary), _server(9, **secondary)]) == 17  # upgrading secondaries
    assert oldest_wire_version([_server(13, **mongos), _server(8, **mongos)]) == 8  # one 4.2 mongos
    assert oldest_wire_version([_server(7, isWritablePrimary=True)]) == 7  # a 4.0 standalone
    assert oldest_wire_version([_server(21, **secondary)]) is None  # no server that takes writes is known
