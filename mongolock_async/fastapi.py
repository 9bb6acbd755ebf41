"""FastAPI: hold a lock while a path operation runs (the ``fastapi`` extra; from a checkout:
``pip install '.[fastapi]'``).

```python
locks = LockManager(collection, ttl=10, timeout=2)

def stock_lock(request: Request) -> str:
    return f"stock:{request.path_params['sku']}"

@app.post("/items/{sku}/buy")
async def buy(sku: str, lock: Annotated[AsyncMongoLock, hold_lock(locks, stock_lock)]) -> dict[str, str]:
    ...
```
"""

from .integrations.fastapi import ManagerOf, NameOf, hold_lock, limit_concurrency

__all__ = [
    "hold_lock",
    "limit_concurrency",
    "ManagerOf",
    "NameOf",
]
