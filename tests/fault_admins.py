"""The administrator's client of the current test's fault server, shared by tests/conftest.py and
the tests (pytest imports conftest.py as ``conftest`` and the tests import it as ``tests.conftest``:
two modules, so state kept in either is not the other's)."""

from __future__ import annotations

from typing import Any

in_use: list[Any] = []
