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
        self._waiting = 0  # acquirers waiting for room

    async def acquire(self, n: int) -> None:
        async with self._cond:
            self._waiting += 1
            try:
                # A single segment larger than the budget still goes through once nothing else is in flight.
                await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            finally:
                self._waiting -= 1
            self.used += n
            self.peak = max(self.peak, self.used)

    def try_acquire(self, n: int) -> bool:
        """Take ``n`` now if it fits and nobody waits for room (a partial never goes before a final, nor
        waits: it is skipped); False otherwise. As for ``acquire``, anything fits while nothing is in flight."""
        if self._waiting or (self.used > 0 and self.used + n > self.limit):
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()
