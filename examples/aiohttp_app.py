"""The same flash sale on aiohttp.

    MONGODB_URI=mongodb://... python examples/aiohttp_app.py
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from mongolock_async import LockManager
from mongolock_async.aiohttp import LOCK, hold_lock

DATABASE = web.AppKey("database", AsyncDatabase[dict[str, Any]])
LOCKS = web.AppKey("locks", LockManager)
routes = web.RouteTableDef()


async def mongodb(app: web.Application) -> AsyncIterator[None]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGODB_URI"])
    database = client[os.environ.get("SHOP_DATABASE", "shop")]
    app[DATABASE] = database
    app[LOCKS] = LockManager(database["locks"], ttl=10, timeout=2, label="checkout")
    yield
    await client.close()


@routes.post("/items/{sku}/buy")
@hold_lock(lambda request: request.app[LOCKS], lambda request: "stock:" + request.match_info["sku"])
async def buy(request: web.Request) -> web.Response:
    sku = request.match_info["sku"]
    items = request.app[DATABASE]["items"]
    item = await items.find_one({"_id": sku})
    if item is None or item["stock"] <= 0:
        return web.json_response({"sku": sku, "sold": False})
    await asyncio.sleep(0.005)  # the payment: the stock read above must still be true after it
    await items.update_one({"_id": sku}, {"$set": {"stock": item["stock"] - 1}, "$inc": {"sold": 1}})
    return web.json_response({"sku": sku, "sold": True, "fencing_token": request[LOCK].fencing_token})


def make_app() -> web.Application:
    app = web.Application()
    app.cleanup_ctx.append(mongodb)
    app.add_routes(routes)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), port=int(os.environ.get("PORT", "8080")))
