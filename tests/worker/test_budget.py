"""Back-pressure: audio in flight for inference is bounded; one oversized segment still goes through."""

from __future__ import annotations

import asyncio

from pipeline.worker.budget import InflightBudget


async def test_acquire_waits_until_enough_is_released() -> None:
    budget = InflightBudget(100)
    await budget.acquire(60)
    waiting = asyncio.create_task(budget.acquire(60))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiting.done() and budget.used == 60
    await budget.release(60)
    await asyncio.wait_for(waiting, 5)
    assert (budget.used, budget.peak) == (60, 60)


async def test_a_segment_larger_than_the_budget_goes_through_alone() -> None:
    budget = InflightBudget(100)
    await asyncio.wait_for(budget.acquire(250), 5)
    assert (budget.used, budget.peak) == (250, 250)
    second = asyncio.create_task(budget.acquire(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not second.done()
    await budget.release(250)
    await asyncio.wait_for(second, 5)
    assert (budget.used, budget.peak) == (1, 250)
