"""The public surface, compared with a committed snapshot (tests/unit/public_surface.txt).

Every name in ``__all__`` of each public module, with its signature (a class: its own, and each
public method's, property's and attribute's), so that moving or renaming code inside the package
cannot change what users import without this test failing. The diff it prints is the review: when
a change is intended, write the snapshot again with ``MONGOLOCK_WRITE_SURFACE=1 pytest
tests/unit/test_public_surface.py`` and commit it with the change.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("public_surface.txt")

PUBLIC_MODULES = (
    "mongolock_async",
    "mongolock_async.aiohttp",
    "mongolock_async.dashboard",
    "mongolock_async.errors",
    "mongolock_async.fastapi",
    "mongolock_async.fencing",
    "mongolock_async.hooks",
    "mongolock_async.jobs",
    "mongolock_async.live",
    "mongolock_async.operations",
    "mongolock_async.opentelemetry",
    "mongolock_async.privileges",
    "mongolock_async.testing",
)
"""The modules the API reference (docs/reference/) documents and users import from (each has ``__all__``)."""


def test_the_public_surface_matches_its_snapshot() -> None:
    surface = "".join(f"{line}\n" for line in public_surface())
    if os.environ.get("MONGOLOCK_WRITE_SURFACE"):
        SNAPSHOT.write_text(surface)
    expected = SNAPSHOT.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), surface.splitlines(True), "snapshot", "now"))
    assert surface == expected, f"the public surface changed:\n{diff}"


def test_the_snapshot_sees_a_changed_signature(monkeypatch: Any) -> None:
    """The control: a keyword added to a public function shows in the surface."""
    from mongolock_async import operations

    def list_locks(collection: Any, *, prefix: str | None = None, held: bool = False, extra: int = 0) -> None: ...

    before = public_surface()
    monkeypatch.setattr(operations, "list_locks", list_locks)
    after = public_surface()
    changed = [line for line in after if line not in before]
    assert changed == ["mongolock_async.operations.list_locks: function(collection: 'Any', *, prefix: 'str | None' "
                       "= None, held: 'bool' = False, extra: 'int' = 0) -> 'None'"]


def public_surface() -> list[str]:
    """One line per public name (and per public member of a public class)."""
    lines: list[str] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(module.__all__):
            value = getattr(module, name)
            lines.append(f"{module_name}.{name}: {_described(value)}")
            if inspect.isclass(value):
                lines.extend(f"{module_name}.{name}.{member}: {kind}" for member, kind in _members(value))
    return lines


def _members(cls: type) -> list[tuple[str, str]]:
    fields = getattr(cls, "__annotations__", {})
    members = [(field, f"field: {annotation}") for field, annotation in fields.items() if not field.startswith("_")]
    for member, value in vars(cls).items():
        if (member.startswith("_") and member != "__init__") or member in fields:
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        members.append((member, _described(value)))
    return sorted(members)


def _described(value: Any) -> str:
    if isinstance(value, property):
        return f"property: {_return_annotation(value.fget)}"
    if inspect.isclass(value):
        bases = ", ".join(base.__qualname__ for base in value.__bases__)
        return f"class({bases}){_signature(value)}"
    if inspect.isfunction(value) or inspect.ismethod(value):
        kind = "async function" if inspect.iscoroutinefunction(value) else "function"
        return f"{kind}{_signature(value)}"
    if callable(value) and hasattr(value, "__wrapped__"):  # a decorated function (a pytest fixture)
        return f"wrapped function{_signature(value.__wrapped__)}"
    return f"value: {_value_repr(value)}"


def _signature(value: Any) -> str:
    try:
        return str(inspect.signature(value))
    except (TypeError, ValueError):
        return "(...)"


def _return_annotation(function: Any) -> str:
    return str(inspect.signature(function).return_annotation) if function is not None else "?"


def _value_repr(value: Any) -> str:
    text = repr(value)
    # An object's default repr names its address, which differs in every run.
    if " at 0x" in text:
        return type(value).__qualname__
    # A type alias names the module that defines each class: the class is the surface, not where it lives.
    return re.sub(r"\bmongolock_async\.(?:[a-z_]+\.)+([A-Z]\w*)", r"\1", text)
