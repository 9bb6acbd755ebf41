"""``mongolock check``'s verdicts at the depth of ``rs.status()``: the replica set's members, their
replication lag and the oplog window; how long a failover takes against the TTL; arbiters and
journaled majority writes; the lock collection's options; and whether the server's release is
still supported.

Nothing here talks to a server (``_check_run`` reads, ``store/replication.py`` sends); the
thresholds are the ones docs/checking.md states, each with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from ...store.replication import OplogSpan
from .verdicts import FAIL, PASS, SKIP, WARN, Check, ms, percent, version_tuple

LAG_WARN_SHARE = 0.10
"""Replication: warn when a member lags the primary by more than this share of the TTL (the
default safety margin): a majority that needs it commits that much later."""
LAG_FAIL_SHARE = 1 / 3
"""Replication: fail when the member that completes a majority lags by this share of the TTL
(the default heartbeat interval): majority writes, and so renewals, wait for it."""
OPLOG_WARN_HOURS = 24.0
"""Replication: warn when a full oplog spans less than this: a member down longer must be resynced,
and the set runs with one fewer copy meanwhile."""
OPLOG_FULL_SHARE = 0.9
"""An oplog at this share of its maximum size is full (older entries are being dropped): its span
is its window. Below it, the window is at least the span, and still growing."""
DEFAULT_ELECTION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_MS = 2_000
RENEWAL_SHARE = 1 / 3
"""The default heartbeat renews a lease every third of its TTL."""

# MongoDB's lifecycle schedule (mongodb.com/legal/support-policy/lifecycles): the last day each
# release series is supported. From 8.2 on, MongoDB supports each minor release on premises until
# its major release's date; the rapid releases before it (5.1 to 5.3, 6.1 to 6.3, 7.1 to 7.3 and
# 8.1) were for Atlas only, each until the next one.
END_OF_LIFE = {
    (4, 4): date(2024, 2, 29),
    (5, 0): date(2024, 10, 31),
    (6, 0): date(2025, 7, 31),
    (7, 0): date(2027, 8, 31),
    (8, 0): date(2029, 10, 31),
}
RAPID_RELEASES = {(5, 1), (5, 2), (5, 3), (6, 1), (6, 2), (6, 3), (7, 1), (7, 2), (7, 3), (8, 1)}
_HEALTHY_STATES = ("PRIMARY", "SECONDARY", "ARBITER")
_SCHEDULES = "MongoDB's lifecycle schedules: mongodb.com/legal/support-policy/lifecycles"


# -- replication -------------------------------------------------------------------------------------


def judge_members(status: Mapping[str, Any], config: Mapping[str, Any] | None, ttl: float) -> list[Check]:
    """Member health, and replication lag against the TTL, from ``replSetGetStatus`` (and the
    members' votes from ``replSetGetConfig`` where readable: every member votes by default)."""
    members = [member for member in status.get("members") or () if isinstance(member, Mapping)]
    votes = {
        entry.get("host"): entry.get("votes", 1)
        for entry in (config or {}).get("members") or ()
        if isinstance(entry, Mapping)
    }
    unhealthy = [m for m in members if m.get("health") != 1 or m.get("stateStr") not in _HEALTHY_STATES]
    data_voting = [m for m in members if m.get("stateStr") != "ARBITER" and votes.get(m.get("name"), 1)]
    healthy_data_voting = [m for m in data_voting if m not in unhealthy]
    voting = [m for m in members if votes.get(m.get("name"), 1)]
    needed = status.get("writeMajorityCount")
    needed = needed if isinstance(needed, int) else len(voting) // 2 + 1
    shown = ", ".join(f"{m.get('name')} {m.get('stateStr')}" for m in members)
    figures = {
        "members": [{"name": m.get("name"), "state": m.get("stateStr"), "health": m.get("health")} for m in members],
        "write_majority": needed,
        "healthy_data_bearing_voters": len(healthy_data_voting),
    }
    if len(healthy_data_voting) < needed:
        health = Check(
            section="replication",
            name="members",
            verdict=FAIL,
            measured=(
                f"{shown}: {len(healthy_data_voting)} healthy data-bearing voting members, a majority write needs "
                f"{needed}"
            ),
            fix="majority writes (every acquire, renewal and release) cannot commit: bring members back (rs.status())",
            figures=figures,
        )  # fmt: skip
    elif unhealthy:
        names = ", ".join(str(m.get("name")) for m in unhealthy)
        health = Check(
            section="replication",
            name="members",
            verdict=WARN,
            measured=f"{shown}; not healthy: {names}",
            fix=f"one more failure and majority writes stop (they need {needed}): bring {names} back (rs.status())",
            figures=figures,
        )  # fmt: skip
    else:
        health = Check(
            section="replication",
            name="members",
            verdict=PASS,
            measured=f"{shown}; a majority write needs {needed}",
            fix=None,
            figures=figures,
        )
    return [health, _judge_lag(members, healthy_data_voting, needed, ttl)]


def _judge_lag(members: Sequence[Mapping[str, Any]], data_voting: Sequence[Mapping[str, Any]], needed: int,
               ttl: float) -> Check:  # fmt: skip
    primary = next((m for m in members if m.get("stateStr") == "PRIMARY"), None)
    primary_at = primary.get("optimeDate") if primary is not None else None
    if not isinstance(primary_at, datetime):
        return Check(
            section="replication",
            name="lag",
            verdict=SKIP,
            measured="not run: no primary reported its optime",
        )
    lags = {
        str(m.get("name")): max(0.0, (primary_at - m["optimeDate"]).total_seconds())
        for m in members
        if m.get("stateStr") == "SECONDARY" and isinstance(m.get("optimeDate"), datetime)
    }
    voting_lags = sorted([0.0] + [lags[str(m.get("name"))] for m in data_voting if str(m.get("name")) in lags])
    majority_lag = voting_lags[needed - 1] if len(voting_lags) >= needed else None
    worst = max(lags.items(), key=lambda item: item[1], default=None)
    figures = {"lag_s": lags, "majority_lag_s": majority_lag, "warn_above_s": LAG_WARN_SHARE * ttl,
               "fail_at_s": LAG_FAIL_SHARE * ttl}  # fmt: skip
    if worst is None:
        return Check(
            section="replication",
            name="lag",
            verdict=PASS,
            measured="no secondary to lag (one data-bearing member)",
            fix=None,
            figures=figures,
        )
    shown = (
        f"the most behind, {worst[0]}, {ms(worst[1])} behind the primary; a majority commits "
        + (f"{ms(majority_lag)} behind" if majority_lag is not None else "with members missing")
        + f" (the TTL is {ttl:g} s)"
    )
    if majority_lag is not None and majority_lag >= LAG_FAIL_SHARE * ttl:
        return Check(
            section="replication",
            name="lag",
            verdict=FAIL,
            measured=shown,
            fix=(
                "majority writes wait for lagging members longer than a renewal interval: find what slows "
                "replication (rs.status(), the members' disks and network), or use a longer TTL"
            ),
            figures=figures,
        )  # fmt: skip
    if worst[1] > LAG_WARN_SHARE * ttl:
        return Check(
            section="replication",
            name="lag",
            verdict=WARN,
            measured=shown,
            fix=(
                f"a member lags more than {percent(LAG_WARN_SHARE)} of the TTL: a majority that needs it commits that "
                "late (a renewal eats into the safety margin); find what slows it"
            ),
            figures=figures,
        )  # fmt: skip
    return Check(section="replication", name="lag", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_oplog(span: OplogSpan | None) -> Check:
    """The oplog window: how long a member may be away and still catch up."""
    if span is None:
        return Check(
            section="replication",
            name="oplog window",
            verdict=SKIP,
            measured="not run: the oplog holds no entry",
        )
    seconds = (span.last - span.first).total_seconds()
    hours = seconds / 3600
    full = span.used_bytes is not None and span.max_bytes and span.used_bytes >= OPLOG_FULL_SHARE * span.max_bytes
    figures = {"span_hours": hours, "used_bytes": span.used_bytes, "max_bytes": span.max_bytes,
               "warn_below_hours": OPLOG_WARN_HOURS}  # fmt: skip
    size = (
        f"{span.used_bytes / 2**20:,.0f} of its {span.max_bytes / 2**20:,.0f} MB"
        if span.used_bytes is not None and span.max_bytes
        else "its size not readable"
    )
    shown = f"the oplog spans {_duration(seconds)} ({size})"
    if hours >= OPLOG_WARN_HOURS:
        return Check(
            section="replication",
            name="oplog window",
            verdict=PASS,
            measured=shown,
            fix=None,
            figures=figures,
        )
    if span.used_bytes is not None and span.max_bytes and not full:
        return Check(
            section="replication",
            name="oplog window",
            verdict=PASS,
            measured=(
                shown + ": not full yet, so the window is at least that "
                "and growing"
            ),
            fix=None,
            figures=figures,
        )  # fmt: skip
    if not full:
        return Check(
            section="replication",
            name="oplog window",
            verdict=SKIP,
            measured=(
                f"not judged: {shown}, so whether it is full is not known "
                "(collStats on local.oplog.rs needs clusterMonitor)"
            ),
            fix=None,
            figures=figures,
        )  # fmt: skip
    return Check(
        section="replication",
        name="oplog window",
        verdict=WARN,
        measured=shown + ", full",
        fix=(
            f"a member away longer than that must be resynced (one copy fewer meanwhile): size the oplog for at least "
            f"{OPLOG_WARN_HOURS:g} h (replSetResizeOplog, or storage.oplogMinRetentionHours)"
        ),
        figures=figures,
    )  # fmt: skip


def judge_failover(
    config: Mapping[str, Any] | None, status: Mapping[str, Any], ttl: float, margin: float, why_no_config: str = ""
) -> Check:
    """The failover gap against what a lease has left after its last renewal.

    With no primary, no renewal commits. A secondary calls an election after ``electionTimeoutMillis``
    without a heartbeat from the primary, and the heartbeats come every ``heartbeatIntervalMillis``;
    MongoDB's documentation puts the median failover at "not typically exceed 12 seconds" with the
    defaults (10 s and 2 s), which is their sum. A lease renewed every third of its TTL has at least
    two thirds of it, less the safety margin, left when the primary goes."""
    settings = (config or {}).get("settings") or {}
    metrics = status.get("electionCandidateMetrics") or {}
    timeout = settings.get("electionTimeoutMillis", metrics.get("electionTimeoutMillis"))
    if not isinstance(timeout, int | float):
        return Check(
            section="replication",
            name="failover",
            verdict=SKIP,
            measured=(
                "not run: electionTimeoutMillis is not known: replSetGetConfig: "
                f"{why_no_config or 'no settings'}"
            ),
        )  # fmt: skip
    heartbeat = settings.get("heartbeatIntervalMillis", status.get("heartbeatIntervalMillis", DEFAULT_HEARTBEAT_MS))
    heartbeat = heartbeat if isinstance(heartbeat, int | float) else DEFAULT_HEARTBEAT_MS
    gap = (timeout + heartbeat) / 1000
    left = ttl * (1 - RENEWAL_SHARE) - margin
    figures = {"election_timeout_ms": timeout, "heartbeat_interval_ms": heartbeat, "failover_gap_s": gap,
               "lease_left_s": left}  # fmt: skip
    shown = (
        f"electionTimeoutMillis {timeout:g}, heartbeats every {heartbeat:g} ms: a failover takes about {gap:g} s; "
        f"a lease renewed every third of the {ttl:g} s TTL has at least {left:.3g} s left when the primary goes"
    )
    if gap > left:
        return Check(
            section="replication",
            name="failover",
            verdict=WARN,
            measured=shown,
            fix=(
                "holders lose their leases at a failover (signalled: LockLostError, never silent): use a TTL of "
                "at least "
                f"{(gap + margin) / (1 - RENEWAL_SHARE):.3g} s, or a shorter electionTimeoutMillis"
            ),
            figures=figures,
        )  # fmt: skip
    return Check(section="replication", name="failover", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_arbiters(hello: Mapping[str, Any]) -> Check:
    """An arbiter votes but holds no data: in a primary-secondary-arbiter set, one data-bearing
    member down leaves a primary that cannot commit a majority write."""
    arbiters = [str(host) for host in hello.get("arbiters") or ()]
    figures = {"arbiters": arbiters}
    if arbiters:
        return Check(
            section="replication",
            name="arbiters",
            verdict=WARN,
            measured=(
                f"{len(arbiters)} arbiter{'s' if len(arbiters) > 1 else ''} ({', '.join(arbiters)}): with one "
                "data-bearing "
                "member down, w: \"majority\" writes (every acquire, renewal and release) cannot commit"
            ),
            fix=(
                "replace each arbiter with a data-bearing member (MongoDB advises against arbiters: PSA sets lose "
                "majority writes with one member down)"
            ),
            figures=figures,
        )  # fmt: skip
    return Check(
        section="replication",
        name="arbiters",
        verdict=PASS,
        measured="no arbiter: every voting member holds data",
        fix=None,
        figures=figures,
    )


def judge_journaling(config: Mapping[str, Any] | None) -> Check:
    """``writeConcernMajorityJournalDefault``: whether a majority write is acknowledged only once
    journaled on a majority (true by default); false lets a crash of that majority lose it."""
    if config is None:
        return Check(
            section="replication",
            name="journaling",
            verdict=SKIP,
            measured=(
                "not run: replSetGetConfig is not readable here "
                "(it needs clusterMonitor)"
            ),
        )  # fmt: skip
    journaled = config.get("writeConcernMajorityJournalDefault", True)
    figures = {"write_concern_majority_journal_default": journaled}
    if journaled is False:
        return Check(
            section="replication",
            name="journaling",
            verdict=FAIL,
            measured=(
                "writeConcernMajorityJournalDefault is false: majority writes are acknowledged before they are "
                "journaled"
            ),
            fix=(
                "a crash of the majority can lose an acknowledged acquisition (two holders, a fencing token reused): "
                "set it to true (rs.reconfig)"
            ),
            figures=figures,
        )  # fmt: skip
    return Check(
        section="replication",
        name="journaling",
        verdict=PASS,
        measured=(
            "majority writes are acknowledged once journaled on a "
            "majority (writeConcernMajorityJournalDefault true)"
        ),
        fix=None,
        figures=figures,
    )  # fmt: skip


# -- the collection and the server's release ------------------------------------------------------


def judge_collection_options(entry: Mapping[str, Any] | None) -> Check:
    """The lock collection's type and options: the library needs a plain collection that compares
    ``_id`` as binary strings, accepts its documents, and lets them grow."""
    if entry is None:
        return Check(
            section="collection",
            name="options",
            verdict=PASS,
            measured=(
                "no collection yet: the first lock creates it with the server's "
                "defaults"
            ),
            fix=None,
            figures={"exists": False},
        )  # fmt: skip
    options = entry.get("options") or {}
    collation = options.get("collation") or {}
    figures = {"type": entry.get("type"), "collation": collation or None, "validator": bool(options.get("validator")),
               "capped": bool(options.get("capped"))}  # fmt: skip
    problems: list[tuple[str, str]] = []
    if entry.get("type", "collection") != "collection":
        problems.append((FAIL, f"it is a {entry.get('type')}, not a collection"))
    if options.get("capped"):
        problems.append((FAIL, "it is capped: a lock document that grows (a queue, a label) cannot be updated"))
    if collation and collation.get("locale") != "simple":
        problems.append((FAIL, f"its default collation {dict(collation)} compares _id by that collation: two lock "
                         "names it holds equal (say, in another case) are one document, and name prefixes are "
                         "ranges of that order, not of the names' characters"))  # fmt: skip
    if options.get("validator"):
        action, level = options.get("validationAction", "error"), options.get("validationLevel", "strict")
        problems.append((WARN, f"a validator ({action} on {level} level) may refuse the library's writes"))
    if not problems:
        return Check(
            section="collection",
            name="options",
            verdict=PASS,
            measured=(
                "a plain collection: _id compared as binary strings, no "
                "validator, not capped"
            ),
            fix=None,
            figures=figures,
        )  # fmt: skip
    verdict = FAIL if any(level == FAIL for level, _ in problems) else WARN
    return Check(
        section="collection",
        name="options",
        verdict=verdict,
        measured="; ".join(text for _, text in problems),
        fix=(
            "keep the locks in a collection of their own, created with the server's defaults (no collation, "
            "validator or cap): the library creates it on first use"
        ),
        figures=figures,
    )  # fmt: skip


def judge_support(build_info: Mapping[str, Any], today: date) -> Check:
    """Whether MongoDB still supports the server's release series on ``today``."""
    version = str(build_info.get("version", "?"))
    series = version_tuple(version)
    figures: dict[str, Any] = {"version": version, "end_of_life": None}
    if series is None:
        return Check(
            section="server",
            name="support",
            verdict=SKIP,
            measured=f"not run: version {version!r} is not MAJOR.MINOR...",
        )
    major_end = END_OF_LIFE.get((series[0], 0))
    if series in RAPID_RELEASES:
        return Check(
            section="server",
            name="support",
            verdict=WARN,
            measured=f"MongoDB {version} is a rapid release: supported on Atlas only, and only until the next release",
            fix=f"upgrade to a supported major release ({_SCHEDULES})",
            figures=figures,
        )  # fmt: skip
    end = END_OF_LIFE.get(series) or (major_end if series[0] >= 8 else None)
    if end is None:
        latest = max(END_OF_LIFE)
        if series > latest:
            return Check(
                section="server",
                name="support",
                verdict=PASS,
                measured=(
                    f"MongoDB {version} is newer than this check's lifecycle table "
                    f"(up to {latest[0]}.{latest[1]})"
                ),
                fix=None,
                figures=figures,
            )  # fmt: skip
        return Check(
            section="server",
            name="support",
            verdict=SKIP,
            measured=f"not run: MongoDB {version} is not in the lifecycle table",
        )
    figures["end_of_life"] = end.isoformat()
    if today > end:
        return Check(
            section="server",
            name="support",
            verdict=WARN,
            measured=(
                f"MongoDB {series[0]}.{series[1]} reached its end of life on {end:%Y-%m-%d}: no more fixes, "
                "security ones "
                "included"
            ),
            fix=f"upgrade to a supported release ({_SCHEDULES})",
            figures=figures,
        )  # fmt: skip
    left = (end - today) // timedelta(days=1)
    return Check(
        section="server",
        name="support",
        verdict=PASS,
        measured=(
            f"MongoDB {series[0]}.{series[1]} is supported until {end:%Y-%m-%d} "
            f"({left} days)"
        ),
        fix=None,
        figures=figures,
    )  # fmt: skip


def _duration(seconds: float) -> str:
    """A span for people: 42 s, 17 min, 3.5 h, 26 h."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.2g} h" if seconds < 36_000 else f"{seconds / 3600:.0f} h"
