"""The recent audio of one leg, addressed by absolute sample index."""

from __future__ import annotations

import numpy as np


class LegAudioBuffer:
    """Appends samples and drops old ones without reallocating on every 20 ms frame."""

    def __init__(self, capacity: int = 16000) -> None:
        self._data = np.zeros(capacity, dtype=np.float32)
        self._size = 0
        self.start = 0  # absolute index of self._data[0]

    @property
    def end(self) -> int:
        """Absolute index one past the last sample received."""
        return self.start + self._size

    def append(self, samples: np.ndarray) -> None:
        needed = self._size + samples.size
        if needed > self._data.size:
            grown = np.zeros(max(needed, 2 * self._data.size), dtype=np.float32)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = samples
        self._size = needed

    def append_zeros(self, count: int, keep_from: int) -> None:
        """``append(np.zeros(count))`` then ``drop_before(keep_from)``, without making the zeros dropped."""
        end = self.end + count
        keep_from = min(max(keep_from, self.start), end)
        if keep_from >= self.end:  # nothing held is kept: only the zeros from keep_from on
            self._size = 0
            self.start = keep_from
            self.append(np.zeros(end - keep_from, dtype=np.float32))
        else:
            self.append(np.zeros(count, dtype=np.float32))  # fewer than end - keep_from: what is kept
            self.drop_before(keep_from)

    def drop_before(self, index: int) -> None:
        """Forget samples before absolute ``index``."""
        drop = min(max(index - self.start, 0), self._size)
        if drop:
            self._data[: self._size - drop] = self._data[drop : self._size]
            self._size -= drop
            self.start += drop

    def slice(self, begin: int, end: int) -> np.ndarray:
        """A copy of samples [begin, end) (absolute), clipped to what is held."""
        lo = max(begin - self.start, 0)
        hi = min(end - self.start, self._size)
        return self._data[lo:hi].copy()
