"""Every MongoDB query the library sends, and nothing else.

- ``lockstore``: ``LockStore`` (one method per request) and ``store_for``.
- ``requests``: what a request asks for (``PlaceRequest``, ``Permits``, ``Renewal``) and the shapes
  of what is sent (``Filter``, ``Stage``, ``Pipeline``); imports nothing else of the store.
- ``kinds``: which queries serve each kind of document (``KindQueries``, ``queries_for``), and
  ``of_kind``.
- ``documents``: lock documents as read back, checked field by field; ``job_state``: a job's
  state judged from its document on the server's clock.
- ``expressions``: what every kind's pipelines share (the server's clock, a request's values, lease
  and fence checks, the queue of places).
- ``mutex``: a lock's document. ``permits``: a semaphore's, a read-write lock's, an election's
  (``permit_release``: how a permit's release hands it on). ``jobs``: a job's.
- ``sending``: every request bounded and finished whatever happens to its caller; the
  ``findAndModify`` of acquires and releases; the version check; which errors a retry may fix.
- ``streams``: change streams and sessions. ``reports``: reads for operators and observers, and
  the break-glass release. ``views``: what the live views (``mongolock watch``, the dashboard)
  send: the change stream of every write, the server's clock, whether the collection exists.
  ``probe``: what ``mongolock check`` sends to judge a deployment.
"""

from .expressions import MAX_TTL_MS, SERVER_NOW
from .jobs import MAX_ATTEMPTS_LIMIT, JobSchedule
from .kinds import of_kind, queries_for
from .lockstore import IDLE_CLEANUP_INDEX, LockStore, store_for
from .reports import ForcedRelease
from .requests import Permits, PlaceRequest, Renewal
from .sending import NO_SERVER_WARNING_AFTER, is_transient, oldest_wire_version
from .views import change_streams_refused, change_streams_unsupported

__all__ = [
    "IDLE_CLEANUP_INDEX",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_TTL_MS",
    "NO_SERVER_WARNING_AFTER",
    "SERVER_NOW",
    "ForcedRelease",
    "JobSchedule",
    "LockStore",
    "Permits",
    "PlaceRequest",
    "Renewal",
    "change_streams_refused",
    "change_streams_unsupported",
    "is_transient",
    "of_kind",
    "oldest_wire_version",
    "queries_for",
    "store_for",
]
