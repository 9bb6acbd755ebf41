"""Send a request that runs to completion, within a bound, whatever happens to its caller.

A request cut off mid-flight leaves its outcome unknown: an acquire may have taken the lock for a
task that is gone. So a cancellation of the caller that arrives while a lock request is in flight
is held back until the outcome is known and cleaned up, then re-raised as itself. This works for
plain ``Task.cancel()`` (``asyncio.timeout``, ``wait_for``, a web server dropping a request) as well
as anyio cancel scopes; anyio's own shielding does not stop the former. The request runs in its
caller's task (``_Shielded``), which waits on a stand-in for each future the request waits on that
refuses to be cancelled; ``Task.cancel`` then only marks the task, and the cancellation raised at
the task's next step is kept from the request. A task of its own per request did the same at the
price of a task and two event-loop iterations per request (benchmarks/README.md).

The request itself is bounded by a timer that cancels the future it waits on (one timer for the
loop's requests in flight, armed at the earliest cut: ``_Cuts``): the driver then closes the
connection (PyMongo closes a connection on any exception during an operation,
pymongo/asynchronous/pool.py) and the caller gets ``RequestTimeout``, which, like any error in
transit, means the request may or may not have been applied. A timer costs a fraction of the
driver's own client-side operation timeout (``pymongo.timeout``: context variables and per-command
bookkeeping, about 40 us of CPU per request here), and leaves the driver's server selection timeout
as the URI sets it.

On Python 3.11, PyMongo's timed waits for a server and for a pooled connection run in
``asyncio.wait_for`` (pymongo/lock.py, ``_async_cond_wait``), which there returns normally when what
it waits for is ready in the loop iteration that cancels it (CPython gh-86296): the cut is lost,
and the request waits on as long as the driver lets it. So a request can also carry the driver's
own deadline (``driver_deadline``), which ends a wait whose cut was lost by itself. That deadline
falls just after the cut, never before: a cancellation that arrives while 3.11's ``wait_for`` is
cleaning up after its own timeout (its inner ``Condition.wait`` re-acquiring the pool's lock) leaves
that lock held for good, and every later request of the pool waits for ever. (Seen with eight
requests sharing one pooled connection, cut as it came back: with the deadline 1 ms before the cut,
the pool's lock was left held by no task and every request waited, in the first run; with it 1 ms
after, none in 200 runs.) ``store/sending.py`` says which requests carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import weakref
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

import pymongo
from pymongo.errors import NetworkTimeout

T = TypeVar("T")

_BOUND = "mongolock_async: the request's bound passed"
DRIVER_DEADLINE_AFTER_CUT = 0.001
"""Seconds by which a request's driver deadline follows its cut (see the module's doc)."""


class RequestTimeout(NetworkTimeout):
    """A lock request got no reply within its bound; the server may or may not have applied it."""


class _Request(asyncio.Task[T]):
    """The task of a request started in the background (``start_shielded``). Only its bound may
    cancel it: ``cancel`` says no to anything else."""

    def cancel(self, msg: Any = None) -> bool:
        return msg is _BOUND and super().cancel(msg)


class _Refusing:
    """What the caller's task waits on while a shielded request waits on ``future``: the task's
    callback is put on ``future``, but a cancellation is refused. ``Task.cancel`` then only marks
    the task (``_must_cancel``), which raises the cancellation in its coroutine at its next step,
    once ``future`` is done; ``_Shielded`` holds it back there. A task waits on any object with
    ``_asyncio_future_blocking`` set and these methods (``Task.cancel`` and ``Task.__step`` in
    Lib/asyncio/tasks.py, and their C twins in Modules/_asynciomodule.c)."""

    __slots__ = ("_asyncio_future_blocking", "_shield", "future")

    def __init__(self, future: Any, shield: _Shielded[Any]) -> None:
        self.future = future
        self._shield = shield
        self._asyncio_future_blocking = True

    def cancel(self, msg: Any = None) -> bool:
        self._shield.cancel_requested(msg)
        return False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self.future.get_loop()
        return loop

    def add_done_callback(
        self, callback: Callable[[Any], object], *, context: contextvars.Context | None = None
    ) -> None:
        self.future.add_done_callback(callback, context=context)

    def done(self) -> bool:  # anyio asks it of a task's waiter
        return bool(self.future.done())

    def __repr__(self) -> str:
        return f"<shielded {self.future!r}>"


class _Shielded(Generic[T]):
    """Runs one request in its caller's task as if in a task of its own, to its end whatever happens
    to the caller (see the module's doc): ``await`` it for the request's outcome.

    Each time the request waits, the caller waits on a ``_Refusing`` in its place. A cancellation of
    the caller is then raised in it once the future the request waits on is done; it is held back
    (``caller_cancellation`` gives it) and the request resumes as if nothing had happened.

    While the request runs, this is the loop's current task: what cancels "the current task" from
    inside the request (its own timeouts: ``asyncio.timeout``, and ``asyncio.wait_for`` from Python
    3.12 on, which the driver uses around socket writes and its waits for a server or a connection)
    cancels the request, not its caller; so does the bound's cut (``cancel(_BOUND)``). A cancellation
    cancels the future the request waits on, or, when there is none to cancel, is raised in the
    request when it next runs, as ``Task.cancel`` does.
    """

    __slots__ = ("_cancel_message", "_cancelled", "_cancels", "_must_cancel", "_request", "_waiting_on")

    def __init__(self, request: Coroutine[Any, Any, T]) -> None:
        self._request = request
        self._waiting_on: Any = None
        self._cancels = 0
        self._must_cancel = False
        self._cancel_message: Any = None
        self._cancelled: asyncio.CancelledError | None = None

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the request (a timeout of its own, or its bound), as ``Task.cancel`` would."""
        self._cancels += 1
        waiting_on = self._waiting_on
        if waiting_on is None or not waiting_on.cancel(msg):
            self._must_cancel, self._cancel_message = True, msg
        return True

    def cancelling(self) -> int:
        return self._cancels

    def uncancel(self) -> int:
        if self._cancels > 0:
            self._cancels -= 1
        return self._cancels

    def cancel_requested(self, msg: Any) -> None:
        """The caller's task was cancelled (``msg``: the cancellation's message) while it waited."""
        if self._cancelled is None:
            self._cancelled = asyncio.CancelledError() if msg is None else asyncio.CancelledError(msg)

    def caller_cancellation(self) -> asyncio.CancelledError | None:
        """The cancellation of the caller held back while the request ran, if any."""
        return self._cancelled

    def __await__(self) -> Generator[Any, None, T]:
        request = self._request
        loop = asyncio.get_running_loop()
        caller = asyncio.current_task(loop)
        stand_in: Any = self  # the loop's current task while the request runs (typed as a Task)
        error: BaseException | None = None
        while True:
            if self._must_cancel:
                self._must_cancel = False
                if not isinstance(error, asyncio.CancelledError):
                    error = asyncio.CancelledError(self._cancel_message)
            if caller is not None:
                _leave_task(loop, caller)
            _enter_task(loop, stand_in)
            try:
                yielded = request.send(None) if error is None else request.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            finally:
                _leave_task(loop, stand_in)
                if caller is not None:
                    _enter_task(loop, caller)
                self._waiting_on = error = None
            if getattr(yielded, "_asyncio_future_blocking", False):
                self._waiting_on = yielded
                yielded._asyncio_future_blocking = False
                if self._must_cancel and yielded.cancel(self._cancel_message):
                    self._must_cancel = False
                yielded = _Refusing(yielded, self)
            try:
                yield yielded
            except asyncio.CancelledError as cancelled:
                waited_on = self._waiting_on
                if waited_on is not None and waited_on.cancelled():
                    error = cancelled  # the future the request waited on was cancelled: its own matter
                else:
                    self._cancelled = cancelled  # the caller's (the one it carries, for anyio's scopes)
            except BaseException as other:  # GeneratorExit too: the request is closed with its caller
                error = other


async def run_shielded(
    request: Coroutine[Any, Any, T],
    *,
    bound: float,
    on_cancelled: Callable[[T], Awaitable[None]] | None = None,
    driver_deadline: bool = False,
) -> T:
    """Await ``request`` for at most ``bound`` seconds; if the caller is cancelled meanwhile, the
    request still finishes (within its bound), ``on_cancelled(result)`` runs on its outcome, and
    then the cancellation is raised. With ``driver_deadline``, the request also runs under the
    driver's own deadline (``pymongo.timeout``), ``DRIVER_DEADLINE_AFTER_CUT`` after its bound.

    Raises ``RequestTimeout`` past the bound, and whatever the request raised (with
    ``driver_deadline``, that can be the driver's own timeout error, once its cut was lost).
    """
    loop = asyncio.get_running_loop()
    bound = min(max(bound, 0.001), 86_400.0)
    # The cut and the driver's deadline on one clock, the loop's, so that the cut comes first.
    cut_at = loop.time() + bound
    if driver_deadline:
        request = _under_driver_deadline(cut_at + DRIVER_DEADLINE_AFTER_CUT, request)
    shield = _Shielded(request)
    cuts = _cuts_of(loop)
    cuts.add(shield, cut_at)
    try:
        result = await shield
    except (Exception, asyncio.CancelledError) as error:  # not GeneratorExit: the caller is closed
        cancellation = shield.caller_cancellation()
        if cancellation is not None:
            raise cancellation from None  # the caller's, held back until the request ended
        if isinstance(error, asyncio.CancelledError):  # nobody cancelled the caller: the bound passed
            raise RequestTimeout(f"MongoDB did not answer within {bound:.3g} s") from None
        raise
    finally:
        cuts.discard(shield)
    cancellation = shield.caller_cancellation()
    if cancellation is not None:
        # The caller was cancelled: clean up after the request, then let the cancellation go on.
        if on_cancelled is not None:
            await _finish(asyncio.ensure_future(on_cancelled(result)))
        raise cancellation
    return result


class _Cuts:
    """The cuts of one event loop's requests in flight, made by timers armed at the earliest of them.

    A timer per request cost each request a timer handle made, pushed on the loop's heap and
    cancelled: with the rest of the bound, about a tenth of the library's own client CPU of an
    acquire and release, half of which sharing the timers saves (benchmarks/README.md). Here a
    request whose cut falls after a timer already armed arms none: a timer that fires cuts every
    request due by then and arms the next one for the earliest cut left. So a request is cut when
    its cut falls, as by a timer of its own. Timers are never cancelled: one armed for a request
    that was answered fires for nothing, or for others.
    """

    __slots__ = ("__weakref__", "_armed", "_due", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the loop's timers hold this: it must not hold the loop
        self._due: dict[_Shielded[Any], float] = {}
        """The requests in flight and when each is cut (the loop's clock)."""
        self._armed: list[float] = []
        """When the timers armed and not fired yet fire (a heap)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop()

    def add(self, request: _Shielded[Any], cut_at: float) -> None:
        self._due[request] = cut_at
        armed = self._armed
        if not armed or cut_at < armed[0]:
            self._arm(cut_at)

    def discard(self, request: _Shielded[Any]) -> None:
        """``request`` has ended: cut it no more."""
        self._due.pop(request, None)

    def _arm(self, when: float) -> None:
        loop = self._loop()
        if loop is not None:
            heapq.heappush(self._armed, when)
            loop.call_at(when, self._fire)

    def _fire(self) -> None:
        loop = self._loop()
        heapq.heappop(self._armed)  # timers fire in the order of their times: this is the earliest
        if loop is None:
            return
        now = loop.time()
        due = self._due
        for request in [request for request, cut_at in due.items() if cut_at <= now]:
            del due[request]
            request.cancel(_BOUND)
        if due:
            earliest = min(due.values())
            if not self._armed or earliest < self._armed[0]:
                self._arm(earliest)


_cuts: weakref.WeakValueDictionary[int, _Cuts] = weakref.WeakValueDictionary()
"""Each loop's ``_Cuts``, by the loop's id. Held weakly: its timers (in the loop's heap) and the
requests in flight hold it, and it holds their tasks, which hold the loop; held here, a loop closed
with a request in flight would be kept for good."""


def _cuts_of(loop: asyncio.AbstractEventLoop) -> _Cuts:
    """``loop``'s ``_Cuts`` (made again if the last one is gone: nothing was in flight)."""
    cuts = _cuts.get(id(loop))
    if cuts is None or cuts.loop is not loop:
        cuts = _cuts[id(loop)] = _Cuts(loop)
    return cuts


def start_shielded(request: Coroutine[Any, Any, T], *, bound: float) -> asyncio.Task[T]:
    """Start ``request`` in a task that nothing but its own ``bound`` (in seconds) cancels.

    Such a task also outlives the cancellation ``asyncio.run`` sends every task left when the
    program's main coroutine returns: ``asyncio.run`` then waits for it, within its bound. It runs in
    a fresh context, so no caller's ``pymongo.timeout`` (or other context) applies to it.
    """
    loop = asyncio.get_running_loop()
    task = _Request(request, loop=loop, context=contextvars.Context())
    timer = loop.call_later(min(max(bound, 0.001), 86_400.0), task.cancel, _BOUND)
    task.add_done_callback(lambda _: timer.cancel())
    return task


async def wait_within(task: asyncio.Future[Any], within: float) -> None:
    """Wait for ``task`` to finish, for at most ``within`` seconds, whatever happens to the caller
    meanwhile; a cancellation of the caller that arrived meanwhile is raised afterwards. What the
    task raises is left for its own done callbacks (past ``within`` it goes on by itself)."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + within
    cancelled: asyncio.CancelledError | None = None
    while not task.done() and (left := give_up_at - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError as error:  # anyio re-delivers a scope's: keep waiting
            cancelled = error
    if cancelled is not None:
        raise cancelled


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until ``event`` is set, for at most ``timeout`` seconds (None: for ever).

    Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that returns normally when the
    event is set in the same loop iteration as the caller is cancelled, and the cancellation is
    lost (CPython gh-86296; 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``). A waiter handed the
    lock as it was cancelled then went on holding it.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def _under_driver_deadline(deadline: float, request: Coroutine[Any, Any, T]) -> T:
    """Run ``request`` under the driver's deadline ``deadline`` (the loop's clock): PyMongo's server
    selection, its wait for a pooled connection, a new connection's socket connect and the command
    (its socket timeout, and it is not sent once less than a round trip is left) each end by it.
    Motor copies the context of a call made inside ``request`` into the thread that runs it."""
    with pymongo.timeout(max(deadline - asyncio.get_running_loop().time(), 0.001)):
        return await request


async def _finish(task: asyncio.Future[Any]) -> None:
    """Wait for ``task`` despite further cancellations (anyio re-delivers a scope's cancellation on
    every loop iteration, hence the loop): a request ends by its own bound."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
