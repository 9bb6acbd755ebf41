"""Which tests run on a server of their own rather than the server under test, found in their
source (the run's header lists them, tests/conftest.py, so that a workflow job's log shows what did
not run on the MongoDB it was given).

- A test that needs a private server (it stops, restarts, kills or pauses the server, or needs an
  empty one) says why in its docstring, in a sentence that begins ``Private server:``. Every test
  that takes the ``private_server`` fixture has one (tests/ops/test_workflow.py checks it); a test
  that starts one its own way (the fenced soak's restarts) may have one too.
- Tests that start a server of another configuration (access control, TLS, a standalone server,
  no test commands, a shifted clock) or test the embedded server itself construct it in their body,
  or through a function of their module (a fixture, a helper): those are counted by file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

PRIVATE = "Private server:"
_REASON = re.compile(r"Private server:\s*(.+?\.)(?:\s|$)", re.DOTALL)
_OWN_SERVERS = ("EmbeddedMongo(", "SteppedServerClock(", "StandIn(")
"""What a test or fixture that starts a server of its own calls (tests/support/server_clock.py,
tests/support/standins.py)."""


@dataclass(frozen=True)
class PrivateServerTest:
    test: str
    """``path::name``, relative to the repository."""
    reason: str | None
    """Its docstring's ``Private server:`` sentence; None if it has none."""
    takes_fixture: bool
    """Whether it takes the ``private_server`` fixture."""


def _tests_in(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
            found.append(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found.extend(
                item
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test_")
            )
    return found


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {argument.arg for argument in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}


def _text(lines: list[str], node: ast.stmt) -> str:
    """A statement's source (``ast.get_source_segment`` splits the whole source on each call)."""
    return "\n".join(lines[node.lineno - 1 : node.end_lineno])


def private_server_tests(root: Path) -> list[PrivateServerTest]:
    """The tests under ``root/tests`` that take ``private_server`` or say ``Private server:``."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        source = path.read_text()
        if "private_server" not in source and PRIVATE not in source:
            continue
        for test in _tests_in(ast.parse(source)):
            docstring = " ".join((ast.get_docstring(test) or "").split())
            takes = "private_server" in _parameters(test)
            reason = _REASON.search(docstring)
            if takes or reason:
                name = f"{path.relative_to(root)}::{test.name}"
                said = reason.group(1).replace("``", "") if reason else None
                found.append(PrivateServerTest(name, said, takes))
    return found


def own_configuration_tests(root: Path) -> dict[str, int]:
    """Per test file (relative to ``root``), how many of its test functions (not those that take
    ``private_server``) start a server of their own: in their body, or through a function of the
    module (a fixture they take, a helper they call) that does."""
    counts: dict[str, int] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        source = path.read_text()
        if not any(call in source for call in _OWN_SERVERS):
            continue
        tree, lines = ast.parse(source), source.splitlines()
        starters = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(call in _text(lines, node) for call in _OWN_SERVERS)
        }
        count = 0
        for test in _tests_in(tree):
            parameters = _parameters(test)
            body = _text(lines, test)
            if "private_server" in parameters:
                continue
            calls = any(call in body for call in (*_OWN_SERVERS, *(f"{name}(" for name in starters)))
            if calls or parameters & starters:
                count += 1
        if count:
            counts[str(path.relative_to(root))] = count
    return counts
