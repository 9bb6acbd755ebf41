"""``mongolock check`` on deployments that advertise names the client does not reach them by: a
member initiated under its name inside a container and reached through a mapped port, a mongos
listed under its container's id, members no one here can resolve. What it reaches it judges, what
it cannot it says it could not, and an unread clock is never counted as agreeing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mongolock_async._cli.check.verdicts import FAIL, PASS, WARN, ClockReading, judge_clocks
from tests.support.run_settings import child_environment
from tests.support.standins import Forwarder, Identity, StandIn

# Names that resolve nowhere (RFC 2606 reserves .invalid): a container's, a pod's own names.
MEMBER = "mongodb-0.mongodb.invalid:27017"
OTHER_MEMBER = "mongodb-1.mongodb.invalid:27017"
MONGOS = "mongos-3f2a9c1e0b7d.invalid"


@pytest.fixture
def reached_through_a_port(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URI (``directConnection``) of a stand-in with the identity the test parametrizes, reached
    through a forwarded port."""
    identity: Identity = request.param
    with StandIn(identity) as server, Forwarder(("127.0.0.1", server.port or 0)) as forwarder:
        direct = "" if identity.mongos else "?directConnection=true"
        yield f"mongodb://localhost:{forwarder.port}/{direct}"


def clocks(uri: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """``mongolock check --read-only --json`` on ``uri``: its exit code and its clock checks by id."""
    result = subprocess.run(
        [sys.executable, "-m", "mongolock_async", "check", "--uri", uri, "--json", "--read-only", "--ttl", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(),
    )
    payload = json.loads(result.stdout)
    assert result.returncode == payload["exit_code"], result.stderr
    return result.returncode, {entry["id"]: entry for entry in payload["checks"] if entry["section"] == "clocks"}


@pytest.mark.parametrize(
    "reached_through_a_port", [Identity("rs0", advertised=MEMBER)], indirect=True, ids=["member"]
)
@pytest.mark.timing(margin=2.0)  # a server's clock is read within the safety margin (1 s) of this one
def test_a_member_reached_through_a_mapped_port_is_read_there(reached_through_a_port: str) -> None:
    # As the testcontainers MongoDB: initiated as its name inside the container, reached through
    # the port Docker mapped. Nothing answers at the advertised name here, and nothing has to.
    code, checks = clocks(reached_through_a_port)
    member = checks[f"clocks.server:{MEMBER}"]
    assert member["verdict"] == PASS, member
    assert member["figures"]["reached_at"] == reached_through_a_port.split("/")[2], member
    assert checks["clocks.agreement"]["verdict"] == PASS and checks["clocks.agreement"]["figures"]["unknown"] == []
    assert code == 0, checks


@pytest.mark.parametrize(
    "reached_through_a_port",
    [Identity(None, host_name=MONGOS)],
    indirect=True,
    ids=["mongos"],
)
@pytest.mark.timing(margin=2.0)  # a server's clock is read within the safety margin (1 s) of this one
def test_a_mongos_listed_under_its_containers_name_is_recognised_where_it_answered(
    reached_through_a_port: str,
) -> None:
    # config.mongos names the mongos "<container id>:27017", which only Docker's network resolves;
    # serverStatus tells that the mongos of the URI is that one.
    code, checks = clocks(reached_through_a_port)
    listed = checks[f"clocks.server:{MONGOS}:27017"]
    assert listed["verdict"] == PASS and listed["figures"]["reached_at"] == reached_through_a_port.split("/")[2]
    assert len(checks) == 2, f"one mongos, read once: {list(checks)}"
    assert checks["clocks.agreement"]["verdict"] == PASS and code == 0, checks


@pytest.mark.parametrize(
    "reached_through_a_port",
    [Identity("rs0", advertised=MEMBER, other_members=(OTHER_MEMBER,))],
    indirect=True,
    ids=["one-of-two"],
)
@pytest.mark.timing(margin=2.0)  # a server's clock is read within the safety margin (1 s) of this one
def test_a_member_that_cannot_be_reached_is_named_and_its_clock_is_unknown(reached_through_a_port: str) -> None:
    # As through a port-forward to one pod of a set: the other member's name does not resolve here.
    code, checks = clocks(reached_through_a_port)
    assert checks[f"clocks.server:{MEMBER}"]["verdict"] == PASS
    other = checks[f"clocks.server:{OTHER_MEMBER}"]
    assert other["verdict"] == WARN and "could not be read" in other["measured"], other
    agreement = checks["clocks.agreement"]
    assert agreement["verdict"] == WARN and agreement["figures"]["unknown"] == [OTHER_MEMBER], agreement
    assert "1 of the 2 clocks that decide expiry was read" in agreement["measured"], agreement
    assert code == 1


def test_a_clock_that_could_not_be_read_never_counts_as_agreeing() -> None:
    read = ClockReading("a:27017", "primary", True, 0.001, 0.002, 0.003)
    unread = ClockReading("b:27017", "secondary", True, error="could not be read at b:27017: timed out")
    margin, ttl = 1.0, 10.0
    assert judge_clocks([read], margin, ttl)[-1].verdict == PASS
    alone = judge_clocks([read, unread], margin, ttl)
    assert [check.verdict for check in alone] == [PASS, WARN, WARN], alone
    assert "b:27017" in alone[-1].measured and alone[-1].figures["unknown"] == ["b:27017"]
    # Two clocks read that agree, a third unknown: still a warning, never a pass.
    twin = ClockReading("c:27017", "secondary", True, 0.001, 0.002, 0.003)
    assert judge_clocks([read, twin, unread], margin, ttl)[-1].verdict == WARN
    # Clocks read that disagree fail, whatever the unread one would say.
    apart = ClockReading("c:27017", "secondary", True, 3.0, 0.002, 0.003)
    assert judge_clocks([read, apart, unread], margin, ttl)[-1].verdict == FAIL
    # A clock that decides nothing (a passive member, this client) and was not read is no unknown.
    aside = ClockReading("d:27017", "passive", False, error="could not be read")
    assert judge_clocks([read, aside], margin, ttl)[-1].verdict == PASS
