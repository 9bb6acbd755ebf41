"""An unreachable or dead server never looks like a busy lock: a blocking acquire rides out a short
outage, raises after ``unreachable_timeout`` (or says so when its own timeout passes first), and
says why; a non-blocking one honours the client's server selection timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest
from pymongo.errors import ServerSelectionTimeoutError

from mongolock_async import AsyncMongoLock, LockTimeoutError, ServerUnreachableError
from mongolock_async._runtime import waiting
from mongolock_async.store import sending
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client
from tests.support.commands import CommandCounter


@pytest.mark.timing(margin=4.0)  # within 6 s of a 1.5 s bound
async def test_a_blocking_acquire_without_timeout_raises_once_the_server_stays_unreachable(
    mongolock_driver: str,
    refused_uri: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, logger="mongolock_async")
    monkeypatch.setattr(waiting, "_last_warning", 0.0)  # the retry warning is rate-limited per process
    client = make_client(mongolock_driver, refused_uri, serverSelectionTimeoutMS=1500)
    try:
        started = time.monotonic()
        with pytest.raises(ServerUnreachableError) as raised:
            async with AsyncMongoLock(client[TEST_DATABASE]["locks"], "nightly-report", ttl=30.0):
                pytest.fail("entered without a server")
        took = time.monotonic() - started
        # The default bound is the client's serverSelectionTimeoutMS (1.5 s here), plus one attempt.
        assert 1.4 < took < 6.0, took
        assert "connection refused" in str(raised.value), str(raised.value)
        # One error with the driver's as its cause, and nothing of the library's inner workings.
        cause = raised.value.__cause__
        assert isinstance(cause, ServerSelectionTimeoutError)
        assert cause.__cause__ is None and (cause.__context__ is None or cause.__suppress_context__), repr(cause)
        # The first attempt waited out the whole outage bound: no retry followed, so none is announced.
        assert "retrying" not in caplog.text, caplog.text
    finally:
        await close_client(client)


@pytest.mark.timing(margin=0.5)  # said 2.5 to 3.0 s
async def test_an_outage_error_shows_the_drivers_cause_not_the_librarys_inner_timeout(
    mongolock_driver: str, refused_uri: str
) -> None:
    # The client would wait 10 s for a server; each attempt is cut at the lease's TTL (1 s) first.
    client = make_client(mongolock_driver, refused_uri)
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE]["locks"], "report", ttl=1.0, unreachable_timeout=2.5)
        with pytest.raises(ServerUnreachableError, match=r"could not be reached for 2\.\d s") as raised:
            await lock.acquire()
    finally:
        await close_client(client)
    chain: list[BaseException] = []
    error: BaseException | None = raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    assert [type(error) for error in chain] == [ServerUnreachableError, ServerSelectionTimeoutError], chain


@pytest.mark.timing(margin=2.5)  # within 3 s of a 0.5 s bound
async def test_a_request_whose_cut_is_lost_still_ends_near_its_bound_while_no_server_is_known(
    mongolock_driver: str, refused_uri: str
) -> None:
    # On Python 3.11 the cancellation that cuts a request at its bound can be lost inside the
    # driver's wait for a server (asyncio.wait_for, CPython gh-86296), and server selection goes on.
    # This request loses its cut the same way, then asks the driver for a server.
    client = make_client(mongolock_driver, refused_uri)  # serverSelectionTimeoutMS 10 s
    try:

        async def loses_its_cut() -> object:
            # Swallowed, as wait_for does when what it waited for is ready in the same loop iteration.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(30)
            return await client[TEST_DATABASE].command("ping")

        started = time.monotonic()
        with pytest.raises(ServerSelectionTimeoutError):
            await sending.send(client, loses_its_cut(), bound=0.5, waits=sending.driver_waits(client.options))
        took = time.monotonic() - started
        assert took < 3.0, f"{took:.1f} s for a 0.5 s bound: selection ran on towards its 10 s timeout"
    finally:
        await close_client(client)


@pytest.mark.timing(margin=0.5)  # said 3.5 to 4.0 s
async def test_a_retried_acquire_says_so_once_at_warning_level(
    mongolock_driver: str,
    refused_uri: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mongolock_async")
    monkeypatch.setattr(waiting, "_last_warning", 0.0)
    monkeypatch.setattr(waiting, "_retries_unreported", 0)
    client = make_client(mongolock_driver, refused_uri, serverSelectionTimeoutMS=1000)
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE]["locks"], "report", ttl=30.0, unreachable_timeout=3.5)
        with pytest.raises(ServerUnreachableError, match=r"could not be reached for 3\.\d s"):
            await lock.acquire()
        retries = [record for record in caplog.records if "retrying" in record.getMessage()]
        # Attempts end at about 1 s, 2 s and 3 s (more retries within 10 s are counted, not logged).
        assert len(retries) == 1 and retries[0].levelno == logging.WARNING, caplog.text
    finally:
        await close_client(client)


@pytest.mark.timing(margin=4.0)  # within 6 s of a 1 s timeout
async def test_a_timeout_that_passes_while_unreachable_says_so(
    mongolock_driver: str, refused_uri: str
) -> None:
    client = make_client(mongolock_driver, refused_uri)  # serverSelectionTimeoutMS 10 s
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE]["locks"], "report", ttl=30.0)
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as raised:
            await lock.acquire(timeout=1.0)
        assert time.monotonic() - started < 6.0, "waited out the client's 10 s server selection timeout"
        assert raised.value.unreachable is not None and "connection refused" in raised.value.unreachable
        assert "within 1 s: MongoDB could not be reached" in str(raised.value)
        assert isinstance(raised.value.__cause__, ServerSelectionTimeoutError)
    finally:
        await close_client(client)


@pytest.mark.timing(margin=2.0)  # within 4 s of a 1.5 s selection timeout
async def test_a_non_blocking_acquire_honours_the_uris_server_selection_timeout(
    mongolock_driver: str, refused_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(mongolock_driver, refused_uri, serverSelectionTimeoutMS=1500)  # what the URI would say
    try:
        lock = AsyncMongoLock(client[TEST_DATABASE]["locks"], "report", ttl=30.0)
        started = time.monotonic()
        with pytest.raises(ServerUnreachableError):
            await lock.acquire(blocking=False)
        assert time.monotonic() - started < 4.0, "the lock's own bound overrode serverSelectionTimeoutMS (1.5 s)"
    finally:
        await close_client(client)
    await asyncio.sleep(0.2)  # any background work would run now
    assert "background" not in caplog.text, "a release was attempted for a request never sent"


async def test_a_short_outage_is_ridden_out(mongolock_driver: str, private_server: EmbeddedMongo) -> None:
    """An acquire waits through a server that is down for less than its ``unreachable_timeout``.
    Private server: it stops the server and starts it again, which no other test using it would
    survive."""
    client = make_client(mongolock_driver, private_server.uri, serverSelectionTimeoutMS=1000)
    try:
        collection = client[TEST_DATABASE]["locks"]
        await collection.find_one({})  # connected
        lock = AsyncMongoLock(collection, "failover", ttl=30.0, unreachable_timeout=20.0, retry_cap=0.2)
        private_server.stop()
        acquiring = asyncio.create_task(lock.acquire())
        await asyncio.sleep(2.5)  # longer than the client's serverSelectionTimeoutMS
        assert not acquiring.done(), "gave up inside unreachable_timeout"
        await asyncio.to_thread(private_server.start)
        assert await asyncio.wait_for(acquiring, 20), "not acquired once the server was back"
        assert await lock.release()
    finally:
        await close_client(client)


async def test_unreachable_timeout_none_waits_through_any_outage(
    mongolock_driver: str, private_server: EmbeddedMongo
) -> None:
    """With ``unreachable_timeout=None`` an acquire waits through an outage of any length.
    Private server: it stops the server and starts it again, which no other test using it would
    survive."""
    client = make_client(mongolock_driver, private_server.uri, serverSelectionTimeoutMS=500)
    try:
        collection = client[TEST_DATABASE]["locks"]
        await collection.find_one({})
        lock = AsyncMongoLock(collection, "patient", ttl=30.0, unreachable_timeout=None, retry_cap=0.2)
        private_server.stop()
        acquiring = asyncio.create_task(lock.acquire())
        await asyncio.sleep(3.0)  # six server selection timeouts
        assert not acquiring.done()
        await asyncio.to_thread(private_server.start)
        assert await asyncio.wait_for(acquiring, 20)
        assert await lock.release()
    finally:
        await close_client(client)


@pytest.mark.timing(margin=3.0)  # within 5 s of a 1 s selection timeout
async def test_every_waiting_task_gives_up_together(mongolock_driver: str, refused_uri: str) -> None:
    # Only the first waiter of a process talks to the server; the others must not wait their turn
    # to find out, one server selection timeout each.
    client = make_client(mongolock_driver, refused_uri, serverSelectionTimeoutMS=1000)
    try:
        collection = client[TEST_DATABASE]["locks"]
        started = time.monotonic()
        results: list[Any] = await asyncio.gather(
            *(AsyncMongoLock(collection, "busy", ttl=30.0).acquire() for _ in range(6)), return_exceptions=True
        )
        assert all(isinstance(result, ServerUnreachableError) for result in results), results
        assert time.monotonic() - started < 5.0, "the waiting tasks found out one after another"
    finally:
        await close_client(client)


async def test_unreachable_timeout_is_checked_before_any_io(
    counted_collection: Any, command_counter: CommandCounter
) -> None:
    command_counter.clear()
    with pytest.raises(ValueError, match="server_selection"):
        AsyncMongoLock(counted_collection, "x", unreachable_timeout="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unreachable_timeout"):
        AsyncMongoLock(counted_collection, "x", unreachable_timeout=-1)
    assert command_counter.names == []


@pytest.mark.timing(margin=1.0)  # warned after 2 s, checked at 3 s
async def test_a_wait_for_an_unreachable_server_is_never_silent(
    mongolock_driver: str, refused_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    # README's first example with the server down: a warning within seconds, not once the
    # client's serverSelectionTimeoutMS (30 s by default; 6 s here) has passed in silence.
    caplog.set_level(logging.WARNING, logger="mongolock_async")
    client = make_client(mongolock_driver, refused_uri, serverSelectionTimeoutMS=6_000)
    try:
        acquiring = asyncio.create_task(AsyncMongoLock(client[TEST_DATABASE]["locks"], "report", ttl=30.0).acquire())
        await asyncio.sleep(3.0)
        assert not acquiring.done()
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert any("no MongoDB server to write to has answered" in message for message in warnings), warnings
        assert any("connection refused" in message for message in warnings), warnings
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring
    finally:
        await close_client(client)
