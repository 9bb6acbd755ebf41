"""aiohttp: hold a lock while a handler runs (the ``aiohttp`` extra; from a checkout:
``pip install '.[aiohttp]'``).

```python
locks = LockManager(collection, ttl=10, timeout=2)

@routes.post("/items/{sku}/buy")
@hold_lock(locks, lambda request: "stock:" + request.match_info["sku"])
async def buy(request: web.Request) -> web.Response:
    lock = request[LOCK]  # the held AsyncMongoLock, for its fencing token
    ...
```
"""

from .integrations.aiohttp import LOCK, Handler, HTTPLocked, ManagerOf, NameOf, hold_lock, limit_concurrency

__all__ = [
    "Handler",
    "hold_lock",
    "HTTPLocked",
    "limit_concurrency",
    "LOCK",
    "ManagerOf",
    "NameOf",
]
