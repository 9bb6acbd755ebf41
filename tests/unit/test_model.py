"""The models (model/lease.pml, the lease protocol of a lock's document and of a document of
permits; model/jobs.pml, a job's periods) and the store keep each other honest: every write the
store can send, found in the store's source as it is now, is named in model/actions.md by the
actions of a model that model it, one per kind of document it writes (or said to be outside them,
and why); every action the table names is one a model has; and each action's ``WRITES`` line is
the fields the store's pipeline for it writes. (The models themselves are checked by ``make model``.)"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mongolock_async.store import expressions, jobs, mutex, permit_release, permits
from mongolock_async.store.jobs import JobSchedule
from mongolock_async.store.requests import Permits, PlaceRequest

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "mongolock_async" / "store"
MODEL = ROOT / "model" / "lease.pml"
JOBS_MODEL = ROOT / "model" / "jobs.pml"
TABLE = ROOT / "model" / "actions.md"

# What sends a write to a collection: its write methods, a bulk write's statements, and the
# findAndModify command the store builds (sending.find_and_modify_command, whose callers send it).
_WRITE_CALLS = {
    "find_one_and_update", "find_one_and_replace", "find_one_and_delete", "update_one", "update_many",
    "replace_one", "insert_one", "insert_many", "delete_one", "delete_many", "bulk_write",
    "UpdateOne", "UpdateMany", "ReplaceOne", "InsertOne", "DeleteOne", "DeleteMany", "find_and_modify_command",
}  # fmt: skip
_WRITE_COMMANDS = {"findAndModify", "update", "insert", "delete"}
_COMMAND_BUILDER = "sending.find_and_modify_command"


def _writes_in(source: str, module: str) -> Iterator[tuple[str, int]]:
    """(``module.Class.function``, line) of each write sent in ``source``."""

    def visit(node: ast.AST, scope: list[str]) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield from visit(child, [*scope, child.name])
                continue
            site = ".".join([module, *scope])
            if isinstance(child, ast.Call):
                called = child.func
                name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
                if name in _WRITE_CALLS:
                    yield site, child.lineno
            if isinstance(child, ast.Dict) and child.keys:
                first = child.keys[0]
                if isinstance(first, ast.Constant) and first.value in _WRITE_COMMANDS:
                    yield site, child.lineno
            yield from visit(child, scope)

    yield from visit(ast.parse(source), [])


def store_writes() -> dict[str, list[int]]:
    """Every function of the store that sends a write, with the lines where it does."""
    found: dict[str, list[int]] = {}
    for path in sorted(STORE.glob("*.py")):
        for site, line in _writes_in(path.read_text(), path.stem):
            if site != _COMMAND_BUILDER:
                found.setdefault(site, []).append(line)
    return found


def table() -> dict[str, str]:
    """model/actions.md's rows: store write -> model actions, comma-separated (or ``outside: why``)."""
    rows: dict[str, str] = {}
    for line in TABLE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("store write", "") or set(cells[0]) <= {"-"}:
            continue
        assert cells[0] not in rows, f"model/actions.md names {cells[0]} twice"
        rows[cells[0]] = cells[1]
    return rows


def named(cell: str) -> list[str]:
    """The actions a row of model/actions.md names (none for ``outside: why``)."""
    return [] if cell.startswith("outside:") else [name.strip() for name in cell.split(",")]


def model_actions() -> dict[str, set[str]]:
    """The models' actions (their ``ACTION name:`` comments) and the fields each says it writes."""
    actions: dict[str, set[str]] = {}
    for model in (MODEL, JOBS_MODEL):
        for match in re.finditer(r"/\* ACTION (\w+):(?:(?!\*/).)*?\n \* WRITES ([^\n]*)", model.read_text(), re.S):
            assert match.group(1) not in actions, f"two models have an ACTION {match.group(1)}"
            actions[match.group(1)] = set(match.group(2).split())
    return actions


def _pipeline_fields(pipeline: Sequence[Mapping[str, Any]]) -> set[str]:
    """The document fields a pipeline update writes (its temporaries, named ``_...``, and a field
    set to itself left out)."""
    fields: set[str] = set()
    for stage in pipeline:
        for operator, argument in stage.items():
            if operator in ("$set", "$addFields"):
                fields |= {name for name, value in argument.items() if not name.startswith("_") and value != f"${name}"}
            elif operator == "$unset":
                names = [argument] if isinstance(argument, str) else list(argument)
                fields |= {name for name in names if not name.startswith("_")}
    return fields


def _bool_shapes(*names: str) -> Iterator[dict[str, bool]]:
    for bits in range(2 ** len(names)):
        yield {name: bool(bits >> index & 1) for index, name in enumerate(names)}


def _place(token: str, follower: PlaceRequest | None = None) -> PlaceRequest:
    return PlaceRequest(token, 1000, {"host": "h", "pid": 1}, follower)


def store_fields() -> dict[str, set[str]]:
    """The fields the store's lock pipelines write, per model action, over every shape of each."""
    follower = _place("f")
    acquire: set[str] = set()
    for shape in _bool_shapes("enqueue", "fair"):
        for place in (_place("a"), _place("a", follower)):
            acquire |= _pipeline_fields(mutex.acquire_pipeline(place, **shape))
    release: set[str] = set()
    for shape in _bool_shapes("fair", "successor_first"):
        for successor in (None, _place("s"), _place("s", follower)):
            fair, first = shape["fair"], shape["successor_first"]
            release |= _pipeline_fields(mutex.release_pipeline("o", successor, fair=fair, successor_first=first))
    withdraw: set[str] = set()
    for fair in (False, True):
        leave = mutex.release_pipeline(None, None, fair=fair, successor_first=False, leaving=["a"])
        withdraw |= _pipeline_fields(leave)
    start: set[str] = set()
    for schedule in (JobSchedule(), JobSchedule(every_ms=1000, offset_ms=10, min_interval_ms=5, max_attempts=2)):
        start |= _pipeline_fields(jobs.start_pipeline("o", 1000, {"host": "h"}, schedule))
    finish: set[str] = set()
    for outcome, hold in (("succeeded", None), ("failed", 500), ("lost", None)):
        finish |= _pipeline_fields(jobs.finish_pipeline("o", outcome, None, hold))
    force: set[str] = set()
    for repair in (False, True):
        force |= _pipeline_fields(mutex.force_release_pipeline("stamp", repair=repair))
    # Documents of permits: a semaphore's and an election's (the read-write lock's share the pipelines).
    kinds = (Permits("semaphore", 2), Permits("election", 1))
    permit_acquire: set[str] = set()
    returned: set[str] = set()
    permit_withdraw: set[str] = set()
    for kind in kinds:
        for shape in _bool_shapes("enqueue", "fair"):
            permit_acquire |= _pipeline_fields(permits.acquire_pipeline(_place("a"), kind, **shape))
        for shape in _bool_shapes("fair", "successor_first"):
            for successor in (None, _place("s")):
                fair, first = shape["fair"], shape["successor_first"]
                handing = permit_release.release_pipeline("o", successor, kind, fair=fair, successor_first=first)
                returned |= _pipeline_fields(handing)
        for fair in (False, True):
            leave = permit_release.release_pipeline(None, None, kind, fair=fair, successor_first=False, leaving=["a"])
            permit_withdraw |= _pipeline_fields(leave)
    permit_force: set[str] = set()
    for owner in (None, "o"):
        for live in (False, True):
            permit_force |= _pipeline_fields(permits.force_release_pipeline("stamp", owner, live=live))
    return {
        "acquire": acquire,
        "release": release,
        "withdraw": withdraw,
        "renew": _pipeline_fields(mutex.renewal_pipeline(1000, "stamp")),
        "refresh_place": _pipeline_fields(expressions.refresh_place("a", 1000)),
        "force_release": force,
        "start_job": start,
        "finish_job": finish,
        "permit_acquire": permit_acquire,
        "permit_release": returned,
        "permit_withdraw": permit_withdraw,
        "permit_renew": _pipeline_fields(permits.renewal_pipeline("o", 1000, "stamp")),
        "permit_force_release": permit_force,
        "put_first": _pipeline_fields(permits.put_first_pipeline("election", "n", "o", "label")[1]),
    }


def test_every_write_the_store_sends_is_named_by_one_model_action() -> None:
    writes, rows, actions = store_writes(), table(), model_actions()
    assert writes, "found no write in the store: the scan is broken"
    missing = sorted(set(writes) - set(rows))
    where = {site: writes[site] for site in missing}
    assert not missing, f"writes the store sends that model/actions.md does not name (at lines): {where}"
    stale = sorted(set(rows) - set(writes))
    assert not stale, f"model/actions.md names writes the store no longer sends: {stale}"
    for site, action in rows.items():
        if action.startswith("outside:"):
            assert len(action) > len("outside:") + 10, f"{site}: say why it is outside the model"
        for name in named(action):
            assert name in actions, f"{site}: the models have no ACTION {name} (they have {sorted(actions)})"
    unused = sorted(set(actions) - {name for action in rows.values() for name in named(action)})
    assert not unused, f"model actions no store write is named by: {unused}"


def test_each_model_action_writes_the_fields_the_store_pipeline_writes() -> None:
    actions, fields = model_actions(), store_fields()
    assert set(fields) == set(actions), "every action of the model has its pipeline here, and only those"
    for action, written in fields.items():
        assert actions[action] == written, (
            f"ACTION {action}: the model says it writes {sorted(actions[action])}, the store's pipeline "
            f"writes {sorted(written)} (added: {sorted(written - actions[action])}, "
            f"gone: {sorted(actions[action] - written)})"
        )


def _check_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_check", ROOT / "model" / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _switches(model: Path) -> dict[str, str]:
    return {
        match.group(1).lower().replace("_", "-"): match.group(2)
        for match in re.finditer(r"#define MUT_(\w+) (\d+)", model.read_text())
    }


def test_the_controls_switches_are_the_models() -> None:
    """model/check.py turns each control on by the number its model (lease.pml, jobs.pml) gives
    its MUT_ switch, and every control and finding names the property it must refute."""
    check = _check_script()
    assert _switches(MODEL) == check.MUT
    assert _switches(JOBS_MODEL) == check.JOBS_MUT
    for run in check.CONTROLS + check.FINDINGS:
        assert run.refutes, f"{run.name} names no property"
        defined = _switches(ROOT / "model" / f"{run.model}.pml")
        assert run.finding or run.settings["MUT"] in defined.values(), f"{run.name}: no such switch"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("async def f(c):\n    await c.update_one({}, {})\n", {"m.f"}),
        ("class S:\n    def g(self):\n        return UpdateOne({}, [])\n", {"m.S.g"}),
        ("def h():\n    return {'findAndModify': 'x', 'update': []}\n", {"m.h"}),
        ("def r(c):\n    return c.find_one({})\n", set()),
    ],
)
def test_the_scan_finds_writes(source: str, expected: set[str]) -> None:
    """The drift test's scan of the store's source sees each way the store sends a write, and no read."""
    assert {site for site, _ in _writes_in(source, "m")} == expected
