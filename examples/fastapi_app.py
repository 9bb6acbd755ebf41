"""A flash sale on FastAPI: many buyers, a small stock, never oversold.

    MONGODB_URI=mongodb://... uvicorn examples.fastapi_app:app --workers 2

Each purchase reads the stock, waits a moment (a payment call, say), then writes it back: without
the lock two buyers could both read the last unit. With it, one buyer per item at a time, in every
worker process. A buyer that cannot get the lock within 2 s gets 423 Locked.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pymongo import AsyncMongoClient

from mongolock_async import AsyncMongoLock, LockManager
from mongolock_async.fastapi import hold_lock


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGODB_URI"])
    database = client[os.environ.get("SHOP_DATABASE", "shop")]
    app.state.database = database
    app.state.locks = LockManager(database["locks"], ttl=10, timeout=2, label="checkout")
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
