"""Testing helpers: an embedded MongoDB server, server selection, and pytest fixtures.

The pytest fixtures live in
[`mongolock_async.testing.pytest_plugin`][mongolock_async.testing.pytest_plugin]; enable them with
``pytest_plugins = ["mongolock_async.testing.pytest_plugin"]`` in a ``conftest.py``.
"""

from .selection import ServerChoice, docker_engine_answers, select_server
from .server import EmbeddedMongo, EmbeddedServerError, EmbeddedTLS

__all__ = [
    "EmbeddedMongo",
    "EmbeddedServerError",
    "EmbeddedTLS",
    "ServerChoice",
    "docker_engine_answers",
    "select_server",
]
