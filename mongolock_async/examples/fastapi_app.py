"""A flash sale on FastAPI: many buyers, a small stock, never oversold.

    mongolock server                                  # in another terminal (or set MONGODB_URI)
    python -m mongolock_async.examples.fastapi_app    # http://127.0.0.1:8000; --workers 2 for two processes
    curl -X POST http://127.0.0.1:8000/items/sku-1/buy

Each purchase reads the stock, waits a moment (a payment call, say), then writes it back: without
the lock two buyers could both read the last unit. With it, one buyer per item at a time, in every
worker process. A buyer that cannot get the lock within 2 s gets 423 Locked; if MongoDB cannot be
reached, 503. The app seeds three items into an empty ``shop`` database when it starts; its locks
are in ``mongolock.locks``, where ``mongolock list`` shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, LockManager
from mongolock_async.examples import lock_collection, mongodb_uri
from mongolock_async.fastapi import hold_lock

STOCK = {"sku-1": 3, "sku-2": 5, "sku-3": 10}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri())
    database = client[os.environ.get("SHOP_DATABASE", "shop")]
    if await database["items"].count_documents({}, limit=1) == 0:
        # Two workers starting together may both get here: the second insert finds the ids taken.
        items = [{"_id": sku, "stock": stock, "sold": 0} for sku, stock in STOCK.items()]
        try:
            await database["items"].insert_many(items, ordered=False)
            print(f"seeded {database.name}.items: {STOCK}", flush=True)
        except Exception:
            pass
    app.state.database = database
    app.state.locks = LockManager(lock_collection(client), ttl=10, timeout=2, label="checkout")
    yield
    await client.close()


app = FastAPI(lifespan=lifespan)


def stock_lock(request: Request) -> str:
    return f"stock:{request.path_params['sku']}"


StockLock = Annotated[AsyncMongoLock, hold_lock(lambda request: request.app.state.locks, stock_lock)]


@app.post("/items/{sku}/buy")
async def buy(sku: str, request: Request, lock: StockLock) -> dict[str, object]:
    items = request.app.state.database["items"]
    item = await items.find_one({"_id": sku})
    if item is None or item["stock"] <= 0:
        return {"sku": sku, "sold": False}
    await asyncio.sleep(0.005)  # the payment: the stock read above must still be true after it
    await items.update_one({"_id": sku}, {"$set": {"stock": item["stock"] - 1}, "$inc": {"sold": 1}})
    return {"sku": sku, "sold": True, "fencing_token": lock.fencing_token}


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description="The flash-sale example on FastAPI.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    arguments = parser.parse_args()
    uvicorn.run(
        "mongolock_async.examples.fastapi_app:app", host=arguments.host, port=arguments.port, workers=arguments.workers
    )
