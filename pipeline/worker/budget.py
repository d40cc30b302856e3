"""Back-pressure: a bound on decoded audio submitted for inference and not yet transcribed."""

from __future__ import annotations

import asyncio


class InflightBudget:
    """Bounds decoded audio submitted for inference and not yet transcribed (bytes)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self.peak = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            # A single segment larger than the budget still goes through once nothing else is in flight.
            await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
            self.peak = max(self.peak, self.used)

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()
