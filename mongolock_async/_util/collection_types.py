"""The type of the ``collection`` argument."""

from __future__ import annotations

from typing import Any, Protocol


class AsyncCollectionLike(Protocol):
    """A PyMongo ``AsyncCollection`` or a Motor collection.

    Only the attributes every collection has are spelled out here; which methods are awaitable (a
    blocking ``pymongo`` collection is refused) is checked when a lock is created.
    """

    @property
    def name(self) -> str: ...

    @property
    def full_name(self) -> str: ...

    @property
    def database(self) -> Any: ...
