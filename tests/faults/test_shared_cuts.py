"""Every request is cut at its own bound, although the requests in flight share the loop's timers
(``_util/shield.py``, ``_Cuts``): a request whose cut falls after a timer already armed arms none,
so the timer that fires before it must arm the next one, whatever the requests before it did."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import pytest

from mongolock_async._util.shield import RequestTimeout, run_shielded
from tests.support.run_settings import child_environment

SLACK = 2.0
"""How late past its bound a cut may come on a loaded machine (seconds): far below the 30 s bound
of the request that armed the first timer, which is when a cut that armed nothing would come."""


async def cut_after(bound: float) -> float:
    """Send a request that never answers, bounded by ``bound``; the seconds until it was cut."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RequestTimeout):
        await run_shielded(asyncio.sleep(3600), bound=bound)
    return loop.time() - started


@pytest.mark.timing(margin=2.0)  # SLACK
async def test_a_request_sent_after_an_earlier_timer_is_cut_at_its_own_bound() -> None:
    # The long request arms a timer 30 s ahead, the quick one an earlier one and is answered before
    # it; the third, bounded between them, arms none: the quick one's timer must arm one for it.
    released = asyncio.Event()
    long = asyncio.create_task(run_shielded(released.wait(), bound=30.0))
    quick = asyncio.create_task(run_shielded(asyncio.sleep(0.01), bound=0.2))
    await asyncio.sleep(0)
    async with asyncio.timeout(20):
        took = await cut_after(0.5)
        await quick
        assert 0.5 - 0.001 <= took < 0.5 + SLACK, f"cut after {took:.3f} s, bound 0.5 s"
        released.set()
        await long


@pytest.mark.timing(margin=2.0)  # SLACK
async def test_requests_in_flight_together_are_each_cut_at_their_own_bound() -> None:
    # Bounds in a shuffled order, so that each comes before, after or between the timers armed.
    rng = random.Random(40)
    for _ in range(3):
        bounds = [0.05 * n for n in range(1, 13)]
        rng.shuffle(bounds)
        released = asyncio.Event()
        long = asyncio.create_task(run_shielded(released.wait(), bound=30.0))
        async with asyncio.timeout(20):
            tooks = await asyncio.gather(*(cut_after(bound) for bound in bounds))
            for bound, took in zip(bounds, tooks, strict=True):
                assert bound - 0.001 <= took < bound + SLACK, f"cut after {took:.3f} s, bound {bound:.2f} s"
            released.set()
            assert await long


@pytest.mark.timing(margin=2.0)  # SLACK
async def test_an_answered_request_is_not_cut_by_a_timer_another_one_armed() -> None:
    # Its entry is gone once answered: a timer firing later finds nothing of it to cut.
    async with asyncio.timeout(20):
        hanging = asyncio.create_task(cut_after(0.1))
        answered = await run_shielded(asyncio.sleep(0.3, result="answer"), bound=5.0)
        assert answered == "answer"
        assert await hanging < 0.1 + SLACK


CLOSED_WITH_A_REQUEST_IN_FLIGHT = """
import asyncio, gc, weakref
from mongolock_async._util.shield import run_shielded

async def send_and_leave():
    asyncio.get_running_loop().create_task(run_shielded(asyncio.sleep(3600), bound=3600.0))
    await asyncio.sleep(0)  # the request's task has started

loop = asyncio.new_event_loop()
loop.run_until_complete(send_and_leave())
loop.close()
closed = weakref.ref(loop)
del loop
gc.collect()
print("kept" if closed() is not None else "freed")
"""


def test_a_loop_closed_with_a_request_in_flight_is_not_kept_alive() -> None:
    # The loop's requests in flight are kept with its timers, not in a module's map: a program that
    # closes a loop with a request still in flight (it never runs again) must not keep that loop,
    # its tasks and their frames alive for good. In a fresh interpreter: pytest's log capture
    # keeps the "Task was destroyed but it is pending" record, and with it the loop.
    result = subprocess.run(
        [sys.executable, "-c", CLOSED_WITH_A_REQUEST_IN_FLIGHT],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "freed", "the closed loop is still referenced"
