"""Generated histories of the lock, the semaphore and the read-write lock, each step checked
against a reference model (Hypothesis stateful testing, ``RuleBasedStateMachine``).

A machine holds a few handles of one primitive (3 of a lock, 4 of a semaphore of limit 2, 3
readers and 2 writers of a read-write lock; the first of each renews with the heartbeat; all three
primitives at once in the variant that restarts its server) and runs generated steps:

- ``try_acquire``: ``acquire(blocking=False)``;
- ``acquire``: a blocking acquire with a timeout (30 s where the model grants, returning at the
  first answer; 0.1 s where it refuses, as nothing else moves meanwhile);
- ``release``, and ``extend`` (with the TTL kept or a new one);
- ``expire``: a live lease's expiry set to a second ago on the server's clock, by the admin client:
  how leases end here, since every lease is 300 s long and only the rules move time;
- ``drop``: a handle deleted and garbage-collected (nothing may keep it), after which its lease is
  released, or the library warns that the release failed (the lease then stays until it expires,
  never renewed);
- ``purge``: what the idle-cleanup TTL index does, deleting a name's document once no lease of it
  is live (and sparing it otherwise);
- ``observe``: ``locked()`` and ``owned()`` of every handle;
- ``restart`` (the variant with a server of its own only): the server SIGKILLed or stopped and
  started again on its data.

The model says what every answer must be: whether an acquisition is granted (room for its weight:
one holder of a lock, ``limit`` of a semaphore, readers or one writer of a read-write lock); each
grant's fencing token above every earlier one of its name (through releases, expiries, takeovers,
purges and restarts); what ``release`` returns (True only for a live lease; a second release
False); that ``extend`` of a lease gone raises ``LockNotOwnedError`` and marks it lost; and
``locked()`` and ``owned()``. After every step the handles' own state (``fencing_token``,
``deadline``) and the server's documents, read by the admin client, must show exactly what the
model holds: the live leases' tokens and weights, the last token issued, no live queue place left
behind. Nothing is skipped: an answer the model did not predict fails the test.

A step *succeeds* when it starts or ends an acquisition as the model predicted (a grant; a release
or a drop of a handle that believes it holds; an expiry), purges a document, or restarts the
server; the others only check answers (refusals, extends, queries). At most ``MAX_IDLE_STREAK``
steps that do not succeed run in a row (the rules' preconditions see to that; an example in which
Hypothesis disabled every rule that could succeed is abandoned, as is one that disabled ``restart``
when it was due), every example runs its full length, and ``teardown`` asserts of each one that
at least ``MIN_SUCCESS_SHARE`` of its steps succeeded, with at least ``MIN_GRANTS`` grants (and in
the restart variant, a restart). Each test asserts that it ran its examples.

Profiles (``MONGOLOCK_STATEFUL_PROFILE``): ``default``, sized for ``make test``; ``soak``, many
more and longer histories, which ``make soak`` runs.

The three machines run on the run's server (``MONGODB_URI`` if set, else the session's embedded
server), on a fresh collection; only the restart variant starts a server of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeVar

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from mongolock_async import (
    AsyncMongoLock,
    AsyncMongoRWLock,
    AsyncMongoSemaphore,
    LockAlreadyHeldError,
    LockNotOwnedError,
    LockTimeoutError,
)
from mongolock_async._core.rwlock import MAX_READERS
from mongolock_async._runtime import waiting
from mongolock_async.store import mutex, permits
from mongolock_async.testing import EmbeddedMongo
from mongolock_async.testing.clients import TEST_DATABASE, close_client, make_client, shard_blocking
from tests.support.run_settings import SHARDED

T = TypeVar("T")


@dataclass(frozen=True)
class Profile:
    examples: int
    """Examples per machine and driver (the restart variant: ``restart_examples``)."""
    steps: int
    """Steps per example."""
    restart_examples: int
    restarts: int
    """The most restarts of the private server in one example of the restart variant."""
    timeout: float
    """Seconds each test may take (pytest-timeout)."""


PROFILES = {
    # In make test's 8 workers, 6 examples took 30 to 38 s per machine and driver: 3 keep the suite near 5 minutes.
    "default": Profile(examples=3, steps=30, restart_examples=2, restarts=1, timeout=300),
    "soak": Profile(examples=150, steps=60, restart_examples=30, restarts=4, timeout=3600),
}


def _profile() -> Profile:
    chosen = os.environ.get("MONGOLOCK_STATEFUL_PROFILE", "default")
    if chosen not in PROFILES:
        raise pytest.UsageError(f"MONGOLOCK_STATEFUL_PROFILE={chosen!r}: expected one of {sorted(PROFILES)}")
    return PROFILES[chosen]


PROFILE = _profile()
pytestmark = [pytest.mark.safety, pytest.mark.timeout(PROFILE.timeout)]

TTL = 300.0
"""Every lease's TTL: no lease ends by time within an example (seconds long); the rules end them."""
HEARTBEAT = 0.5
"""The renewal interval of the first handle of each primitive (the others renew nothing)."""
REFUSAL_WAIT = 0.1
"""The timeout of a blocking acquire the model refuses. A server slower than that to answer makes it
raise ``LockTimeoutError`` saying MongoDB was not reached, which is a refusal too."""
GRANT_WAIT = 30.0
"""The timeout of a blocking acquire the model grants: it returns at the first answer."""
SEMAPHORE_LIMIT = 2
MAX_IDLE_STREAK = 2
"""Steps in a row that change nothing held, at most."""
MIN_SUCCESS_SHARE = 1 / 3
MIN_GRANTS = 2
STEP_BOUND = 60.0
"""Seconds a step's requests may take before the step fails (a hung request, not a slow one)."""
SETTLE_BOUND = waiting.GIVE_UP_SLACK + 3.0
"""Seconds to wait for what a step leaves in the background: a dropped handle's release (bounded
by the library at ``GIVE_UP_SLACK``), a withdrawn place."""
RECONNECT_BOUND = 30.0
RESTART_DUE = 5
"""Steps after which the restart variant's first restart is due."""

# The server's clock as a date: SecantusDB compares a stored date with $$NOW wrongly, and with this
# rightly, as MongoDB does (docs/design.md; the store's SERVER_NOW).
SERVER_NOW: dict[str, Any] = {"$toDate": {"$toLong": "$$NOW"}}
A_SECOND_AGO: dict[str, Any] = {"$toDate": {"$subtract": [{"$toLong": "$$NOW"}, 1000]}}


class ModelMismatch(AssertionError):
    """The library answered other than the model says (raised without ``assert``, so ``python -O``
    keeps every check)."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise ModelMismatch(message)


# -- the primitives ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotSpec:
    label: str
    weight: int
    heartbeat: bool = False
    fair: bool = False


@dataclass(frozen=True)
class Kind:
    """A primitive, as the model sees it: holders' weights add up to at most ``capacity``."""

    name: str
    capacity: int
    slots: tuple[SlotSpec, ...]
    permits: bool
    """Whether its document lists holders (a semaphore's, a read-write lock's), else an owner."""

    def __repr__(self) -> str:
        return self.name


LOCK = Kind(
    "lock", 1, (SlotSpec("lock 0", 1, heartbeat=True), SlotSpec("lock 1", 1, fair=True), SlotSpec("lock 2", 1)), False
)
SEMAPHORE = Kind(
    "semaphore",
    SEMAPHORE_LIMIT,
    (
        SlotSpec("semaphore 0", 1, heartbeat=True),
        SlotSpec("semaphore 1", 1, fair=True),
        SlotSpec("semaphore 2", 1),
        SlotSpec("semaphore 3", 1),
    ),
    True,
)
RWLOCK = Kind(
    "rwlock",
    MAX_READERS,
    (
        SlotSpec("reader 0", 1, heartbeat=True),
        SlotSpec("reader 1", 1),
        SlotSpec("reader 2", 1),
        SlotSpec("writer 0", MAX_READERS, heartbeat=True),
        SlotSpec("writer 1", MAX_READERS),
    ),
    True,
)


def make_handle(kind: Kind, spec: SlotSpec, collection: Any, name: str) -> AsyncMongoLock:
    options: dict[str, Any] = {"ttl": TTL, "label": spec.label, "heartbeat": HEARTBEAT if spec.heartbeat else False}
    if kind is LOCK:
        return AsyncMongoLock(collection, name, fair=spec.fair, **options)
    if kind is SEMAPHORE:
        return AsyncMongoSemaphore(collection, name, SEMAPHORE_LIMIT, fair=spec.fair, **options)
    rwlock = AsyncMongoRWLock(collection, name, **options)
    return rwlock.read() if spec.weight == 1 else rwlock.write()


# -- the model ---------------------------------------------------------------------------------------


@dataclass
class Lease:
    """A lease live on the server, by the model."""

    weight: int
    holder: str
    """The label of the handle that took it, or ``(dropped)``: its handle is gone and its release
    failed (it stays until it expires, never renewed)."""
    expires_at: datetime | None = None
    """A dropped handle's lease: its expiry as the server had it when the release failed."""


@dataclass(eq=False)
class Resource:
    """One name of one primitive: what is live on the server, by the model."""

    kind: Kind
    name: str
    live: dict[int, Lease] = field(default_factory=dict)
    """The live leases by fencing token."""
    last_token: int | None = None
    document: bool = False
    """Whether the name has a document (an acquire made one; a purge removed it)."""

    def used(self) -> int:
        return sum(lease.weight for lease in self.live.values())

    def grants(self, weight: int) -> bool:
        return self.used() + weight <= self.kind.capacity

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class Slot:
    """A handle and what the model says it believes."""

    spec: SlotSpec
    resource: Resource
    handle: Any
    belief: Literal["idle", "held", "lost"] = "idle"
    """``held``: it holds an acquisition and has not been told of its end (the lease may be gone
    on the server: expired by a rule, taken over); ``lost``: an ``extend`` found the lease gone,
    and it may acquire again. A handle with the heartbeat learns of a lease gone by itself, at a
    renewal whose moment nothing in the model decides: it stays ``held`` here (what the steps are
    generated from must not depend on timing), and the checks accept either."""
    token: int | None = None
    ttl: float = TTL

    def live(self) -> bool:
        return self.belief == "held" and self.token in self.resource.live

    def holds(self) -> bool:
        """Whether it believes it holds (a release or drop of it ends an acquisition)."""
        return self.belief == "held"

    def noticed_loss(self) -> bool:
        """Whether the handle was told its lease is gone (by an extend, or by a renewal)."""
        return self.handle.lost_error is not None

    def __repr__(self) -> str:
        return self.spec.label


@dataclass
class View:
    """A name's document as the server has it, judged on the server's clock."""

    live: dict[int, tuple[int, datetime]]
    """The live leases: fencing token -> weight, expiry."""
    fence: int | None
    live_places: int


@dataclass
class Stats:
    """Per test: the examples and what their steps did."""

    full: int = 0
    abandoned: int = 0
    steps: int = 0
    successes: int = 0
    grants: int = 0
    refusals: int = 0
    restarts: int = 0
    fewest_successes: int | None = None
    fewest_grants: int | None = None

    def __str__(self) -> str:
        return (
            f"{self.full} examples ({self.abandoned} abandoned), {self.steps} steps: "
            f"{self.successes} succeeded ({self.grants} grants), {self.refusals} refusals, {self.restarts} restarts; "
            f"fewest in one full example: {self.fewest_successes} successes, {self.fewest_grants} grants"
        )


class Warnings(logging.Handler):
    """What the library warned of (a dropped handle's release that failed says so)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class World:
    """What a test's examples share: an event loop of their own (the rules are synchronous and run
    each step's coroutines in it), a client of the driver under test made in that loop, a fresh
    collection, and the admin client that edits and reads its documents directly."""

    def __init__(
        self,
        driver: str,
        uri: str,
        admin: MongoClient[dict[str, Any]],
        profile: Profile,
        *,
        server: EmbeddedMongo | None = None,
    ) -> None:
        self.profile = profile
        self.server = server
        self.admin = admin
        self.collection_name = f"stateful_{uuid.uuid4().hex[:12]}"
        if SHARDED and server is None:
            shard_blocking(admin, TEST_DATABASE, self.collection_name)
        self.raw = admin[TEST_DATABASE].get_collection(self.collection_name, write_concern=WriteConcern("majority"))
        self.examples = 0
        self.stats = Stats()
        self.warnings = Warnings()
        logging.getLogger("mongolock_async").addHandler(self.warnings)
        self.loop = asyncio.new_event_loop()

        async def client() -> Any:
            return make_client(driver, uri)

        self.client = self.loop.run_until_complete(client())
        self.collection = self.client[TEST_DATABASE][self.collection_name]

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_BOUND))

    def views(self, resources: Sequence[Resource]) -> dict[str, View]:
        names = [resource.name for resource in resources]
        documents = self.raw.aggregate([{"$match": {"_id": {"$in": names}}}, {"$addFields": {"_now": SERVER_NOW}}])
        return {document["_id"]: _view(document) for document in documents}

    def reconnect(self) -> None:
        """Wait until the restarted server takes the async client's writes and the admin client's reads."""

        async def writable() -> None:
            give_up_at = time.monotonic() + RECONNECT_BOUND
            probe = self.client[TEST_DATABASE][f"{self.collection_name}_probe"]
            while True:
                try:
                    await probe.update_one({"_id": "probe"}, {"$inc": {"n": 1}}, upsert=True)
                    return
                except PyMongoError:
                    if time.monotonic() > give_up_at:
                        raise
                    await asyncio.sleep(0.05)

        self.run(writable())
        give_up_at = time.monotonic() + RECONNECT_BOUND
        while True:
            try:
                self.raw.find_one({"_id": "probe"})
                return
            except PyMongoError:
                if time.monotonic() > give_up_at:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        logging.getLogger("mongolock_async").removeHandler(self.warnings)
        with contextlib.suppress(PyMongoError):
            self.admin[TEST_DATABASE].drop_collection(self.collection_name)
            self.admin[TEST_DATABASE].drop_collection(f"{self.collection_name}_probe")
        loop = self.loop
        try:
            loop.run_until_complete(close_client(self.client))
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()

            async def finish() -> None:
                await asyncio.gather(*left, return_exceptions=True)

            loop.run_until_complete(finish())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _view(document: dict[str, Any]) -> View:
    now = document["_now"]
    if "holders" in document:
        live = {
            holder["fence"]: (holder.get("w") or 1, holder["exp"])
            for holder in document.get("holders") or []
            if holder["exp"] > now
        }
    elif isinstance(document.get("owner"), str) and document["expiresAt"] > now:
        live = {document["fence"]: (1, document["expiresAt"])}
    else:
        live = {}
    places = sum(1 for place in document.get("queue") or [] if place["exp"] > now)
    return View(live, document.get("fence"), places)


def _background_of(loop: asyncio.AbstractEventLoop) -> set[asyncio.Task[Any]]:
    """The library's background requests (a dropped handle's release) in ``loop``."""
    return {task for task in waiting._background if task.get_loop() is loop and not task.done()}


# -- the machine -------------------------------------------------------------------------------------


class LeaseMachine(RuleBasedStateMachine):
    """Handles of ``kinds`` on fresh names, and the model of what they hold (set per test)."""

    world: ClassVar[World]
    kinds: ClassVar[tuple[Kind, ...]]

    def __init__(self) -> None:
        super().__init__()
        world = self.world
        world.examples += 1
        self.resources = [Resource(kind, f"{kind.name}-{world.examples}") for kind in self.kinds]
        self.slots = [
            Slot(spec, resource, make_handle(resource.kind, spec, world.collection, resource.name))
            for resource in self.resources
            for spec in resource.kind.slots
        ]
        self.steps = self.successes = self.grants = self.refusals = self.restarts = 0
        self.idle_streak = 0
        self.clean = True
        """False while a step or a check runs: one that raised leaves it so, and teardown then
        asserts nothing of its own (which would hide the failure)."""

    # -- running steps -------------------------------------------------------------------------------

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.world.run(coroutine)

    def _begin(self) -> None:
        self.clean = False

    def _done(self, success: bool) -> None:
        self.steps += 1
        if success:
            self.successes += 1
            self.idle_streak = 0
        else:
            self.idle_streak += 1
        self.clean = True

    def _allowed(self, options: Sequence[T], succeeds: Callable[[T], bool]) -> list[T]:
        """``options``, or after ``MAX_IDLE_STREAK`` steps that changed nothing, those that will
        (none while another step is due)."""
        if self._due():
            return []
        if self.idle_streak < MAX_IDLE_STREAK:
            return list(options)
        return [option for option in options if succeeds(option)]

    def _state(self, resource: Resource) -> str:
        leases = ", ".join(f"{token} ({lease.holder}, weight {lease.weight})" for token, lease in resource.live.items())
        return f"{resource.name}: live {leases or 'nothing'}, last token {resource.last_token}"

    def _raises(self, error: type[BaseException], coroutine: Coroutine[Any, Any, Any], what: str) -> None:
        try:
            self.run(coroutine)
        except error:
            return
        raise ModelMismatch(f"{what}: did not raise {error.__name__}")

    def _pick(self, data: st.DataObject, options: Sequence[T], label: str) -> T:
        """One of ``options``, drawn by its name: a drawn object is kept for the report of a
        failing example, and a slot would keep its handle (which ``drop`` must see collected)."""
        by_name = {repr(option): option for option in options}
        return by_name[data.draw(st.sampled_from(list(by_name)), label=label)]

    # -- candidates ----------------------------------------------------------------------------------

    def _to_acquire(self) -> list[Slot]:
        return self._allowed(
            [slot for slot in self.slots if slot.belief != "held"],
            lambda slot: slot.resource.grants(slot.spec.weight),
        )

    def _to_release(self) -> list[Slot]:
        return self._allowed([slot for slot in self.slots if slot.belief != "idle"], Slot.holds)

    def _to_extend(self) -> list[Slot]:
        return self._allowed(self.slots, lambda slot: False)  # it starts and ends no lease

    def _to_drop(self) -> list[Slot]:
        return self._allowed(self.slots, Slot.holds)

    def _due(self) -> bool:
        """Whether a step must come next that the other rules must wait for."""
        return False

    def _to_expire(self) -> list[Resource]:
        return self._allowed([resource for resource in self.resources if resource.live], lambda resource: True)

    def _to_purge(self) -> list[Resource]:
        return self._allowed(self.resources, lambda resource: resource.document and not resource.live)

    # -- rules ---------------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._to_acquire()))
    @rule(data=st.data())
    def try_acquire(self, data: st.DataObject) -> None:
        """``acquire(blocking=False)``: granted exactly when the model has room for its weight."""
        self._acquire(self._pick(data, self._to_acquire(), "slot"), blocking=False)

    @precondition(lambda self: bool(self._to_acquire()))
    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        """A blocking ``acquire(timeout=...)``: granted at once when the model has room (30 s, never
        needed), else refused at its timeout (0.1 s), its place in the line withdrawn."""
        self._acquire(self._pick(data, self._to_acquire(), "slot"), blocking=True)

    def _acquire(self, slot: Slot, *, blocking: bool) -> None:
        self._begin()
        resource, handle = slot.resource, slot.handle
        expected = resource.grants(slot.spec.weight)
        before = self._state(resource)
        if not blocking:
            got = self.run(handle.acquire(blocking=False))
        else:
            try:
                got = self.run(handle.acquire(timeout=GRANT_WAIT if expected else REFUSAL_WAIT))
            except LockTimeoutError as error:
                expect(not expected and error.unreachable, f"{slot}: acquire(timeout=...) raised {error!r}")
                got = False
        resource.document = True
        how = "acquire(timeout=...)" if blocking else "acquire(blocking=False)"
        expect(got is expected, f"{slot}: {how} returned {got}, the model says {expected} ({before})")
        if not got:
            slot.belief, slot.token = "idle", None
            if blocking:
                self._await_withdrawal(resource)
            self.refusals += 1
            return self._done(False)
        token = handle.fencing_token
        expect(isinstance(token, int), f"{slot}: granted, with fencing token {token!r}")
        last = resource.last_token
        expect(
            last is None or token > last,
            f"{slot}: granted fencing token {token}, not above {last}, the last one issued for {resource.name}",
        )
        resource.last_token = token
        resource.live[token] = Lease(slot.spec.weight, slot.spec.label)
        slot.belief, slot.token, slot.ttl = "held", token, TTL
        self.grants += 1
        self._done(True)

    def _await_withdrawal(self, resource: Resource) -> None:
        """A waiter that gave up withdrew its place before returning (or within ``GIVE_UP_SLACK``,
        in the background): no place is left that a release could hand the lease to."""
        give_up_at = time.monotonic() + SETTLE_BOUND
        while (view := self.world.views([resource]).get(resource.name)) and view.live_places:
            if time.monotonic() > give_up_at:
                raise ModelMismatch(f"{resource.name}: a refused waiter left {view.live_places} live places queued")
            self.run(asyncio.sleep(0.02))

    @precondition(lambda self: bool(self._to_release()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """``release()``: True for a live lease, False for one gone (expired, taken over, lost);
        a second release returns False, and a handle that holds cannot acquire again meanwhile."""
        slot = self._pick(data, self._to_release(), "slot")
        self._begin()
        handle = slot.handle
        if slot.belief == "held" and not slot.noticed_loss():
            self._raises(LockAlreadyHeldError, handle.acquire(blocking=False), f"{slot}: acquire while holding")
        expected, held = slot.live(), slot.holds()
        before = self._state(slot.resource)
        got = self.run(handle.release())
        expect(got is expected, f"{slot}: release() returned {got}, the model says {expected} ({before})")
        if expected:
            del slot.resource.live[slot.token]  # type: ignore[arg-type]
        slot.belief, slot.token = "idle", None
        expect(self.run(handle.release()) is False, f"{slot}: a second release() returned True")
        self._done(held)

    @precondition(lambda self: bool(self._to_extend()))
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        """``extend(ttl)``: a live lease keeps its token and takes the TTL; a lease gone (or none)
        raises ``LockNotOwnedError``, and a held one then counts as lost."""
        slot = self._pick(data, self._to_extend(), "slot")
        ttl = data.draw(st.sampled_from([None, 200.0, 400.0]), label="ttl")
        self._begin()
        handle = slot.handle
        if slot.live():
            self.run(handle.extend(ttl))
            slot.ttl = slot.ttl if ttl is None else ttl
            expect(handle.fencing_token == slot.token, f"{slot}: extend() changed the fencing token")
            expect(handle.ttl == slot.ttl, f"{slot}: after extend({ttl}), ttl is {handle.ttl}")
            return self._done(False)
        self._raises(LockNotOwnedError, handle.extend(ttl), f"{slot}: extend() of a lease gone")
        if slot.belief == "held":
            slot.belief = "lost"
        if slot.belief == "lost":
            expect(handle.lost_error is not None and handle.lost.is_set(), f"{slot}: extend() failed, not lost")
        self._done(False)

    @precondition(lambda self: bool(self._to_expire()))
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """A live lease's expiry set to a second ago on the server's clock, as its TTL passing
        would (its handle, without the heartbeat, still believes: its local deadline is far)."""
        resource = self._pick(data, self._to_expire(), "name")
        token = data.draw(st.sampled_from(sorted(resource.live)), label="token")
        self._begin()
        if resource.kind.permits:
            mine = {"$eq": ["$$this.fence", token]}
            expired = {"$mergeObjects": ["$$this", {"exp": A_SECOND_AGO}]}
            edit = [
                {"$set": {"holders": {"$map": {"input": "$holders", "in": {"$cond": [mine, expired, "$$this"]}}}}},
                # The document's expiry is its latest permit's, as the store keeps it (the purge reads it).
                {
                    "$set": {
                        "expiresAt": {
                            "$max": [A_SECOND_AGO, {"$max": {"$map": {"input": "$holders", "in": "$$this.exp"}}}]
                        }
                    }
                },
            ]
            query: dict[str, Any] = {"_id": resource.name, "holders.fence": token}
        else:
            edit = [{"$set": {"expiresAt": A_SECOND_AGO}}]
            query = {"_id": resource.name, "fence": token}
        modified = self.world.raw.update_one(query, edit).modified_count
        expect(modified == 1, f"{resource.name}: the live lease {token} was not found to expire")
        del resource.live[token]
        self._done(True)

    @precondition(lambda self: bool(self._to_drop()))
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        """The handle deleted and garbage-collected: nothing keeps it, and its lease is released
        (or the library warns that the release failed: it then stays until it expires, never renewed)."""
        slot = self._pick(data, self._to_drop(), "slot")
        self._begin()
        resource, live, held, token = slot.resource, slot.live(), slot.holds(), slot.token
        dropped = weakref.ref(slot.handle)
        warned = len(self.world.warnings.messages)
        slot.handle = None
        gc.collect()
        expect(dropped() is None, f"{slot}: something still holds the dropped handle")
        self.run(self._settle())
        slot.handle = make_handle(resource.kind, slot.spec, self.world.collection, resource.name)
        slot.belief, slot.token, slot.ttl = "idle", None, TTL
        if live:
            assert token is not None
            view = self.world.views([resource]).get(resource.name)
            if view is not None and token in view.live:
                failed = [
                    message
                    for message in self.world.warnings.messages[warned:]
                    if "could not release" in message or "background release" in message
                ]
                expect(failed, f"{slot}: the lease {token} of the dropped handle is neither released nor reported")
                resource.live[token] = Lease(slot.spec.weight, "(dropped)", view.live[token][1])
            else:
                del resource.live[token]
        self._done(held)

    async def _settle(self) -> None:
        """Let the dropped handle's release run (scheduled from its finalizer) and finish."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + SETTLE_BOUND
        await asyncio.sleep(0)
        while (left := _background_of(loop)) and loop.time() < give_up_at:
            await asyncio.wait(left, timeout=give_up_at - loop.time())

    @precondition(lambda self: bool(self._to_purge()))
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        """What the idle-cleanup index does (``ensure_idle_cleanup_index``, with no delay): the
        document goes if its lease (every permit) has ended, and is spared otherwise."""
        resource = self._pick(data, self._to_purge(), "name")
        self._begin()
        expected = resource.document and not resource.live
        ended = {"_id": resource.name, "$expr": {"$lte": ["$expiresAt", SERVER_NOW]}}
        deleted = self.world.raw.delete_one(ended).deleted_count
        expect(deleted == int(expected), f"{resource.name}: purge deleted {deleted} ({self._state(resource)})")
        resource.document = resource.document and not deleted
        self._done(expected)

    @precondition(lambda self: bool(self._allowed([self], lambda machine: False)))
    @rule()
    def observe(self) -> None:
        """``locked()`` (no room for this handle's weight) and ``owned()`` (a live lease of its own)
        of every handle."""
        self._begin()

        async def ask() -> list[tuple[bool, bool]]:
            async def both(slot: Slot) -> tuple[bool, bool]:
                return await slot.handle.locked(), await slot.handle.owned()

            return list(await asyncio.gather(*(both(slot) for slot in self.slots)))

        for slot, (locked, owned) in zip(self.slots, self.run(ask()), strict=True):
            resource = slot.resource
            expected = not resource.grants(slot.spec.weight)
            expect(
                locked is expected, f"{slot}: locked() is {locked}, the model says {expected} ({self._state(resource)})"
            )
            expect(owned is slot.live(), f"{slot}: owned() is {owned}, the model says {slot.live()}")
        self._done(False)

    # -- checks after every step ---------------------------------------------------------------------

    @invariant()
    def handles_agree(self) -> None:
        """A handle shows the token of the acquisition it believes it holds, and none otherwise."""
        self.clean = False
        for slot in self.slots:
            handle = slot.handle
            if slot.belief == "held" and slot.noticed_loss():
                expect(
                    not slot.live(), f"{slot}: its lease is live, yet the handle says it is lost: {handle.lost_error}"
                )
                expect(slot.spec.heartbeat, f"{slot}: told of a loss without the heartbeat or an extend")
                expect(handle.fencing_token is None, f"{slot}: fencing_token {handle.fencing_token}, lost")
            elif slot.belief == "held":
                expect(handle.fencing_token == slot.token, f"{slot}: fencing_token {handle.fencing_token}")
                expect(handle.deadline is not None, f"{slot}: holds, without a deadline")
            else:
                expect(handle.fencing_token is None, f"{slot}: fencing_token {handle.fencing_token}, holding nothing")
                expect(handle.deadline is None, f"{slot}: a deadline, holding nothing")
        self.clean = True

    @invariant()
    def server_agrees(self) -> None:
        """The documents hold exactly the model's live leases (tokens and weights), the last token
        issued, and no live queue place."""
        self.clean = False
        views = self.world.views(self.resources)
        for resource in self.resources:
            view = views.get(resource.name)
            expect((view is not None) is resource.document, f"{resource.name}: document there: {view is not None}")
            if view is None:
                continue
            weights = {token: weight for token, (weight, _) in view.live.items()}
            expected = {token: lease.weight for token, lease in resource.live.items()}
            expect(weights == expected, f"{resource.name}: the server has live {weights}, the model {expected}")
            for token, lease in resource.live.items():
                if lease.expires_at is not None:
                    expect(view.live[token][1] == lease.expires_at, f"{resource.name}: a dropped lease {token} renewed")
            if resource.last_token is not None:
                expect(
                    view.fence == resource.last_token,
                    f"{resource.name}: fence {view.fence}, last token {resource.last_token}",
                )
            expect(view.live_places == 0, f"{resource.name}: {view.live_places} live places queued")
        self.clean = True

    def teardown(self) -> None:
        stats = self.world.stats
        # Hypothesis runs every example to its full length (``explore``: ``_min_steps``), unless
        # it abandons it (no enabled rule could run) or a step failed: those are not counted.
        counted = self.clean and self.steps >= self.world.profile.steps
        for slot in self.slots:  # leave no lease to a handle collected after its loop closed
            if slot.handle is not None and slot.belief != "idle":
                with contextlib.suppress(Exception):
                    self.world.run(slot.handle.release())
        if not counted:
            stats.abandoned += 1
            return
        stats.full += 1
        stats.steps += self.steps
        stats.successes += self.successes
        stats.grants += self.grants
        stats.refusals += self.refusals
        stats.restarts += self.restarts
        if stats.fewest_successes is None or self.successes < stats.fewest_successes:
            stats.fewest_successes = self.successes
        if stats.fewest_grants is None or self.grants < stats.fewest_grants:
            stats.fewest_grants = self.grants
        expect(
            self.successes >= MIN_SUCCESS_SHARE * self.steps,
            f"{self.successes} of {self.steps} steps succeeded: a history that changed little proves little",
        )
        expect(self.grants >= MIN_GRANTS, f"{self.grants} grants in {self.steps} steps")


class RestartMachine(LeaseMachine):
    """The machine with a ``restart`` rule: only on a server the test started for itself. The
    first restart is due after ``RESTART_DUE`` steps: the other rules wait for it (an example in
    which Hypothesis disabled ``restart`` is abandoned there), so that every example restarts."""

    def _due(self) -> bool:
        return self.restarts == 0 and self.steps >= RESTART_DUE

    def teardown(self) -> None:
        counted = self.clean and self.steps >= self.world.profile.steps
        super().teardown()
        if counted:
            expect(self.restarts >= 1, f"no restart in {self.steps} steps")

    @precondition(lambda self: self.restarts < self.world.profile.restarts)
    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        """The private server SIGKILLed (``crash``) or stopped, and started again on its data:
        every live lease is still live, every belief stands, and tokens go on rising."""
        self._begin()
        server = self.world.server
        assert server is not None
        server.restart(crash=crash)
        self.world.reconnect()
        self.restarts += 1
        self._done(True)


def explore(world: World, base: type[LeaseMachine], kinds: tuple[Kind, ...], examples: int, **overrides: Any) -> Stats:
    """Run ``base`` over ``kinds`` for ``examples`` examples; return what they did."""
    machine = type(
        f"{base.__name__}Of{''.join(k.name.title() for k in kinds)}", (base,), {"world": world, "kinds": kinds}
    )
    options: dict[str, Any] = {
        "max_examples": examples,
        "stateful_step_count": world.profile.steps,
        "deadline": None,
        "database": None,
        "print_blob": True,
        "suppress_health_check": list(HealthCheck),
        **overrides,
    }
    # ``_min_steps``: every example runs its full length. Without it, Hypothesis also runs shorter
    # ones (a mutation of an earlier example can stop early), down to a step or two, and a minimum
    # of successful steps could not be asserted per example. A failure still shrinks to the fewest
    # steps before it (the example ends at the failing step).
    run_state_machine_as_test(machine, settings=settings(**options), _min_steps=world.profile.steps)
    return world.stats


@pytest.fixture
def target_world(
    mongolock_driver: str, mongolock_uri: str, mongolock_admin_client: MongoClient[dict[str, Any]]
) -> Iterator[World]:
    world = World(mongolock_driver, mongolock_uri, mongolock_admin_client, PROFILE)
    try:
        yield world
    finally:
        world.close()


@pytest.mark.parametrize("kind", [LOCK, SEMAPHORE, RWLOCK], ids=repr)
def test_histories_match_the_model(target_world: World, kind: Kind) -> None:
    stats = explore(target_world, LeaseMachine, (kind,), PROFILE.examples)
    print(f"{kind}: {stats}")
    expect(stats.full >= PROFILE.examples, f"only {stats.full} of {PROFILE.examples} examples ran their full length")


def test_histories_through_restarts_match_the_model(mongolock_driver: str, private_server: EmbeddedMongo) -> None:
    """A lock, a semaphore and a read-write lock at once, with ``restart`` among the rules.
    Private server: its rules restart and crash the server (``World`` calls
    ``private_server.restart``), which a shared one must never be; the other histories run on
    the run's server."""
    admin: MongoClient[dict[str, Any]]
    with MongoClient(private_server.uri, serverSelectionTimeoutMS=10_000) as admin:
        world = World(mongolock_driver, private_server.uri, admin, PROFILE, server=private_server)
        try:
            stats = explore(world, RestartMachine, (LOCK, SEMAPHORE, RWLOCK), PROFILE.restart_examples)
        finally:
            world.close()
    print(f"through restarts: {stats}")
    expect(
        stats.full >= PROFILE.restart_examples,
        f"only {stats.full} of {PROFILE.restart_examples} examples ran their full length",
    )
    expect(stats.restarts >= 1, "no example restarted the server")


# -- the control: a broken store is caught -----------------------------------------------------------


def _stages(pipeline: list[Any]) -> list[dict[str, Any]]:
    return [bson.decode(stage.raw) if isinstance(stage, RawBSONDocument) else dict(stage) for stage in pipeline]


def _tokens_repeat(pipeline: list[Any]) -> list[dict[str, Any]]:
    """A lock's acquire that takes the lease over keeping the last token (if the name has one)."""
    stages = _stages(pipeline)
    for stage in stages:
        fence = stage.get("$set", {}).get("fence")
        if isinstance(fence, dict) and "$cond" in fence:
            fence["$cond"][1] = {"$ifNull": ["$fence", fence["$cond"][1]]}
    return stages


def _release_keeps_owner(pipeline: list[Any]) -> list[dict[str, Any]]:
    """A lock's release that leaves its owner in place."""
    stages = _stages(pipeline)
    for stage in stages:
        if "owner" in stage.get("$set", {}):
            stage["$set"]["owner"] = "$owner"
    return stages


def _semaphore_overfills(pipeline: list[Any]) -> list[dict[str, Any]]:
    """A semaphore's acquire that finds room whatever is held."""
    stages = _stages(pipeline)
    for stage in stages:
        if "_room" in stage.get("$set", {}):
            stage["$set"]["_room"] = {"$literal": True}
    return stages


DEFECTS: dict[str, tuple[Kind, Any, str, Callable[[list[Any]], list[dict[str, Any]]], str]] = {
    "tokens-do-not-rise": (LOCK, mutex, "acquire_pipeline", _tokens_repeat, "not above"),
    "release-keeps-the-owner": (LOCK, mutex, "release_pipeline", _release_keeps_owner, "release() returned"),
    "semaphore-over-its-limit": (SEMAPHORE, permits, "acquire_pipeline", _semaphore_overfills, "the model says False"),
}


@pytest.mark.one_driver
@pytest.mark.parametrize("defect", DEFECTS)
def test_a_broken_store_fails_the_machine(target_world: World, monkeypatch: pytest.MonkeyPatch, defect: str) -> None:
    """A check that cannot fail proves nothing: each planted defect (a pipeline of the store
    rewritten, in this process only) must be caught by the model."""
    kind, module, name, rewrite, says = DEFECTS[defect]
    build = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: rewrite(build(*args, **kwargs)))
    with pytest.raises(ModelMismatch, match=re.escape(says)):
        explore(target_world, LeaseMachine, (kind,), 50, phases=[Phase.generate], report_multiple_bugs=False)
