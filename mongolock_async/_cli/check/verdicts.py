"""``mongolock check``'s verdicts: what each measurement means for the library's contract.

Nothing here talks to a server: the measurements come in (from ``_check_run`` and
``_check_perf``), checks with a verdict, what was measured and the fix come out, and are shown as
text or JSON. The thresholds are the ones the documentation's "Checking a deployment" page states.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..._util.inert import printable, shell_word
from ...admin.privileges import lock_privileges, operator_privileges
from ...errors import LockDataError
from ...store import IDLE_CLEANUP_INDEX
from ...store.documents import LockState

Verdict = Literal["pass", "warn", "fail", "skip"]
"""A check's verdict, as ``check --json`` writes it (the exit status is the worst one's)."""
PASS: Verdict = "pass"
WARN: Verdict = "warn"
FAIL: Verdict = "fail"
SKIP: Verdict = "skip"
SECTIONS = ("server", "durability", "replication", "clocks", "privileges", "collection", "perf")
_TITLES = {
    "server": "Server",
    "durability": "Durability",
    "replication": "Replication",
    "clocks": "Clocks",
    "privileges": "Privileges",
    "collection": "Collection",
    "perf": "Performance",
}
JSON_FORMAT = 1
"""Version of the JSON output's shape; it changes only when a field changes meaning or goes away."""

# -- thresholds (docs/checking.md states each one and why) -----------------------------------------

MIN_VERSION = (5, 0)
WRITE_WARN_SHARE = 0.10
"""Durability: warn when the p99 of a majority write is above this share of the TTL (the default
safety margin is 10 % of the TTL)."""
WRITE_FAIL_SHARE = 1 / 3
"""Durability: fail when the p99 of a majority write reaches this share of the TTL: the default
heartbeat renews every third of the TTL, so each renewal would still be on its way when the next
is due."""
CLOCK_AGREEMENT_SHARE = 0.25
"""Clocks that decide expiry must agree "within a small fraction of the safety margin"
(docs/deploying.md): warn unless they are shown to be within this share of it."""
WAKE_UP_WARN_S = 1.0
"""Wake-ups: warn when a change event takes longer than this to arrive after its write."""
DOCUMENT_WARN_SHARE, DOCUMENT_FAIL_SHARE = 0.10, 0.50
"""The largest lock document's share of MongoDB's 16 MB document limit: warn, fail."""
MIN_IDLE_CLEANUP_S = 3600
"""A TTL index that deletes lock documents idle for less than this breaks the fencing tokens' floor
(the library's ``ensure_idle_cleanup_index`` refuses less)."""
UNCONTENDED_WARN_RATIO = 2.0
"""--perf: warn when an uncontended acquire + release takes more than this many times its two raw
requests (p50)."""
HAND_OFF_WARN_RATIO = 3.0
"""--perf: warn when a hand-off across connections takes more than this many times a raw write's
trip to another connection's change stream (p50)."""
HOT_LOCK_WARN_RATIO = 0.5
"""--perf: warn when a hot lock serves fewer acquisitions per second than this share of the raw
acquire + release rate."""
RENEWAL_WARN_RATIO = 2.0
"""--perf: warn when the heartbeat's renewal costs more per lease than this many times a raw
single-document update batch."""
RENEWAL_BUDGET_SHARE = 0.5
"""--perf: warn when renewing all the leases takes more than this share of the default heartbeat
interval (a third of the TTL)."""
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
SUSTAINED_WARN_RATIO = 2.0
"""--perf: warn when the p99 of ``async with lock:`` under the sustained load is more than this many
times the p99 of its two raw requests under the same load."""


@dataclass(kw_only=True)
class Check:
    """One line of the report: a verdict, what was measured, and the fix when it is not a pass."""

    section: str
    name: str
    verdict: Verdict
    measured: str
    fix: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    """The check's part of ``id`` (default: its name with ``_`` for spaces)."""
    command: str | None = None
    """A command line that applies the fix, shell-quoted (shown on a line of its own, never
    wrapped, so that it pastes whole)."""

    @property
    def id(self) -> str:
        """``section.key``: stable across runs, for CI (``server.change_streams``, ``clocks.agreement``,
        ``clocks.server:HOST:PORT``)."""
        return f"{self.section}.{self.key or self.name.replace(' ', '_')}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "section": self.section,
            "name": self.name,
            "verdict": self.verdict,
            "measured": self.measured,
            "fix": self.fix,
            "command": self.command,
            "figures": self.figures,
        }


def skipped(section: str, name: str, why: str) -> Check:
    return Check(section=section, name=name, verdict=SKIP, measured=f"not run: {why}")


def exit_code(checks: Iterable[Check]) -> int:
    """0 when every check passed (or was skipped), 1 with a warning, 2 with a failure."""
    verdicts = {check.verdict for check in checks}
    return 2 if FAIL in verdicts else 1 if WARN in verdicts else 0


def percentile(values: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile of ``values`` (p99 of fewer than 100 values is the largest)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[min(len(ordered), int(rank)) - 1]


def ms(seconds: float) -> str:
    """Seconds for people: 0.42 ms, 8.9 ms, 123 ms, 4.1 s."""
    value = seconds * 1000
    if abs(value) >= 1000:
        return f"{seconds:.3g} s"
    if abs(value) >= 100:
        return f"{value:.0f} ms"
    if abs(value) >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


# -- server --------------------------------------------------------------------------------------


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """``"8.0.4"`` -> (8, 0); None if it does not start with two numbers."""
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def judge_version(build_info: Mapping[str, Any], fcv: str | None, wire_version: int | None) -> Check:
    version = str(build_info.get("version", "?"))
    extra = f" (SecantusDB {build_info['secantusVersion']}, a test double)" if "secantusVersion" in build_info else ""
    shown = f"MongoDB {version}{extra}; feature compatibility " + (
        fcv or "not readable by this user (getParameter needs clusterMonitor)"
    )
    figures = {"version": version, "feature_compatibility": fcv, "wire_version": wire_version}
    too_old = [
        what
        for what, value in (("the server", version_tuple(version)), ("its feature compatibility", version_tuple(fcv)))
        if value is not None and value < MIN_VERSION
    ]
    if too_old:
        return Check(
            section="server",
            name="version",
            verdict=FAIL,
            measured=shown,
            fix=(
                "mongolock-async needs MongoDB 5.0 or newer: upgrade " + " and ".join(too_old)
                + " (setFeatureCompatibilityVersion once every member runs 5.0+)"
            ),
            figures=figures,
        )
    return Check(section="server", name="version", verdict=PASS, measured=shown, fix=None, figures=figures)


# -- durability ----------------------------------------------------------------------------------


def judge_majority_writes(
    majority: Sequence[float], w1: Sequence[float], ttl: float, error: str | None = None
) -> Check:
    """``majority`` and ``w1``: seconds per write of the library's own acquire and release."""
    if error is not None:
        return Check(
            section="durability",
            name="majority write",
            verdict=FAIL,
            measured=f"a w: \"majority\" write did not commit: {error}",
            fix=(
                "a majority of the replica set's data-bearing voting members must be up and replicating: "
                "check rs.status() for members down or lagging"
            ),
            figures={"error": error},
        )
    p50, p99 = percentile(majority, 50), percentile(majority, 99)
    figures = {
        "writes": len(majority),
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "w1_p50_ms": percentile(w1, 50) * 1000 if w1 else None,
        "p99_share_of_ttl": p99 / ttl,
    }
    shown = (
        f"committed: p50 {ms(p50)}, p99 {ms(p99)} over {len(majority)} writes"
        + (f" (w: 1 p50 {ms(percentile(w1, 50))})" if w1 else "")
        + f"; p99 is {percent(p99 / ttl)} of the {ttl:g} s TTL"
    )
    if p99 >= WRITE_FAIL_SHARE * ttl:
        return Check(
            section="durability",
            name="majority write",
            verdict=FAIL,
            measured=shown,
            fix=(
                f"a renewal would still be on its way when the next is due (every TTL/3): use a TTL of at least "
                f"{p99 / WRITE_WARN_SHARE:.3g} s, or find what slows majority commits (replication lag, a slow member)"
            ),
            figures=figures,
        )
    if p99 > WRITE_WARN_SHARE * ttl:
        return Check(
            section="durability",
            name="majority write",
            verdict=WARN,
            measured=shown,
            fix=(
                f"slow writes eat the safety margin: use a TTL of at least {p99 / WRITE_WARN_SHARE:.3g} s, or "
                "find what "
                "slows majority commits (replication lag, a slow member, a distant majority)"
            ),
            figures=figures,
        )
    return Check(section="durability", name="majority write", verdict=PASS, measured=shown, fix=None, figures=figures)


# -- clocks --------------------------------------------------------------------------------------

_MS_QUANTUM = 0.001
"""$$NOW has millisecond precision: the server's time lies in [reported, reported + 1 ms)."""


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One server's clock against this client's: ``offset`` (server minus client, seconds) is
    within ``uncertainty`` of the truth; ``round_trip`` is the best sample's. ``host`` is the
    server's name as the deployment advertises it; ``reached_at`` the address it answered at
    when that is another (a mapped port, a proxy); ``error`` why it was not read."""

    host: str
    role: str
    decides_expiry: bool
    offset: float | None = None
    uncertainty: float | None = None
    round_trip: float | None = None
    error: str | None = None
    reached_at: str | None = None

    @property
    def read(self) -> bool:
        return self.offset is not None and self.uncertainty is not None


def clock_reading(
    host: str,
    role: str,
    decides_expiry: bool,
    samples: Sequence[tuple[float, float, datetime]],
    *,
    reached_at: str | None = None,
) -> ClockReading:
    """The reading from ``samples`` of ``(client wall time sent, client wall time answered, the
    server's $$NOW)``: the sample with the shortest round trip (like NTP), its server time taken
    at the middle of the round trip. The true offset is within half the round trip plus half a
    millisecond (the server's precision) of the estimate."""
    sent, answered, now = min(samples, key=lambda sample: sample[1] - sample[0])
    middle = (sent + answered) / 2
    offset = now.timestamp() + _MS_QUANTUM / 2 - middle
    uncertainty = (answered - sent) / 2 + _MS_QUANTUM / 2
    return ClockReading(host, role, decides_expiry, offset, uncertainty, answered - sent, reached_at=reached_at)


def judge_clocks(readings: Sequence[ClockReading], margin: float, ttl: float) -> list[Check]:
    """One check per server against this client, and one for the agreement of the clocks that decide
    expiry: a failure when two of them differ by more than the safety margin for certain, a warning
    unless they are shown to agree within ``CLOCK_AGREEMENT_SHARE`` of it. A clock that decides
    expiry and could not be read is unknown, never agreeing: the agreement then warns at best."""
    checks = [_judge_reading(reading, margin) for reading in readings]
    deciding = [reading for reading in readings if reading.decides_expiry and reading.read]
    unknown = [reading.host for reading in readings if reading.decides_expiry and not reading.read]
    if not deciding:
        checks.append(
            Check(
                section="clocks",
                name="agreement",
                verdict=WARN,
                measured="no clock that decides expiry was measured",
                fix="see the lines above",
                figures={"clocks": 0, "unknown": unknown},
            )
        )  # fmt: skip
        return checks
    return [*checks, _agreement(deciding, unknown, margin, ttl)]


def _shown_host(reading: ClockReading) -> str:
    return reading.host if reading.reached_at is None else f"{reading.host} (reached at {reading.reached_at})"


def _judge_reading(reading: ClockReading, margin: float) -> Check:
    key = f"server:{reading.host}"
    if reading.offset is None or reading.uncertainty is None:
        return Check(
            section="clocks",
            name=reading.host,
            verdict=WARN,
            measured=f"{reading.role}: not measured: {reading.error}",
            fix=(
                "the clock of a server that was not read is not known to agree: run the check where every name the "
                "deployment advertises resolves and answers (inside its network), or make them do so here"
            ),
            figures={
                "host": reading.host, "role": reading.role, "error": reading.error, "reached_at": reading.reached_at
            },
            key=key,
        )
    figures = {
        "host": reading.host,
        "role": reading.role,
        "decides_expiry": reading.decides_expiry,
        "offset_ms": reading.offset * 1000,
        "uncertainty_ms": reading.uncertainty * 1000,
        "round_trip_ms": (reading.round_trip or 0) * 1000,
        "reached_at": reading.reached_at,
    }
    reached = "" if reading.reached_at is None else f"; advertised as {reading.host}, reached at {reading.reached_at}"
    shown = (
        f"{reading.role}: {_signed_ms(reading.offset)} +/- {ms(reading.uncertainty)} against this client's "
        f"clock (round trip {ms(reading.round_trip or 0)}){reached}"
    )
    if abs(reading.offset) - reading.uncertainty > margin:
        return Check(
            section="clocks",
            name=reading.host,
            verdict=WARN,
            measured=shown,
            fix=(
                "this machine's clock, or the server's, is off (run NTP or chrony on both); locks never read "
                "this machine's clock, but the server's must agree with the other servers'"
            ),
            figures=figures,
            key=key,
        )
    return Check(section="clocks", name=reading.host, verdict=PASS, measured=shown, fix=None, figures=figures, key=key)


def _agreement(deciding: Sequence[ClockReading], unknown: Sequence[str], margin: float, ttl: float) -> Check:
    """The agreement of the clocks that were read, judged as ``judge_clocks`` says; a pass turns
    into a warning while clocks that decide expiry are ``unknown``."""
    if unknown:
        total, verb = len(deciding) + len(unknown), "was" if len(deciding) == 1 else "were"
        read = f"{len(deciding)} of the {total} clocks that decide expiry {verb} read"
    else:
        read = "one clock decides expiry" if len(deciding) == 1 else f"{len(deciding)} clocks decide expiry"
    not_read = f"; not read: {', '.join(unknown)}, so whether they agree is unknown" if unknown else ""
    unread_fix = "read every clock that decides expiry (see the lines above)"
    ntp = "run NTP or chrony on every server that can decide expiry (docs: Deploying, Which clock decides expiry)"
    if len(deciding) == 1:
        figures = {"clocks": 1, "unknown": list(unknown), "safety_margin_ms": margin * 1000}
        shown = f"{read} ({_shown_host(deciding[0])}){not_read}; the safety margin of the {ttl:g} s TTL is {ms(margin)}"
        if unknown:
            return Check(
                section="clocks",
                name="agreement",
                verdict=WARN,
                measured=shown,
                fix=unread_fix,
                figures=figures,
            )
        return Check(section="clocks", name="agreement", verdict=PASS, measured=shown, fix=None, figures=figures)
    pairs = [(a, b) for index, a in enumerate(deciding) for b in deciding[index + 1 :]]

    def spread(pair: tuple[ClockReading, ClockReading]) -> tuple[float, float]:
        a, b = pair
        if a.offset is None or b.offset is None or a.uncertainty is None or b.uncertainty is None:
            raise RuntimeError("a clock that decides expiry, compared without its offset")  # only read ones compare
        return abs(a.offset - b.offset), a.uncertainty + b.uncertainty

    worst = max(pairs, key=lambda pair: spread(pair)[0])
    difference, uncertainty = spread(worst)
    figures = {
        "clocks": len(deciding),
        "unknown": list(unknown),
        "largest_difference_ms": difference * 1000,
        "uncertainty_ms": uncertainty * 1000,
        "between": [worst[0].host, worst[1].host],
        "safety_margin_ms": margin * 1000,
    }
    shown = (
        f"{read}; the largest difference is {ms(difference)} +/- "
        f"{ms(uncertainty)} ({worst[0].host} and {worst[1].host}){not_read}; the safety margin of the {ttl:g} s "
        f"TTL is {ms(margin)}"
    )
    if difference - uncertainty > margin:
        return Check(
            section="clocks",
            name="agreement",
            verdict=FAIL,
            measured=shown,
            fix=(
                f"a lease can be taken while its holder still believes it holds it: {ntp}; until then, raise the "
                f"safety margin above {ms(difference + uncertainty)}"
            ),
            figures=figures,
        )
    if difference + uncertainty > CLOCK_AGREEMENT_SHARE * margin:
        return Check(
            section="clocks",
            name="agreement",
            verdict=WARN,
            measured=shown,
            fix=(
                f"not shown to agree within {CLOCK_AGREEMENT_SHARE:.0%} of the safety margin: {ntp}"
                + (", and measure from closer to the servers (the round trips bound the precision)" if uncertainty
                > CLOCK_AGREEMENT_SHARE * margin else "")
            ),
            figures=figures,
        )  # fmt: skip
    if unknown:
        return Check(section="clocks", name="agreement", verdict=WARN, measured=shown, fix=unread_fix, figures=figures)
    return Check(section="clocks", name="agreement", verdict=PASS, measured=shown, fix=None, figures=figures)


def percent(share: float) -> str:
    """A share as a percentage: two significant digits below 10 % (0.023%, 4.5%), whole above (65%)."""
    return f"{share * 100:.2g}%" if share * 100 < 10 else f"{share:.0%}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _signed_ms(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + ms(abs(seconds))


# -- privileges ----------------------------------------------------------------------------------

ACCEPTED, REFUSED, NOT_TRIED = "accepted", "refused", "not tried"


def role_actions(privileges: Sequence[Mapping[str, Any]], collection: str) -> dict[str, list[str]]:
    """The actions of a documented role (``lock_privileges`` or ``operator_privileges``) by the
    resource they are on: ``"collection"`` or ``"database"``."""
    actions: dict[str, list[str]] = {"collection": [], "database": []}
    for privilege in privileges:
        on = "collection" if privilege["resource"].get("collection") == collection else "database"
        actions[on].extend(privilege["actions"])
    return actions


def covered(privileges: Sequence[Mapping[str, Any]], database: str, collection: str | None, action: str) -> bool:
    """Whether ``privileges`` (``connectionStatus``'s ``authenticatedUserPrivileges``) grant
    ``action`` on ``database.collection`` (``collection`` None: on the database itself), by MongoDB's
    resource patterns: ``{db, collection}``; ``{db, collection: ""}`` (every collection of a
    database); ``{db: "", collection}`` (that collection in every database); ``{db: "",
    collection: ""}``; ``{anyResource: true}``. (A ``{cluster: true}`` resource grants none of these.)"""
    for privilege in privileges:
        if action not in (privilege.get("actions") or ()):
            continue
        resource = privilege.get("resource") or {}
        if resource.get("anyResource") is True:
            return True
        if "db" not in resource or "collection" not in resource:
            continue
        if resource["db"] not in ("", database):
            continue
        if collection is None:
            if resource["collection"] == "":
                return True
        elif resource["collection"] in ("", collection):
            return True
    return False


def judge_privileges(
    attempts: Mapping[str, tuple[str, str]], auth: Mapping[str, Any], database: str, collection: str
) -> list[Check]:
    """The documented roles against what this user could do: each action ``attempts`` maps to
    (``accepted`` | ``refused`` | ``not tried``, detail), and ``auth`` is ``connectionStatus``'s
    ``authInfo``. An action refused when tried, or missing from the privileges the server lists,
    is missing: from the application's role a failure, from the operator's a warning."""
    users = auth.get("authenticatedUsers") or []
    listed = list(auth.get("authenticatedUserPrivileges") or [])
    checks = []
    for name, privileges, verdict in (
        ("lock role", lock_privileges(database, collection), FAIL),
        ("operator role", operator_privileges(database, collection), WARN),
    ):
        needed = role_actions(privileges, collection)
        missing: list[str] = []
        unknown: list[str] = []
        accepted: list[str] = []
        for on, actions in needed.items():
            for action in actions:
                outcome, detail = attempts.get(action, (NOT_TRIED, "no attempt for it"))
                in_list = covered(listed, database, collection if on == "collection" else None, action)
                if outcome == REFUSED:
                    missing.append(f"{action} (refused: {detail})")
                elif users and listed and not in_list:
                    missing.append(f"{action} (not in this user's privileges)")
                elif outcome == ACCEPTED:
                    accepted.append(action)
                elif not users or in_list:
                    accepted.append(f"{action} (granted)")
                else:
                    unknown.append(f"{action} ({detail})")
        figures = {
            "actions": [action for actions in needed.values() for action in actions],
            "missing": [entry.split(" ")[0] for entry in missing],
            "not_judged": [entry.split(" ")[0] for entry in unknown],
            "authentication": bool(users),
            "privileges_listed": bool(listed),
        }
        role = "lock_privileges" if name == "lock role" else "operator_privileges"
        where = f"{database}.{collection}"
        if missing:
            checks.append(
                Check(
                    section="privileges",
                    name=name,
                    verdict=verdict,
                    measured=f"missing on {where}: " + "; ".join(missing),
                    fix=(
                        f"grant the role built from mongolock_async.privileges.{role}({database!r}, {collection!r}) "
                        "(docs: Deploying, Least privileges)"
                    ),
                    figures=figures,
                )
            )
            continue
        parts = ["authentication is off: every action is allowed"] if not users else []
        if users and accepted:
            parts.append("allowed: " + ", ".join(accepted))
        if unknown:
            reason = "" if listed else "; the server listed no privileges for this user"
            parts.append("not judged: " + ", ".join(unknown) + reason)
        checks.append(Check(
            section="privileges",
            name=name,
            verdict=PASS,
            measured=f"on {where}: " + "; ".join(parts),
            fix=None,
            figures=figures,
        ))
    return checks


# -- the collection ------------------------------------------------------------------------------


def judge_indexes(indexes: Sequence[Mapping[str, Any]] | None, refused: str | None = None) -> Check:
    if indexes is None:
        return Check(
            section="collection",
            name="indexes",
            verdict=WARN,
            measured=f"not readable: {refused or 'listIndexes refused'}",
            fix="run the check as a user with the operator role (listIndexes)",
        )
    names = [str(index.get("name")) for index in indexes]
    figures: dict[str, Any] = {"indexes": names, "idle_cleanup_s": None}
    problems = []
    for index in indexes:
        name = index.get("name")
        seconds = index.get("expireAfterSeconds")
        if name == IDLE_CLEANUP_INDEX:
            figures["idle_cleanup_s"] = seconds
        if isinstance(seconds, int | float) and seconds < MIN_IDLE_CLEANUP_S:
            problems.append(
                f"TTL index {name!r} deletes documents {seconds:g} s after their {list(index.get('key', {}))} date, "
                "under an hour"
            )
        if index.get("unique") and name != "_id_":
            problems.append(f"unique index {name!r} on {list(index.get('key', {}))}")
    idle = figures["idle_cleanup_s"]
    shown = (", ".join(names) or "none (no collection yet)") + (
        f"; idle cleanup after {idle:g} s" if isinstance(idle, int | float) else "; no idle cleanup (optional)"
    )
    if problems:
        return Check(
            section="collection",
            name="indexes",
            verdict=WARN,
            measured=shown + "; " + "; ".join(problems),
            fix=(
                "drop it: a TTL index under an hour breaks the fencing tokens' floor (use "
                "ensure_idle_cleanup_index, at least 3600 s), and a unique index other than _id makes acquires fail "
                "with DuplicateKeyError"
            ),
            figures=figures,
        )
    return Check(section="collection", name="indexes", verdict=PASS, measured=shown, fix=None, figures=figures)


def repair_command(name: str, database: str, collection: str) -> str:
    """``mongolock release NAME --force`` for the lock ``name`` of ``database.collection``, each
    argument one shell word that is safe to show and to paste (see ``_inert.shell_word``)."""
    return " ".join(
        ["mongolock", "release", shell_word(name), "--force", "--db", shell_word(database), "--collection",
         shell_word(collection)]
    )  # fmt: skip


def judge_documents(
    total: int, documents: Sequence[Mapping[str, Any]], scanned_all: bool, database: str, collection: str
) -> list[Check]:
    """The size, readability and expired leases of the scanned lock documents (each carrying the
    server's ``_size`` and ``_expired``) of ``database.collection``."""
    largest = max(documents, key=lambda document: int(document.get("_size", 0)), default=None)
    size = int(largest.get("_size", 0)) if largest is not None else 0
    share = size / MAX_DOCUMENT_BYTES
    scope = "" if scanned_all else f" (the first {len(documents)} read)"
    figures: dict[str, Any] = {
        "documents": total,
        "scanned": len(documents),
        "largest_bytes": size,
        "largest_name": None if largest is None else largest.get("_id"),
        "largest_share_of_16mb": share,
    }
    shown = _count(total, "lock document") + (
        f"; the largest{scope} is {largest.get('_id')!r}, {size:,} bytes, {percent(share)} of the 16 MB limit"
        if largest is not None
        else ""
    )
    fix = (
        "a document this large holds a long queue or many permits: fewer waiting processes or a smaller limit per "
        "name keep each write small"
    )
    verdict = FAIL if share > DOCUMENT_FAIL_SHARE else WARN if share > DOCUMENT_WARN_SHARE else PASS
    checks = [Check(
        section="collection",
        name="documents",
        verdict=verdict,
        measured=shown,
        fix=None if verdict == PASS else fix,
        figures=figures,
    )]

    unreadable: list[tuple[str, str]] = []
    repairable: list[str] = []
    expired: list[str] = []
    for document in documents:
        plain = {key: value for key, value in document.items() if key not in ("_size", "_expired")}
        try:
            LockState.from_document(plain)
        except LockDataError as error:
            unreadable.append((repr(document.get("_id")), str(error)))
            if isinstance(document.get("_id"), str):
                repairable.append(document["_id"])
        if int(document.get("_expired", 0)) > 0:
            expired.append(repr(document.get("_id")))
    if unreadable:
        shown_names = "; ".join(f"{name}: {error}" for name, error in unreadable[:3])
        more = f" and {len(unreadable) - 3} more" if len(unreadable) > 3 else ""
        checks.append(
            Check(
                section="collection",
                name="readable",
                verdict=FAIL,
                measured=(
                    f"{_count(len(unreadable), 'document')} this library refuses (LockDataError){scope}: "
                    f"{shown_names}{more}"
                ),
                fix=(
                    "repair each with `mongolock release NAME --force` (MONGODB_URI set), which resets the lock "
                    "fields; or remove documents that are not locks from the lock collection"
                    + ("; the first:" if repairable else "")
                ),
                figures={"unreadable": [name for name, _ in unreadable]},
                command=repair_command(repairable[0], database, collection) if repairable else None,
            )
        )
    else:
        readable = f"every document{scope} is a lock this library reads"
        checks.append(Check(
            section="collection",
            name="readable",
            verdict=PASS,
            measured=readable,
            fix=None,
            figures={"unreadable": []},
        ))
    listing = ", ".join(expired[:3]) + (f" and {len(expired) - 3} more" if len(expired) > 3 else "")
    checks.append(
        Check(
            section="collection",
            name="expired leases",
            verdict=PASS,
            measured=(
                f"{_count(len(expired), 'document')}{scope} {'holds' if len(expired) == 1 else 'hold'} leases past "
                "their expiry, still marked held"
                + (f" ({listing}): holders that ended without releasing; the next acquire takes each over" if expired
                else "")
            ),
            fix=None,
            figures={"expired": len(expired), "names": expired[:20]},
        )
    )
    return checks


def judge_earlier_scratch(count: int, database: str, collection: str) -> Check | None:
    if not count:
        return None
    return Check(
        section="collection",
        name="left by earlier checks",
        verdict=WARN,
        measured=(
            f"{_count(count, 'document')} named mongolock-check-* left by an earlier check that was stopped during its "
            "clean-up"
        ),
        fix=(
            f"remove them: db.getSiblingDB({database!r}).getCollection({collection!r}).deleteMany("
            "{_id: /^mongolock-check-/}) while no check runs"
        ),
        figures={"documents": count},
    )


# -- performance ---------------------------------------------------------------------------------


def judge_uncontended(library: Sequence[float], raw: Sequence[float], ping: Sequence[float]) -> Check:
    ratio = statistics.median(library) / statistics.median(raw)
    figures = {
        "cycles": len(library),
        "library_p50_ms": percentile(library, 50) * 1000,
        "library_p99_ms": percentile(library, 99) * 1000,
        "raw_p50_ms": percentile(raw, 50) * 1000,
        "raw_p99_ms": percentile(raw, 99) * 1000,
        "ping_p50_ms": percentile(ping, 50) * 1000,
        "ratio": ratio,
        "warn_above": UNCONTENDED_WARN_RATIO,
    }
    shown = (
        f"acquire + release p50 {ms(percentile(library, 50))}, p99 {ms(percentile(library, 99))}; the same two "
        f"requests raw p50 {ms(percentile(raw, 50))}: {ratio:.2f}x (warn above {UNCONTENDED_WARN_RATIO:g}x); "
        f"ping p50 {ms(percentile(ping, 50))}"
    )
    if ratio > UNCONTENDED_WARN_RATIO:
        return Check(
            section="perf",
            name="uncontended",
            verdict=WARN,
            measured=shown,
            fix=(
                "the library's own work dominates: is this machine's CPU starved? (the raw requests ran interleaved, "
                "on the same client)"
            ),
            figures=figures,
        )
    return Check(section="perf", name="uncontended", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_hand_off(library: Sequence[float], raw: Sequence[float]) -> Check:
    ratio = statistics.median(library) / statistics.median(raw)
    figures = {
        "hand_offs": len(library),
        "library_p50_ms": percentile(library, 50) * 1000,
        "library_p99_ms": percentile(library, 99) * 1000,
        "raw_event_p50_ms": percentile(raw, 50) * 1000,
        "raw_event_p99_ms": percentile(raw, 99) * 1000,
        "ratio": ratio,
        "warn_above": HAND_OFF_WARN_RATIO,
    }
    shown = (
        f"release to the waiter's grant on another connection p50 {ms(percentile(library, 50))}, p99 "
        f"{ms(percentile(library, 99))}; a raw write's change event p50 {ms(percentile(raw, 50))}: {ratio:.2f}x "
        f"(warn above {HAND_OFF_WARN_RATIO:g}x)"
    )
    if ratio > HAND_OFF_WARN_RATIO:
        return Check(
            section="perf",
            name="hand-off",
            verdict=WARN,
            measured=shown,
            fix=(
                "hand-offs cost more than the change stream they ride on: look at the waiter's machine (CPU) and "
                "at the "
                "round trip of its claim"
            ),
            figures=figures,
        )
    return Check(section="perf", name="hand-off", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_hot_lock(rates: Mapping[int, float], raw_rate: float) -> Check:
    ratios = {tasks: rate / raw_rate for tasks, rate in rates.items()}
    figures = {
        "acquisitions_per_s": {str(tasks): rate for tasks, rate in rates.items()},
        "raw_acquire_release_per_s": raw_rate,
        "ratios": {str(tasks): ratio for tasks, ratio in ratios.items()},
        "warn_below": HOT_LOCK_WARN_RATIO,
    }
    shown = (
        ", ".join(f"{_count(tasks, 'task')} {rates[tasks]:.0f}/s ({ratios[tasks]:.2f}x)" for tasks in rates)
        + f" against the raw acquire + release rate {raw_rate:.0f}/s (warn below {HOT_LOCK_WARN_RATIO:g}x)"
    )
    slow = [tasks for tasks, ratio in ratios.items() if ratio < HOT_LOCK_WARN_RATIO]
    if slow:
        return Check(
            section="perf",
            name="hot lock",
            verdict=WARN,
            measured=shown,
            fix=(
                f"the lock serves fewer acquisitions than its raw requests allow (at {', '.join(map(str, slow))} "
                "tasks): is this machine's CPU starved?"
            ),
            figures=figures,
        )
    return Check(section="perf", name="hot lock", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_renewal(leases: int, library: float, raw: float, ttl: float) -> Check:
    """``library`` and ``raw``: seconds to renew all ``leases`` once."""
    ratio = library / raw
    interval = ttl / 3
    figures = {
        "leases": leases,
        "library_ms_per_lease": library / leases * 1000,
        "raw_ms_per_lease": raw / leases * 1000,
        "ratio": ratio,
        "renewal_s": library,
        "share_of_interval": library / interval,
        "warn_above": RENEWAL_WARN_RATIO,
    }
    shown = (
        f"{leases} leases renewed in {ms(library)} ({ms(library / leases)} per lease); a raw update batch "
        f"{ms(raw / leases)} per lease: {ratio:.2f}x (warn above {RENEWAL_WARN_RATIO:g}x); "
        f"{percent(library / interval)} of a {interval:.3g} s heartbeat interval"
    )
    if ratio > RENEWAL_WARN_RATIO:
        return Check(
            section="perf",
            name="heartbeat",
            verdict=WARN,
            measured=shown,
            fix="renewals cost more than plain updates: report it",
            figures=figures,
        )
    if library > RENEWAL_BUDGET_SHARE * interval:
        return Check(
            section="perf",
            name="heartbeat",
            verdict=WARN,
            measured=shown,
            fix=(
                f"renewing {leases} leases takes more than half a heartbeat interval: use a longer TTL, fewer leases "
                "per process, or spread them over more processes"
            ),
            figures=figures,
        )
    return Check(section="perf", name="heartbeat", verdict=PASS, measured=shown, fix=None, figures=figures)


def judge_sustained_load(
    library: Sequence[float], raw: Sequence[float], seconds: float, tasks: int, ttl: float
) -> Check:
    """The sustained load's p99 against the raw requests' (a ratio), and against the TTL (as the
    durability check judges a majority write's p99)."""
    ratio = percentile(library, 99) / percentile(raw, 99)
    p99 = percentile(library, 99)
    figures = {
        "seconds": seconds,
        "tasks": tasks,
        "cycles": len(library),
        "library_p50_ms": percentile(library, 50) * 1000,
        "library_p99_ms": p99 * 1000,
        "library_p999_ms": percentile(library, 99.9) * 1000,
        "library_max_ms": max(library) * 1000,
        "raw_p50_ms": percentile(raw, 50) * 1000,
        "raw_p99_ms": percentile(raw, 99) * 1000,
        "ratio_p99": ratio,
        "p99_share_of_ttl": p99 / ttl,
        "warn_above": SUSTAINED_WARN_RATIO,
    }
    shown = (
        f"{_count(tasks, 'task')} for {seconds:g} s, {len(library)} acquire + release cycles: p50 "
        f"{ms(percentile(library, 50))}, p99 {ms(p99)}, p99.9 {ms(percentile(library, 99.9))}, max {ms(max(library))}; "
        f"the raw requests p99 {ms(percentile(raw, 99))} over {len(raw)}: {ratio:.2f}x (warn above "
        f"{SUSTAINED_WARN_RATIO:g}x); p99 is {percent(p99 / ttl)} of the {ttl:g} s TTL"
    )
    if p99 > WRITE_WARN_SHARE * ttl:
        return Check(
            section="perf",
            name="sustained load",
            verdict=WARN,
            measured=shown,
            fix=(
                f"under load a lock's requests take more than "
                f"{percent(WRITE_WARN_SHARE)} of the TTL at p99: use a longer TTL, or find what slows majority "
                "writes"
            ),
            figures=figures,
        )  # fmt: skip
    if ratio > SUSTAINED_WARN_RATIO:
        starved = "is this machine's CPU starved? (the raw requests ran in the same tasks, taking turns)"
        return Check(
            section="perf",
            name="sustained load",
            verdict=WARN,
            measured=shown,
            fix=f"the library's own work dominates under load: {starved}",
            figures=figures,
        )  # fmt: skip
    return Check(section="perf", name="sustained load", verdict=PASS, measured=shown, fix=None, figures=figures)


# -- output --------------------------------------------------------------------------------------


def ordered(checks: Iterable[Check]) -> list[Check]:
    """By section, in the order of ``SECTIONS``; within a section, as they were made."""
    return sorted(checks, key=lambda check: SECTIONS.index(check.section))


def as_payload(checks: Sequence[Check], header: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--json`` output: the run's header, the exit code, counts per verdict, every check."""
    counts = {verdict: sum(check.verdict == verdict for check in checks) for verdict in (PASS, WARN, FAIL, SKIP)}
    payload = {
        "format": JSON_FORMAT,
        **header,
        "exit_code": exit_code(checks),
        "counts": counts,
        "checks": [check.as_dict() for check in ordered(checks)],
    }
    # Round-tripped so that what is printed is plain JSON types (figures may hold dates).
    loaded: dict[str, Any] = json.loads(json.dumps(payload, default=str))
    return loaded


def as_text(checks: Sequence[Check], width: int | None = None) -> list[str]:
    """One line per check (wrapped to ``width``), under its section's title; the fix below it. Lock
    names and server messages in them are shown printable (see ``_inert.printable``)."""
    width = width or _width()
    lines: list[str] = []
    section = None
    for check in ordered(checks):
        if check.section != section:
            section = check.section
            lines.append(_TITLES[section])
        head = f"  {check.verdict.upper():4}  {check.name:<{_LABEL}}  "
        lines.extend(_wrapped(printable(check.measured), width, head, _TEXT) or [head.rstrip()])
        if check.fix:
            lines.extend(_wrapped(printable(f"fix: {check.fix}"), width, " " * _TEXT, _TEXT + 5))
        if check.command:
            lines.append(" " * (_TEXT + 5) + printable(check.command))
    return lines


_LABEL = 15
_TEXT = 8 + _LABEL + 2  # where the measured text starts: after the verdict and the label


# A number and its unit, and MongoDB's `w: 1`, stay on one line.
_KEEP_TOGETHER = re.compile(r"(?<=\d) (?=(ms|s|MB|bytes)\b)|(?<=w:) (?=1\b)")
_GLUE = "\x00"


def _wrapped(text: str, width: int, first: str, indent: int) -> list[str]:
    indented = " " * indent
    lines = textwrap.wrap(
        _KEEP_TOGETHER.sub(_GLUE, text),
        width,
        initial_indent=first,
        subsequent_indent=indented,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace(_GLUE, " ") for line in lines]


def summary(checks: Sequence[Check]) -> str:
    counted = {verdict: sum(check.verdict == verdict for check in checks) for verdict in (PASS, WARN, FAIL, SKIP)}
    skipped_text = f", {counted[SKIP]} skipped" if counted[SKIP] else ""
    return (
        f"{counted[PASS]} passed, {_count(counted[WARN], 'warning')}, {_count(counted[FAIL], 'failure')}"
        f"{skipped_text}"
    )


def paragraph(text: str, width: int | None = None) -> list[str]:
    """``text`` wrapped to ``width`` (the terminal's, or 110 columns when not on one), later lines
    indented by two."""
    return _wrapped(text, width or _width(), "", 2)


def _width() -> int:
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return max(60, shutil.get_terminal_size().columns - 1)
    return 110
