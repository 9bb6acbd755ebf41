"""The test run's own settings, and the environment a child process gets without them."""

from __future__ import annotations

import os

SHARDED = os.environ.get("MONGOLOCK_TEST_SHARDED") == "1"
"""Whether every fresh lock collection is sharded (``MONGOLOCK_TEST_SHARDED=1``, against a mongos)."""

# What configures this test run, read by the package's pytest plugin and tests/conftest.py: the
# server (MONGODB_URI, MONGOLOCK_TEST_ADMIN_URI), the drivers, sharding, what the workflow expects. A child
# process (a user's project, a docs example, a worker, the command) must not inherit them: the
# plugin in a child pytest would restrict its drivers or shard its collections on a server that
# cannot, and a child that needs a server is given its URI.
_RUN_SETTINGS = ("MONGODB_URI", "MONGOLOCK_", "PYTEST_ADDOPTS")


def child_environment(**variables: str) -> dict[str, str]:
    """The environment for a child process: this process's, without the test run's own settings
    (``MONGODB_URI``, ``MONGOLOCK_*``, and ``PYTEST_ADDOPTS``, which would select a user project's
    tests), plus ``variables``."""
    inherited = {key: value for key, value in os.environ.items() if not key.startswith(_RUN_SETTINGS)}
    return {**inherited, **variables}
