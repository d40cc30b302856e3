"""Sample-rate conversion with libsoxr (high quality), one-shot and streaming."""

from __future__ import annotations

import numpy as np
import soxr

QUALITY = "HQ"


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """``x`` (1-D, or [channels, n]) converted from ``sr_in`` to ``sr_out``, as float32."""
    x = np.asarray(x, dtype=np.float32)
    if sr_in == sr_out:
        return x.copy()
    if x.ndim == 1:
        return np.asarray(soxr.resample(x, sr_in, sr_out, quality=QUALITY), dtype=np.float32)
    # soxr wants [n, channels]
    out = soxr.resample(np.ascontiguousarray(x.T), sr_in, sr_out, quality=QUALITY)
    return np.ascontiguousarray(np.asarray(out, dtype=np.float32).T)


class StreamResampler:
    """Converts a mono stream chunk by chunk; the concatenated output matches one-shot ``resample``.

    soxr holds back a filter delay's worth of samples, so a chunk's output can be shorter than its
    nominal length; ``flush`` at the end of the stream returns what was held back.
    """

    def __init__(self, sr_in: int, sr_out: int) -> None:
        self.sr_in = sr_in
        self.sr_out = sr_out
        self._stream = None if sr_in == sr_out else soxr.ResampleStream(sr_in, sr_out, 1, "float32", QUALITY)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Output available after feeding ``chunk`` (1-D float)."""
        chunk = np.asarray(chunk, dtype=np.float32)
        if self._stream is None:
            return chunk.copy()
        return np.asarray(self._stream.resample_chunk(chunk, last=False), dtype=np.float32)

    def flush(self) -> np.ndarray:
        """The samples still held back; the stream is then ready for a new signal."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = np.asarray(self._stream.resample_chunk(np.zeros(0, np.float32), last=True), dtype=np.float32)
        self._stream.clear()
        return tail
