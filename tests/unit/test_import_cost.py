"""What ``import mongolock_async`` loads: the locks, not the operator console.

A service that only takes locks should not pay for the live view, the dashboard, the command or
the web frameworks they use; ``LockManager`` imports those on first use.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.run_settings import child_environment

CONSOLE = (
    "mongolock_async._cli",
    "mongolock_async.admin.dashboard",
    "mongolock_async.admin.live",
    "mongolock_async.admin.operations",
    "fastapi",
    "starlette",
    "uvicorn",
    "aiohttp",
    "rich",
)


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``statement``."""
    script = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=child_environment()
    ).stdout
    return set(output.split())


def test_importing_the_package_loads_no_operator_console() -> None:
    loaded = loaded_after("import mongolock_async")
    assert "mongolock_async._core.lock" in loaded
    assert sorted(name for name in loaded if name in CONSOLE or name.startswith(tuple(f"{c}." for c in CONSOLE))) == []


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("import mongolock_async.dashboard", "mongolock_async.admin.dashboard"),
        ("from mongolock_async import LockManager; LockManager.watch", "mongolock_async._core.manager"),
    ],
)
def test_the_check_sees_what_a_statement_loads(statement: str, expected: str) -> None:
    """The control: the same check sees the modules a statement does load."""
    assert expected in loaded_after(statement)


def test_the_console_loads_on_first_use() -> None:
    loaded = loaded_after(
        "from pymongo import AsyncMongoClient\n"
        "from mongolock_async import LockManager\n"
        "LockManager(AsyncMongoClient('mongodb://127.0.0.1:1', connect=False).db.locks).watch()"
    )
    assert "mongolock_async.admin.live" in loaded
