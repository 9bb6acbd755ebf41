"""Complete programs that use the library, installed with it. Each runs in one command against
``mongolock server`` (the embedded server, on its default port), or the server in ``MONGODB_URI``,
and seeds the data it needs:

    mongolock server                                    # in another terminal
    python -m mongolock_async.examples.fastapi_app      # a flash sale on http://127.0.0.1:8000 (fastapi extra)
    python -m mongolock_async.examples.aiohttp_app      # the same on http://127.0.0.1:8080 (aiohttp extra)
    python -m mongolock_async.examples.worker           # workers sharing a queue of items
    python -m mongolock_async.examples.scheduled_job    # a job three replicas start; one runs it

Their locks are in ``mongolock.locks``, where ``mongolock list`` looks by default (or where
``MONGOLOCK_DB`` and ``MONGOLOCK_COLLECTION`` say, as for the command); their data (a shop's items,
a queue) is in a database of each example's own. The guides show what each prints.
"""

import os
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection


def mongodb_uri() -> str:
    """``MONGODB_URI``, else where ``mongolock server`` listens by default."""
    return os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017/?directConnection=true")


def lock_collection(client: AsyncMongoClient[dict[str, Any]]) -> AsyncCollection[dict[str, Any]]:
    """The examples' locks: ``mongolock.locks`` (the ``mongolock`` command's default, so that
    ``mongolock list`` shows them), or ``MONGOLOCK_DB``.``MONGOLOCK_COLLECTION`` when set."""
    return client[os.environ.get("MONGOLOCK_DB", "mongolock")][os.environ.get("MONGOLOCK_COLLECTION", "locks")]
