"""The dashboard: in a real browser (Debian's chromium, headless, driven by Playwright) as an operator
sees it, live; releases refused unless enabled, and then only from the page with the name typed;
mounted in FastAPI and in aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import pytest_asyncio
from pymongo import MongoClient

from mongolock_async import AsyncMongoLock
from mongolock_async.dashboard import Dashboard
from mongolock_async.operations import inspect_lock
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client, shard_blocking
from tests.support.commands import CommandCounter
from tests.support.event_streams import next_message
from tests.support.loop import settle
from tests.support.run_settings import SHARDED, child_environment

if TYPE_CHECKING:
    from playwright.async_api import Browser, Dialog, Page

BROWSER_ARGUMENTS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]  # fmt: skip
BOUND = 10_000  # ms: a bound that catches a hang, far above what an update takes
HOLDER_OF = (
    "([name, label]) => [...document.querySelectorAll('#locks tbody tr.held')]"
    ".some(row => row.dataset.name === name && row.querySelector('.holder').textContent.includes(label))"
)
NOT_HELD = "([name]) => ![...document.querySelectorAll('#locks tbody tr.held')].some(r => r.dataset.name === name)"


def chromium() -> str:
    """Debian's chromium; a missing one fails the test, saying what to install."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "the dashboard's browser test needs Debian's chromium: apt-get install chromium "
            "(make test installs it when missing)"
        )
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless chromium for the module's browser tests (each gets a fresh context of it)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=chromium(), headless=True, args=BROWSER_ARGUMENTS, env=child_environment()
        )
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Served:
    """``mongolock dashboard`` on a fresh collection: its URL, the collection, and what it wrote
    on stderr (once it stopped)."""

    url: str
    collection: Any
    stderr: str = ""


@contextlib.asynccontextmanager
async def dashboard_command(
    mongodb_uri: str, admin: MongoClient[dict[str, Any]], *options: str
) -> AsyncIterator[Served]:
    client = make_client("pymongo", mongodb_uri)
    name = f"dashboard_{uuid.uuid4().hex[:8]}"
    if SHARDED:
        shard_blocking(admin, TEST_DATABASE, name)
    collection = client[TEST_DATABASE][name]
    opened = AsyncMongoLock(collection, "opened", ttl=5)  # the command wants the collection to exist
    assert await opened.acquire() and await opened.release()
    server = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; it is read in a thread
        [sys.executable, "-m", "mongolock_async", "dashboard", "--port", "0", "--uri", mongodb_uri,
         "--db", TEST_DATABASE, "--collection", name, "--title", "<i>ops</i>", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(),
    )  # fmt: skip
    assert server.stdout is not None
    served = Served("", collection)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), 30)
        match = re.search(r"at (http://\S+/) \((read-only|release allowed)", line)
        assert match, line + (server.stderr.read() if server.stderr else "")
        served.url = match.group(1)
        yield served
    finally:
        server.send_signal(signal.SIGINT)
        _, served.stderr = await asyncio.to_thread(server.communicate, timeout=15)
        admin[TEST_DATABASE].drop_collection(name)
        await close_client(client)
    assert server.returncode == 0 and "Traceback" not in served.stderr, served.stderr


@contextlib.asynccontextmanager
async def opened_page(browser: Browser, url: str, dialogs: list[str], answers: list[str]) -> AsyncIterator[Page]:
    """The page at ``url`` in a fresh context; each dialog's message goes into ``dialogs``, a
    prompt is answered with the next of ``answers`` (dismissed when there is none)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})

    async def answer(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        if dialog.type == "prompt" and answers:
            await dialog.accept(answers.pop(0))
        elif dialog.type == "prompt":
            await dialog.dismiss()
        else:
            await dialog.accept()

    try:
        page = await context.new_page()
        page.on("dialog", answer)
        await page.goto(url)
        yield page
    finally:
        await context.close()


async def shown(page: Page, script: str, *arguments: Any) -> None:
    """Wait (up to the bound) until ``script`` holds in the page."""
    await page.wait_for_function(script, arg=list(arguments), timeout=BOUND)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_page_shows_who_holds_what_live_in_a_browser(
    browser: Browser, mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    dialogs: list[str] = []
    async with (
        dashboard_command(mongolock_uri, mongolock_admin_client) as served,
        opened_page(browser, served.url, dialogs, []) as page,
    ):
        collection = served.collection
        assert await page.text_content("h1") == "<i>ops</i>", "the title is text"

        first = AsyncMongoLock(collection, "stock:tea", ttl=10, label="shop-1")
        assert await first.acquire()
        await shown(page, HOLDER_OF, "stock:tea", "shop-1")

        second = AsyncMongoLock(collection, "stock:tea", ttl=10, label="shop-2")
        waiting = asyncio.create_task(second.acquire(timeout=10))
        await shown(
            page,
            "([name]) => [...document.querySelectorAll('#locks tbody tr')]"
            ".some(row => row.dataset.name === name && row.querySelector('.waiting').textContent === '1')",
            "stock:tea",
        )
        assert await first.release() and await waiting
        await shown(page, HOLDER_OF, "stock:tea", "shop-2")
        events = await page.locator("#events li").all_text_contents()
        assert any("handed off" in event and "from shop-1" in event and "to shop-2" in event for event in events)
        bars = await page.eval_on_selector_all("#timeline rect > title", "titles => titles.map(t => t.textContent)")
        assert any(title.startswith("shop-1") and "(handed off)" in title for title in bars), bars

        assert await second.release()
        await shown(page, NOT_HELD, "stock:tea")

        evil = "<img src=x onerror=\"alert('pwned')\"><b>bold</b>"
        marked = AsyncMongoLock(collection, evil, ttl=10, label="<script>alert(1)</script>")
        assert await marked.acquire()
        await shown(page, HOLDER_OF, evil, "<script>alert(1)</script>")
        names = await page.eval_on_selector_all("#locks td.name", "cells => cells.map(c => c.textContent)")
        assert evil in names
        assert await page.locator("main img, main b, main script").count() == 0, "nothing of it became markup"
        assert await marked.release()

        # Read-only: no button, and a request forged in the page itself is refused.
        assert await page.locator("button.release").count() == 0
        status = await page.evaluate(
            """(name) => fetch("release", {method: "POST", headers: {"Content-Type": "application/json",
               "X-Mongolock-Token": "guessed"}, body: JSON.stringify({name, confirm: name})})
               .then(answer => answer.status)""",
            "stock:tea",
        )
        assert status == 403
    assert dialogs == [], "no script of a lock's name ran"
    assert "releases are disabled" in served.stderr, "the refusal is in the audit log"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_release_from_the_page_needs_the_name_typed_and_is_audited(
    browser: Browser, mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    dialogs: list[str] = []
    answers = ["stock:tee", "stock:tea"]  # a typo first, then the name
    async with (
        dashboard_command(mongolock_uri, mongolock_admin_client, "--allow-release") as served,
        opened_page(browser, served.url, dialogs, answers) as page,
    ):
        collection = served.collection
        stuck = AsyncMongoLock(collection, "stock:tea", ttl=30, label="stuck-worker")
        assert await stuck.acquire()
        await shown(page, HOLDER_OF, "stock:tea", "stuck-worker")
        button = page.locator("#locks tbody tr.held", has_text="stock:tea").locator("button.release")

        await button.click()
        await shown(page, "([count]) => document.querySelectorAll('#locks tbody tr.held').length === count", 1)
        async with asyncio.timeout(BOUND / 1000):
            while len(dialogs) < 2:  # noqa: ASYNC110 - the prompt, then the alert with the answer
                await asyncio.sleep(0.05)
        assert "Type the lock's name to confirm" in dialogs[0] and dialogs[1].startswith("Refused: confirm by typing")
        info = await inspect_lock(collection, "stock:tea")
        assert info is not None and info.held, "a mistyped name breaks nothing"

        await page.locator("#locks tbody tr.held", has_text="stock:tea").locator("button.release").click()
        await shown(page, NOT_HELD, "stock:tea")
        async with asyncio.timeout(BOUND / 1000):
            while len(dialogs) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert dialogs[3] == "Released stock:tea."
        info = await inspect_lock(collection, "stock:tea")
        assert info is not None and info.status == "released by force"
        events = await page.locator("#events li").all_text_contents()
        assert any("forced" in event and "stock:tea" in event for event in events), events
        assert not await stuck.release(), "the holder finds its lease gone"
    (audit,) = [line for line in served.stderr.splitlines() if "stock:tea" in line]
    assert "WARNING" in audit and "dashboard client 127.0.0.1" in audit and "stuck-worker" in audit, audit


async def test_releases_need_the_opt_in_the_pages_token_and_the_typed_name(
    pymongo_collection: Any, caplog: pytest.LogCaptureFixture
) -> None:
    held = AsyncMongoLock(pymongo_collection, "job", ttl=30, label="worker")
    assert await held.acquire()
    read_only = Dashboard(pymongo_collection, title="<b>x</b>", allowed_hosts=["test"])
    releasing = Dashboard(pymongo_collection, allow_release=True, allowed_hosts=["test"])
    request = {"name": "job", "confirm": "job", "leases": await shown_leases(pymongo_collection, "job")}

    async def post(dashboard: Dashboard, body: Any, **headers: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dashboard), base_url="http://test") as client:
            return await client.post("/release", json=body, headers=headers)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=read_only), base_url="http://test") as client:
        page = await client.get("/")
    assert '<meta name="mongolock-token"' not in page.text and "&lt;b&gt;x&lt;/b&gt;" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'nonce-" in policy and "unsafe-inline" not in policy and "connect-src 'self'" in policy

    caplog.set_level(logging.WARNING, logger="mongolock_async.audit")
    assert (await post(read_only, request)).status_code == 403
    assert "releases are disabled" in caplog.text

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=releasing), base_url="http://test") as client:
        token_meta = re.search(r'name="mongolock-token" content="([^"]+)"', (await client.get("/")).text)
    assert token_meta is not None
    token = token_meta.group(1)
    assert (await post(releasing, request)).status_code == 403, "no token"
    forged = await post(releasing, request, **{"X-Mongolock-Token": token, "Origin": "http://evil.example"})
    assert forged.status_code == 403, "another origin"
    mistyped = await post(releasing, {**request, "confirm": "jbo"}, **{"X-Mongolock-Token": token})
    assert mistyped.status_code == 400 and "typing the lock's name" in mistyped.json()["error"]
    info = await inspect_lock(pymongo_collection, "job")
    assert info is not None and info.held, "nothing was broken so far"

    caplog.clear()
    answer = await post(releasing, request, **{"X-Mongolock-Token": token, "Origin": "http://test"})
    assert answer.status_code == 200 and answer.json()["released"] is True
    assert answer.json()["broken"][0]["holder"]["label"] == "worker"
    info = await inspect_lock(pymongo_collection, "job")
    assert info is not None and info.status == "released by force"
    (record,) = [record for record in caplog.records if record.name == "mongolock_async.audit"]
    assert record.levelno == logging.WARNING and "'job'" in record.getMessage()
    assert "dashboard client" in record.getMessage() and "worker" in record.getMessage()


async def test_mounted_in_fastapi_and_in_aiohttp(pymongo_collection: Any) -> None:
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer
    from fastapi import FastAPI

    held = AsyncMongoLock(pymongo_collection, "mounted", ttl=30, label="mounter")
    assert await held.acquire()
    dashboard = Dashboard(pymongo_collection, allowed_hosts=["test"])
    app = FastAPI()
    app.mount("/locks", dashboard)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            redirect = await client.get("/locks")
            # Starlette's router adds the slash itself (with the host), or the app does
            assert redirect.status_code == 307 and redirect.headers["location"].endswith("/locks/")
            assert "<title>locks - mongolock</title>" in (await client.get("/locks/")).text
            state = (await client.get("/locks/state.json")).json()
        assert state["type"] == "snapshot"
        (lock,) = [lock for lock in state["locks"] if lock["name"] == "mounted"]
        assert lock["held"] and lock["holders"][0]["label"] == "mounter"
    finally:
        await dashboard.aclose()

    outer = web.Application()
    outer.add_subapp("/locks/", Dashboard(pymongo_collection).aiohttp_app())
    async with TestServer(outer) as server, ClientSession() as session:
        async with session.get(server.make_url("/locks/")) as page:
            assert page.status == 200 and "EventSource" in await page.text()
        async with session.get(server.make_url("/locks/events")) as events:
            assert events.headers["Content-Type"].startswith("text/event-stream")
            snapshot = await asyncio.wait_for(next_message(events), 10)
            assert snapshot["type"] == "snapshot" and "mounted" in [lock["name"] for lock in snapshot["locks"]]
            assert await held.release()
            update = await asyncio.wait_for(next_message(events), 10)
            assert [(event["event"], event["name"]) for event in update["events"]] == [("released", "mounted")]


async def test_every_open_page_shares_one_change_stream(
    mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    counter = CommandCounter()
    viewer = make_client("pymongo", mongolock_uri, event_listeners=[counter])
    writer = make_client("pymongo", mongolock_uri)
    name = f"shared_{uuid.uuid4().hex[:8]}"
    if SHARDED:
        shard_blocking(mongolock_admin_client, TEST_DATABASE, name)
    lock = AsyncMongoLock(writer[TEST_DATABASE][name], "shared", ttl=10, label="writer")
    dashboard = Dashboard(viewer[TEST_DATABASE][name])
    try:
        async with TestServer(dashboard.aiohttp_app()) as server, ClientSession() as session:
            pages = [await session.get(server.make_url("/events")) for _ in range(3)]
            for page in pages:
                assert (await asyncio.wait_for(next_message(page), 10))["type"] == "snapshot"
            opened = list(counter.commands)
            counter.clear()
            for _ in range(3):
                assert await lock.acquire()
                last = lock.fencing_token
                assert await lock.release()
            for page in pages:  # each page is told the state after the last release
                shown: dict[str, Any] = {}
                while not (shown.get("fencing_token") == last and shown.get("held") is False):
                    update = await asyncio.wait_for(next_message(page), 10)
                    shown = next((lock for lock in update["locks"] if lock["name"] == "shared"), shown)
            during = list(counter.commands)
            for page in pages:
                page.close()
    finally:
        await dashboard.aclose()
        mongolock_admin_client[TEST_DATABASE].drop_collection(name)
        await close_client(writer)
        await close_client(viewer)
    streams = [command for command in opened if "$changeStream" in str(command.get("pipeline", ""))]
    assert len(streams) == 1, opened
    # While the locks changed: the one stream's getMores, no read per change and no polling.
    assert {next(iter(command)) for command in during} == {"getMore"}, during
    assert len({command["getMore"] for command in during}) == 1, "one cursor"


# -- on a shared network -----------------------------------------------------------------------------


def asgi_client(dashboard: Dashboard, host: str = "127.0.0.1:8000") -> httpx.AsyncClient:
    """A client of ``dashboard`` whose requests name ``host`` (as a browser's carry the URL's)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=dashboard), base_url=f"http://{host}")


async def shown_leases(collection: Any, name: str) -> list[dict[str, Any]]:
    """The leases of ``name`` as the page names them in a release request."""
    info = await inspect_lock(collection, name)
    assert info is not None and info.holders
    return [{"owner": (holder.owner or "")[:8], "fencing_token": holder.fencing_token} for holder in info.holders]


async def page_token(client: httpx.AsyncClient) -> str:
    meta = re.search(r'name="mongolock-token" content="([^"]+)"', (await client.get("/")).text)
    assert meta is not None
    return meta.group(1)


async def test_a_rebound_host_name_is_refused_before_anything_else(
    pymongo_collection: Any, caplog: pytest.LogCaptureFixture
) -> None:
    held = AsyncMongoLock(pymongo_collection, "job", ttl=30, label="worker")
    assert await held.acquire()
    dashboard = Dashboard(pymongo_collection, allow_release=True)
    rebound = "rebind.attacker.example:8000"
    caplog.set_level(logging.WARNING, logger="mongolock_async.audit")
    try:
        async with asgi_client(dashboard) as ours:
            token = await page_token(ours)  # what the attacker's page could read once rebound
        (lease,) = await shown_leases(pymongo_collection, "job")
        headers = {"Origin": f"http://{rebound}", "X-Mongolock-Token": token}
        async with asgi_client(dashboard, rebound) as attacker:
            answers = [
                await attacker.get("/"),
                await attacker.get("/state.json"),
                await attacker.get("/events"),
                await attacker.post("/release", json={"name": "job", "confirm": "job", "leases": [lease]},
                                    headers=headers),
            ]  # fmt: skip
        for host in ("localhost:8000", "[::1]:8000", "LOCALHOST"):
            async with asgi_client(dashboard, host) as local:
                assert (await local.get("/state.json")).status_code == 200, host
    finally:
        await dashboard.aclose()
    assert [answer.status_code for answer in answers] == [403, 403, 403, 403]
    assert all(answer.headers["x-content-type-options"] == "nosniff" for answer in answers)
    info = await inspect_lock(pymongo_collection, "job")
    assert info is not None and info.held, "nothing was released"
    assert "rebind.attacker.example" in caplog.text and "not in allowed_hosts" in caplog.text
    assert await held.release()

    outer_app = Dashboard(pymongo_collection).aiohttp_app()
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async with TestServer(outer_app) as server, ClientSession() as session:
        async with session.get(server.make_url("/state.json"), headers={"Host": rebound}) as refused:
            assert refused.status == 403 and refused.headers["X-Content-Type-Options"] == "nosniff"
        async with session.get(server.make_url("/state.json")) as served:
            assert served.status == 200 and served.headers["X-Content-Type-Options"] == "nosniff"
            assert (await served.json())["type"] == "snapshot"


async def test_a_token_header_of_any_characters_is_refused_and_audited(
    pymongo_collection: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dashboard = Dashboard(pymongo_collection, allow_release=True)
    caplog.set_level(logging.WARNING, logger="mongolock_async.audit")
    async with asgi_client(dashboard) as client:
        answer = await client.post(
            "/release", content=b'{"name": "job", "confirm": "job", "leases": []}',
            headers={"Content-Type": "application/json", "X-Mongolock-Token": "t\u00f6k\u00e9n".encode()},
        )  # fmt: skip
    assert answer.status_code == 403 and "no valid token" in answer.json()["error"]
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "refused a forced release" in caplog.text and "no valid token" in caplog.text


async def test_json_and_events_are_never_sniffed(pymongo_collection: Any) -> None:
    dashboard = Dashboard(pymongo_collection)
    started: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.5)  # the page goes away (httpx's ASGI transport waits for a body's end)
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            started.append(message)

    try:
        async with asgi_client(dashboard) as client:
            state = await client.get("/state.json")
            missing = await client.get("/nothing")
        scope = {"type": "http", "method": "GET", "path": "/events", "headers": [(b"host", b"127.0.0.1:8000")]}
        await dashboard(scope, receive, send)
    finally:
        await dashboard.aclose()
    event_headers = httpx.Headers(started[0]["headers"])
    for headers in (state.headers, missing.headers, event_headers):
        assert headers["x-content-type-options"] == "nosniff", headers
    assert event_headers["content-type"].startswith("text/event-stream")


async def test_a_shared_secret_keeps_the_release_token_across_restarts_and_workers(
    pymongo_collection: Any,
) -> None:
    secret = "a-shared-secret-of-the-deployment"
    before, after = (Dashboard(pymongo_collection, allow_release=True, release_secret=secret) for _ in range(2))
    random_before, random_after = (Dashboard(pymongo_collection, allow_release=True) for _ in range(2))
    held = AsyncMongoLock(pymongo_collection, "job", ttl=30, label="worker")
    assert await held.acquire()
    request = {"name": "job", "confirm": "job", "leases": await shown_leases(pymongo_collection, "job")}

    async def release_through(loaded: Dashboard, serving: Dashboard) -> int:
        async with asgi_client(loaded) as page, asgi_client(serving) as other:
            token = await page_token(page)
            answer = await other.post("/release", json=request, headers={"X-Mongolock-Token": token})
            return answer.status_code

    assert await release_through(random_before, random_after) == 403, "a random token dies with its process"
    assert await release_through(before, after) == 200, "a derived one does not"
    with pytest.raises(ValueError, match="at least 16"):
        Dashboard(pymongo_collection, release_secret="short")


async def test_the_dashboard_breaks_only_the_lease_its_page_showed(pymongo_collection: Any) -> None:
    first = AsyncMongoLock(pymongo_collection, "job", ttl=30, label="first")
    assert await first.acquire()
    dashboard = Dashboard(pymongo_collection, allow_release=True)
    async with asgi_client(dashboard) as client:
        token = await page_token(client)
        request = {"name": "job", "confirm": "job", "leases": await shown_leases(pymongo_collection, "job")}
        assert await first.release()  # the holder changes while the operator confirms
        second = AsyncMongoLock(pymongo_collection, "job", ttl=30, label="second")
        assert await second.acquire()
        answer = await client.post("/release", json=request, headers={"X-Mongolock-Token": token})
    assert answer.status_code == 409 and answer.json()["released"] is False, answer.text
    assert "nothing was broken" in answer.json()["error"]
    now = await inspect_lock(pymongo_collection, "job")
    assert now is not None and [holder.label for holder in now.holders] == ["second"]
    assert await second.release()


def test_release_on_an_address_others_reach_is_warned_about(mongolock_uri: str, tmp_path: Any) -> None:
    name = f"warned_{uuid.uuid4().hex[:8]}"
    with MongoClient(mongolock_uri) as client:
        client[TEST_DATABASE][name].insert_one({"_id": "opened"})
        secret = tmp_path / "secret"
        tokens = []
        try:
            for host in ("0.0.0.0", "127.0.0.1"):
                server = subprocess.Popen(
                    [sys.executable, "-m", "mongolock_async", "dashboard", "--port", "0", "--host", host,
                     "--uri", mongolock_uri, "--db", TEST_DATABASE, "--collection", name, "--allow-release",
                     "--secret-file", str(secret)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment(),
                )  # fmt: skip
                assert server.stdout is not None
                line = server.stdout.readline()
                match = re.search(r":(\d+)/ \(release allowed", line)
                assert match, line
                page = httpx.get(f"http://127.0.0.1:{match.group(1)}/", timeout=10)
                meta = re.search(r'name="mongolock-token" content="([^"]+)"', page.text)
                assert meta is not None
                tokens.append(meta.group(1))
                server.send_signal(signal.SIGINT)
                _, err = server.communicate(timeout=15)
                assert server.returncode == 0, err
                warned = "warning: --allow-release on --host 0.0.0.0" in err
                assert warned is (host == "0.0.0.0"), err
        finally:
            client[TEST_DATABASE].drop_collection(name)
    assert tokens[0] == tokens[1], "the secret file keeps the token across a restart"
    assert oct(secret.stat().st_mode & 0o777) == "0o600"


SAMPLES = [
    "<img src=x onerror=\"alert('pwned')\">\x1b[2J\x1b]0;title\x07\u202etxt.exe\x9b31m",
    "tab\there\nnew\rline\x7f\u200bzero\u2028sep\u00a0nbsp \U000e0001tag caf\u00e9 \u6ce8\u6587",
    "plain:name-42",
]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_page_shows_escapes_bidi_overrides_and_html_as_the_command_does(
    browser: Browser, mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> None:
    from mongolock_async._util.inert import printable

    dialogs: list[str] = []
    name, label = SAMPLES[0], "<b>worker</b>\u202e\x1b[5m"
    async with (
        dashboard_command(mongolock_uri, mongolock_admin_client) as served,
        opened_page(browser, served.url, dialogs, []) as page,
    ):
        marked = AsyncMongoLock(served.collection, name, ttl=30, label=label)
        assert await marked.acquire()
        await shown(page, HOLDER_OF, name, printable(label))
        cells = await page.eval_on_selector_all("#locks td.name", "cells => cells.map(c => c.textContent)")
        holders = await page.eval_on_selector_all("#locks td.holder", "cells => cells.map(c => c.textContent)")
        labels = await page.eval_on_selector_all("#timeline svg text", "nodes => nodes.map(n => n.textContent)")
        in_the_page = await page.evaluate("(samples) => samples.map(printable)", SAMPLES)
        assert await marked.release()  # seen live by the page (its row showed): the event reaches it
        in_events = "([text]) => [...document.querySelectorAll('#events .lock')].some(e => e.textContent === text)"
        await shown(page, in_events, printable(name))
        assert await page.locator("main img, main b, main script").count() == 0, "nothing of it became markup"
    assert printable(name) in cells and not any(cell == name for cell in cells)
    assert any(printable(label) in holder for holder in holders), holders
    assert any(text.startswith(printable(name)[:29]) for text in labels), labels
    assert in_the_page == [printable(sample) for sample in SAMPLES], "the page's printable form is the command's"
    for text in [*cells, *holders, *labels]:
        assert text.isprintable(), repr(text)
    assert dialogs == []


async def test_a_page_stream_cancelled_as_a_message_arrives_ends(pymongo_collection: Any) -> None:
    """A page's event stream cancelled in the same loop iteration as its next message arrives
    ends; on Python 3.11 ``asyncio.wait_for`` returned the message and lost the cancellation
    (CPython gh-86296), so a server shutting down waited for the page's handler."""
    dashboard = Dashboard(pymongo_collection)
    events = dashboard.events()
    try:
        assert (await anext(events)).startswith(b"retry:")
        assert b'"snapshot"' in await asyncio.wait_for(anext(events), 30)
        following = asyncio.ensure_future(anext(events))
        await settle()
        assert not following.done()
        (queue,) = dashboard._feed._pages
        queue.put_nowait(b"data: {}\n\n")
        following.cancel()
        done, _ = await asyncio.wait({following}, timeout=5)
        assert following in done and following.cancelled(), "the page's stream went on"
    finally:
        await events.aclose()
        await dashboard.aclose()
