"""A request sent with ``run_shielded`` (``_util/shield.py``) runs to its end in its caller's task,
whatever happens to the caller: a cancellation that arrives meanwhile, at any step of the request,
is held back until the request has ended and its outcome was cleaned up, then raised as itself (so
``asyncio.timeout`` and anyio's scopes still recognise their own). The request is not a task of its
own; these tests check the mechanism that replaces one at each step of a request of several steps.

The lock's own requests are swept the same way against the server in ``tests/handles/
test_giving_up.py`` and ``test_cancellation.py``; here the request is a coroutine whose every step
is recorded, so a cut one shows exactly where it was cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import pytest

from mongolock_async._util.shield import RequestTimeout, run_shielded

STEPS = 6
"""Waits of the request: futures resolved by the loop, and bare yields to it, in turn."""
SWEEP = range(2 * STEPS + 3)
"""Loop iterations after which the caller is cancelled: before, during and after the request."""

Send = Callable[["Request"], Awaitable[str]]


class Request:
    """A request of ``STEPS`` waits that records how far it got."""

    def __init__(self) -> None:
        self.steps_done = 0
        self.finished = False
        self.cleaned_up: list[str] = []

    async def run(self) -> str:
        loop = asyncio.get_running_loop()
        for step in range(STEPS):
            if step % 2:
                await asyncio.sleep(0)
            else:
                answer = loop.create_future()
                loop.call_soon(answer.set_result, step)
                await answer
            self.steps_done += 1
        self.finished = True
        return "answer"

    async def clean_up(self, result: str) -> None:
        await asyncio.sleep(0)
        self.cleaned_up.append(result)


async def cancelled_after(iterations: int, send: Send, request: Request) -> BaseException | str | None:
    """Send ``request`` in a task, cancel it after ``iterations`` loop iterations; what it ended
    with, or None if it had ended before the cancellation."""
    task = asyncio.create_task(send(request))
    for _ in range(iterations):
        await asyncio.sleep(0)
    if task.done():
        await task
        return None
    task.cancel("the caller gave up")
    try:
        return await task
    except BaseException as error:
        return error


async def test_a_caller_cancelled_at_any_step_waits_for_the_whole_request() -> None:
    mid_request = 0
    for iterations in SWEEP:
        request = Request()

        async def send(request: Request) -> str:
            return await run_shielded(request.run(), bound=10.0, on_cancelled=request.clean_up)

        outcome = await cancelled_after(iterations, send, request)
        if outcome is None:
            assert request.finished and not request.cleaned_up
            continue  # the request had ended before the cancellation came
        assert isinstance(outcome, asyncio.CancelledError), f"after {iterations} iterations: {outcome!r}"
        assert outcome.args == ("the caller gave up",), "the caller's own cancellation is raised"
        if iterations == 0:
            assert request.steps_done == 0
            continue  # cancelled before the task's first step: nothing was sent
        assert request.finished, f"cancelled after {iterations} iterations, cut at step {request.steps_done}"
        assert request.cleaned_up == ["answer"], "on_cancelled ran on the request's answer"
        mid_request += 1
    assert mid_request >= STEPS, f"only {mid_request} cancellations of the sweep came during the request"


async def test_the_sweep_catches_a_request_awaited_without_the_shield() -> None:
    # The control: awaited directly, a request is cut at the step the cancellation reaches.
    cut = []
    for iterations in SWEEP:
        request = Request()

        async def send(request: Request) -> str:
            return await request.run()

        await cancelled_after(iterations, send, request)
        if 0 < request.steps_done < STEPS:
            cut.append(iterations)
    assert len(cut) >= STEPS - 1, f"only {cut} of the sweep cut an unshielded request"


async def test_asyncio_timeout_still_recognises_its_cancellation_at_any_step() -> None:
    # asyncio.timeout turns its own cancellation into TimeoutError by counting (Task.uncancel):
    # held back and raised later, it must still be counted as the timeout's.
    loop = asyncio.get_running_loop()
    for iterations in SWEEP:
        request = Request()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as timeout:
                for _ in range(iterations):
                    await asyncio.sleep(0)
                timeout.reschedule(loop.time())
                await run_shielded(request.run(), bound=10.0)
        assert request.finished, f"timed out after {iterations} iterations, cut at step {request.steps_done}"


async def test_an_anyio_scope_absorbs_its_cancellation_after_the_request_at_any_step() -> None:
    # anyio knows its cancellations by their message: the one raised after the request must be it.
    for iterations in SWEEP:
        request = Request()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_scope_after, scope, iterations)
                await run_shielded(request.run(), bound=10.0)
                await asyncio.sleep(3600)
        assert scope.cancelled_caught, f"after {iterations} iterations the scope did not catch its cancellation"
        assert request.finished, f"cancelled after {iterations} iterations, cut at step {request.steps_done}"


async def cancel_scope_after(scope: anyio.CancelScope, iterations: int) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)
    scope.cancel()


@pytest.mark.parametrize("caller_first", [True, False], ids=["caller-first", "future-first"])
async def test_a_caller_cancelled_as_the_requests_own_future_is_cancelled_is_still_cancelled(
    caller_first: bool,
) -> None:
    # The request waits on a future that something of its own cancels (the driver's own timeout
    # does) in the same loop iteration as the caller is cancelled: asyncio raises one
    # CancelledError in the task for both. The request gets it and recovers; the caller's
    # cancellation must not be lost with it.
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    cleaned_up: list[str] = []

    async def request() -> str:
        try:
            await answer
        except asyncio.CancelledError:
            return "recovered"
        return "answered"

    async def clean_up(result: str) -> None:
        cleaned_up.append(result)

    task = asyncio.create_task(run_shielded(request(), bound=10.0, on_cancelled=clean_up))
    await asyncio.sleep(0)
    if caller_first:
        task.cancel("the caller gave up")
        answer.cancel()
    else:
        answer.cancel()
        task.cancel("the caller gave up")
    with pytest.raises(asyncio.CancelledError) as raised:
        await task
    assert raised.value.args == ("the caller gave up",)
    assert cleaned_up == ["recovered"]


async def test_a_request_that_recovers_from_its_own_cancelled_future_returns_its_answer() -> None:
    loop = asyncio.get_running_loop()

    async def request() -> str:
        answer = loop.create_future()
        loop.call_soon(answer.cancel)
        try:
            await answer
        except asyncio.CancelledError:
            return "recovered"
        return "answered"

    assert await run_shielded(request(), bound=10.0) == "recovered"


@pytest.mark.timing(margin=1.9)  # cancelled 0.02 s in, before its cut at 2 s
async def test_a_request_cut_while_its_caller_is_cancelled_raises_the_callers_cancellation() -> None:
    ended = asyncio.Event()

    async def request() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    task = asyncio.create_task(run_shielded(request(), bound=2.0))  # cancelled long before its cut
    await asyncio.sleep(0.02)
    task.cancel("the caller gave up")
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError) as raised:
            await task
    assert raised.value.args == ("the caller gave up",), "not the bound's RequestTimeout"
    assert ended.is_set()


@pytest.mark.parametrize("when", ["waiting", "answered-not-resumed", "yielded"])
async def test_a_request_is_cut_wherever_it_stands(when: str) -> None:
    # Cut while it waits on a future, once that future is done but before the request resumes,
    # and while it has yielded to the loop without a future: each ends in RequestTimeout.
    loop = asyncio.get_running_loop()
    cut_points = []
    give_up_at = loop.time() + 5  # a request never cut would hold its caller for ever

    async def request() -> None:
        while loop.time() < give_up_at:
            try:
                if when == "yielded":
                    await asyncio.sleep(0)
                else:
                    answer = loop.create_future()
                    if when == "answered-not-resumed":
                        loop.call_soon(answer.set_result, None)
                    await answer
            except asyncio.CancelledError:
                cut_points.append(when)
                raise

    with pytest.raises(RequestTimeout):
        await run_shielded(request(), bound=0.05)
    assert cut_points == [when]


async def test_closing_the_callers_coroutine_closes_the_request() -> None:
    # A caller's coroutine dropped unfinished (its loop closed) is closed by the garbage collector:
    # the request's own clean-up must run then too.
    closed = []

    async def request() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            closed.append(True)

    caller = run_shielded(request(), bound=3600.0)
    caller.send(None)  # up to the request's first wait
    caller.close()
    assert closed == [True]
    # Closed after a cancellation of the caller was held back: closed all the same, not turned
    # into that cancellation (which would leave the coroutine unclosable).
    caller = run_shielded(request(), bound=3600.0)
    waited_on = caller.send(None)
    assert not waited_on.cancel("the caller gave up"), "the stand-in refuses, as Task.cancel finds"
    caller.close()
    assert closed == [True, True]


@pytest.mark.parametrize("timeout_kind", ["asyncio.timeout", "asyncio.wait_for"])
async def test_a_timeout_inside_the_request_ends_its_wait_not_the_caller(timeout_kind: str) -> None:
    # The driver bounds its own waits (socket writes, waits for a server or a pooled connection)
    # with asyncio.wait_for, which from Python 3.12 on cancels "the current task" when its time
    # is up, as asyncio.timeout always does. That must end the request's wait, not count as a
    # cancellation of the caller held back until the request ends.
    loop = asyncio.get_running_loop()

    async def request() -> str:
        never = loop.create_future()
        try:
            if timeout_kind == "asyncio.timeout":
                async with asyncio.timeout(0.05):
                    await never
            else:
                await asyncio.wait_for(never, 0.05)
        except TimeoutError:
            return "timed out inside"
        return "answered"

    async with asyncio.timeout(5):  # the caller's own timeout, which must not fire
        assert await run_shielded(request(), bound=10.0) == "timed out inside"


@pytest.mark.timing(margin=0.9)  # cancelled 0.02 s in, before the inner timeout at 1 s
async def test_a_timeout_inside_the_request_and_a_cancelled_caller_each_get_theirs() -> None:
    loop = asyncio.get_running_loop()

    async def request() -> str:
        try:
            async with asyncio.timeout(1.0):  # well after the caller's cancellation below
                await loop.create_future()
        except TimeoutError:
            return "timed out inside"
        return "answered"

    task = asyncio.create_task(run_shielded(request(), bound=10.0))
    await asyncio.sleep(0.02)
    task.cancel("the caller gave up")
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError) as raised:
            await task
    assert raised.value.args == ("the caller gave up",)
