"""A dashboard page of a lock collection, live: who holds what and for how long, who waits, the last
events, and a timeline of the last minutes per lock. One HTML page with its script and style inline
(nothing from the internet, no build step), fed by server-sent events from one
[`LockWatch`][mongolock_async.live.LockWatch] shared by every open page.

```python
from fastapi import FastAPI
from mongolock_async.dashboard import Dashboard

app = FastAPI()
app.mount("/locks", Dashboard(collection))  # the page at /locks/
```

[`Dashboard`][mongolock_async.dashboard.Dashboard] is a plain ASGI application: FastAPI and
Starlette mount it, uvicorn serves it (``mongolock dashboard`` does, with the ``dashboard`` extra),
and [`Dashboard.aiohttp_app`][mongolock_async.dashboard.Dashboard.aiohttp_app] gives an aiohttp
sub-application of it. It needs no web framework itself.

It is read-only unless built with ``allow_release=True``: then each held lock has a button that
breaks its lease (what ``mongolock release --force`` does) after the page asks for the lock's name
to be typed, sending a token only the page has; the server checks the token, the origin and the
typed name, and logs each release at WARNING (logger ``mongolock_async.audit``) with the client's
address and user agent. Anyone who can load the page can use the button: mount it behind your
application's authentication. The page shows names, labels and hosts as text, never as markup, and
forbids every script but its own (Content-Security-Policy); the view sends MongoDB reads only, so
a user with the built-in ``read`` role is enough (and ``update`` for releases).
"""

from .admin.dashboard import Dashboard

__all__ = [
    "Dashboard",
]
