"""``LockStore.force_release(name, holder=...)`` breaks exactly the holder asked for, or nothing.

The owner tokens of one process's waiting places all start with that process's prefix, so two
permits of one process share any short start of their tokens: a ``holder`` that more than one live
holder matches is refused, never taken as "all of them".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from pymongo.write_concern import WriteConcern

from mongolock_async import AsyncMongoLock, AsyncMongoSemaphore
from mongolock_async.store import LockStore
from tests.support.commands import CommandCounter
from tests.support.permits import live_tokens, two_permits_of_one_process
from tests.support.run_settings import child_environment


async def test_a_holder_that_names_two_permits_is_refused_and_breaks_nothing(mongolock_collection: Any) -> None:
    tokens = await two_permits_of_one_process(mongolock_collection)
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    shared = tokens["export-a"][:12]  # what `inspect` used to show of each
    with pytest.raises(ValueError, match="matches 2 holders") as refused:
        await store.force_release("pool", holder=shared)
    assert tokens["export-a"] in str(refused.value) and tokens["export-b"] in str(refused.value)
    with pytest.raises(LookupError, match="no live holder") as unknown:
        await store.force_release("pool", holder="feedface")
    assert tokens["export-a"] in str(unknown.value) and tokens["export-b"] in str(unknown.value)
    assert await live_tokens(store, "pool") == tokens, "nothing was broken"


async def test_a_holder_breaks_exactly_that_permit(mongolock_collection: Any) -> None:
    tokens = await two_permits_of_one_process(mongolock_collection)
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    broken = await store.force_release("pool", holder=tokens["export-a"])
    assert broken is not None and [owner for owner, _, _ in broken.permits] == [tokens["export-a"]]
    assert await live_tokens(store, "pool") == {"export-b": tokens["export-b"]}
    # A unique start of a token is enough.
    broken = await store.force_release("pool", holder=tokens["export-b"][:20])
    assert broken is not None and [owner for owner, _, _ in broken.permits] == [tokens["export-b"]]
    assert await live_tokens(store, "pool") == {}


async def test_a_holder_on_a_lock_must_be_its_owner(mongolock_collection: Any) -> None:
    lock = AsyncMongoLock(mongolock_collection, "job", ttl=120.0, label="worker")
    assert await lock.acquire(blocking=False)
    store = LockStore(mongolock_collection, WriteConcern(w="majority"))
    (report,) = await store.report(["job"])
    assert report.state is not None and report.state.owner is not None
    owner = report.state.owner
    with pytest.raises(LookupError, match="no live holder"):
        await store.force_release("job", holder="not-" + owner)
    assert (await store.report(["job"]))[0].remaining_ms is not None, "nothing was broken"
    broken = await store.force_release("job", holder=owner[:10])
    assert broken is not None and broken.owner == owner


@pytest.mark.parametrize(("holder", "error"), [("", ValueError), (b"abc", TypeError), (12, TypeError)])
async def test_a_bad_holder_is_refused_before_any_io(
    counted_collection: Any, command_counter: CommandCounter, holder: Any, error: type[Exception]
) -> None:
    store = LockStore(counted_collection, WriteConcern(w="majority"))
    with pytest.raises(error, match="holder"):
        await store.force_release("pool", holder=holder)
    assert command_counter.names == []


# -- every forced release names the exact lease it breaks -----------------------------------------------


async def test_force_release_breaks_only_the_lease_it_names(mongolock_collection: Any) -> None:
    from mongolock_async.operations import force_release, inspect_lock

    # A long lease, expired by hand below: the inspection and the refusal must see it live (with a
    # TTL of 0.5 s, which they had to share, a loaded machine's server could leave them too little).
    first = AsyncMongoLock(mongolock_collection, "ledger", ttl=30, label="first")
    assert await first.acquire()
    info = await inspect_lock(mongolock_collection, "ledger")
    assert info is not None and info.holders[0].owner is not None
    shown = info.holders[0].owner
    with pytest.raises(ValueError, match=f"live lease: name the one to break .*{shown}"):
        await force_release(mongolock_collection, "ledger")  # no holder named: nothing is broken
    first._forget_lease()
    # Its lease expires (set by hand, as its TTL running out would), and another takes the lock.
    await mongolock_collection.update_one({"_id": "ledger"}, {"$set": {"expiresAt": datetime(2000, 1, 1)}})
    second = AsyncMongoLock(mongolock_collection, "ledger", ttl=30, label="second")
    assert await second.acquire()
    with pytest.raises(LookupError, match="no live holder"):
        await force_release(mongolock_collection, "ledger", holder=shown)  # the lease shown has ended
    now = await inspect_lock(mongolock_collection, "ledger")
    assert now is not None and [holder.label for holder in now.holders] == ["second"], "the new holder stays"
    assert now.holders[0].owner is not None
    broken = await force_release(mongolock_collection, "ledger", holder=now.holders[0].owner)
    assert broken is not None and broken.holder["label"] == "second"
    assert not await second.release(), "the holder finds its lease gone"


async def test_without_a_holder_it_only_repairs_an_unreadable_document(mongolock_collection: Any) -> None:
    from mongolock_async.operations import force_release, inspect_lock

    await mongolock_collection.insert_one({"_id": "edited", "owner": 42, "expiresAt": "tomorrow", "fence": 7})
    repaired = await force_release(mongolock_collection, "edited")
    assert repaired is not None
    info = await inspect_lock(mongolock_collection, "edited")
    assert info is not None and info.status == "released by force" and info.fencing_token == 7
    assert await force_release(mongolock_collection, "edited") is None, "a readable, free document needs nothing"
    assert await LockStore(mongolock_collection, WriteConcern(w="majority")).repair("edited") is None
    holding = AsyncMongoLock(mongolock_collection, "edited", ttl=30)
    assert await holding.acquire(blocking=False)
    assert await LockStore(mongolock_collection, WriteConcern(w="majority")).repair("edited") is None
    held = await inspect_lock(mongolock_collection, "edited")
    assert held is not None and held.held, "a repair never breaks a live lease"
    assert await holding.release()


@contextlib.contextmanager
def at_the_prompt(uri: str, collection: Any, name: str) -> Iterator[Callable[[str], tuple[int, str]]]:
    """``mongolock release NAME --force`` on a terminal, stopped at its confirmation; yields a
    function that answers it and returns the exit code and all the command printed."""
    controller, terminal = os.openpty()
    where = ["--uri", uri, "--db", collection.database.name, "--collection", collection.name]
    process = subprocess.Popen(
        [sys.executable, "-m", "mongolock_async", "release", name, "--force", *where],
        stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_environment(),
    )  # fmt: skip
    assert process.stdout is not None
    shown = b""
    try:
        give_up_at = time.monotonic() + 60
        while b"Release it? [y/N]" not in shown:
            assert process.poll() is None and time.monotonic() < give_up_at, shown.decode()
            if select.select([process.stdout], [], [], 0.1)[0]:
                shown += os.read(process.stdout.fileno(), 65536)

        def answer(text: str) -> tuple[int, str]:
            os.write(controller, text.encode() + b"\n")
            rest, _ = process.communicate(timeout=60)
            return process.returncode, (shown + rest).decode()

        yield answer
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
        os.close(terminal)


async def test_a_lease_that_changes_hands_at_the_prompt_is_not_broken(
    mongolock_uri: str, pymongo_collection: Any
) -> None:
    from mongolock_async.operations import inspect_lock

    first = AsyncMongoLock(pymongo_collection, "ledger", ttl=30, label="first")
    assert await first.acquire()
    with at_the_prompt(mongolock_uri, pymongo_collection, "ledger") as answer:
        assert await first.release()  # while the operator reads the prompt, the holder changes
        second = AsyncMongoLock(pymongo_collection, "ledger", ttl=30, label="second")
        assert await second.acquire()
        code, shown = await asyncio.to_thread(answer, "y")
    assert code == 0, shown
    assert "About to break the lease of first" in shown and "had ended or changed hands" in shown, shown
    assert "second" not in shown.split("Release it?")[1], "nothing of the new holder was broken or said"
    info = await inspect_lock(pymongo_collection, "ledger")
    assert info is not None and [holder.label for holder in info.holders] == ["second"]
    assert await second.release(), "the new holder's lease is intact"


async def test_the_permits_shown_are_the_only_ones_broken(mongolock_uri: str, pymongo_collection: Any) -> None:
    from mongolock_async.operations import inspect_lock

    handles = {label: AsyncMongoSemaphore(pymongo_collection, "pool", 3, ttl=30, label=label) for label in "ab"}
    for handle in handles.values():
        assert await handle.acquire(blocking=False)
    with at_the_prompt(mongolock_uri, pymongo_collection, "pool") as answer:
        assert await handles["a"].release()  # "a" leaves and "c" comes while the prompt waits
        late = AsyncMongoSemaphore(pymongo_collection, "pool", 3, ttl=30, label="c")
        assert await late.acquire(blocking=False)
        code, shown = await asyncio.to_thread(answer, "y")
    assert code == 0, shown
    said = shown.split("Release it?")[1]
    assert "Released 1 permit(s)" in said and "b (" in said and "had ended or changed hands" in said, shown
    info = await inspect_lock(pymongo_collection, "pool")
    assert info is not None and [holder.label for holder in info.holders] == ["c"], "the late holder stays"
    assert await late.release() and not await handles["b"].release()
