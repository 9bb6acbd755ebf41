"""Complete programs that use the library, installed with it. Each runs in one command against
``mongolock server`` (the embedded server, on its default port), or the server in ``MONGODB_URI``,
and seeds the data it needs:

    mongolock server                                    # in another terminal
    python -m mongolock_async.examples.fastapi_app      # a flash sale on http://127.0.0.1:8000 (fastapi extra)
    python -m mongolock_async.examples.aiohttp_app      # the same on http://127.0.0.1:8080 (aiohttp extra)
    python -m mongolock_async.examples.worker           # workers sharing a queue of items
    python -m mongolock_async.examples.scheduled_job    # a job three replicas start; one runs it

The guides show what each prints.
"""

import os


def mongodb_uri() -> str:
    """``MONGODB_URI``, else where ``mongolock server`` listens by default."""
    return os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017/?directConnection=true")
