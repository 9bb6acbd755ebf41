"""The same flash sale on aiohttp.

    mongolock server                                  # in another terminal (or set MONGODB_URI)
    python -m mongolock_async.examples.aiohttp_app    # http://127.0.0.1:8080
    curl -X POST http://127.0.0.1:8080/items/sku-1/buy

The app seeds three items into an empty ``shop`` database when it starts; its locks are in
``mongolock.locks``, where ``mongolock list`` shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from mongolock_async import LockManager
from mongolock_async.aiohttp import LOCK, hold_lock
from mongolock_async.examples import lock_collection, mongodb_uri

DATABASE = web.AppKey("database", AsyncDatabase[dict[str, Any]])
LOCKS = web.AppKey("locks", LockManager)
routes = web.RouteTableDef()
STOCK = {"sku-1": 3, "sku-2": 5, "sku-3": 10}


async def mongodb(app: web.Application) -> AsyncIterator[None]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri())
    database = client[os.environ.get("SHOP_DATABASE", "shop")]
    if await database["items"].count_documents({}, limit=1) == 0:
        await database["items"].insert_many([{"_id": sku, "stock": stock, "sold": 0} for sku, stock in STOCK.items()])
        print(f"seeded {database.name}.items: {STOCK}", flush=True)
    app[DATABASE] = database
    app[LOCKS] = LockManager(lock_collection(client), ttl=10, timeout=2, label="checkout")
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
    parser = argparse.ArgumentParser(description="The flash-sale example on aiohttp.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    arguments = parser.parse_args()
    web.run_app(make_app(), host=arguments.host, port=arguments.port)
