"""Sample-rate conversion: one-shot with libsoxr (files), streaming with an exact polyphase filter (legs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil, gcd

import numpy as np
import soxr
from numpy.lib.stride_tricks import as_strided

QUALITY = "HQ"
# The streaming filter: input samples each output reaches when upsampling (scaled up when downsampling),
# its Kaiser window's beta (about 85 dB of stop-band attenuation) and its cut-off as a fraction of the
# lower Nyquist frequency. For 8 -> 16 kHz that is flat to 3.7 kHz, -3 dB near 3.8 kHz and images
# below -80 dB from 4.05 kHz on, like soxr's HQ filter: a wider transition (32 or 64 taps) let images
# of 3.7-4 kHz through and cost 2-3 words on the 117-word eval set, within noise but one-sided.
TAPS = 128
KAISER_BETA = 8.6
PASSBAND = 0.955


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


@dataclass(frozen=True)
class ResamplerSnapshot:
    """Where a stream stood: samples in and out so far, and the input its next outputs still reach."""

    samples_in: int
    samples_out: int
    history: np.ndarray = field(repr=False)  # the input samples [samples_in - len(history), samples_in)


def _kernel_table(up: int, down: int) -> tuple[np.ndarray, int]:
    """Windowed-sinc weights [up, taps] for each output phase, and the kernel's half width.

    Output ``j`` falls at input time ``t = j * down / up``; its phase is ``(j * down) % up`` and its
    taps are the ``taps`` input samples around ``t``. Each row sums to 1 (unit gain at DC).
    """
    ratio = max(1.0, down / up)  # downsampling: a wider kernel with a lower cut-off
    half = ceil(TAPS * ratio / 2)
    taps = 1 << (2 * half - 1).bit_length()  # a power of two (see _produce); the extra taps weigh 0
    cutoff = min(1.0, up / down) * PASSBAND  # in units of the input's Nyquist frequency
    frac = np.arange(up)[:, None] / up
    tau = frac + (half - 1) - np.arange(taps)[None, :]  # t - (input index) of each tap
    tau = np.where(np.arange(taps)[None, :] < 2 * half, tau, half)  # padding taps: window 0
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (tau / half) ** 2, 0, None))) / np.i0(KAISER_BETA)
    weights = cutoff * np.sinc(cutoff * tau) * window
    weights[:, 2 * half:] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    return weights.astype(np.float32), half


def _sum_taps(terms: np.ndarray) -> np.ndarray:
    """``terms`` summed over its first axis (a power of two long) by halving it.

    Elementwise adds in an order fixed by the tap count alone: an output's value never depends on how
    many others were computed with it (BLAS and numpy's reductions pick their order by shape and
    alignment), which is what makes a restored stream bit-exact.
    """
    while terms.shape[0] > 1:
        width = terms.shape[0] // 2
        terms = terms[:width] + terms[width:]
    return np.asarray(terms[0], dtype=np.float32)


class StreamResampler:
    """Converts a mono stream chunk by chunk with a windowed-sinc polyphase filter.

    Output ``j`` is computed from exactly the ``taps`` input samples around its time, with the same
    weights and the same arithmetic whatever the chunking, so the output does not depend on how the
    input arrived. Its whole state is those input samples and two counters: a stream restored from a
    snapshot goes on bit for bit as the uninterrupted one. (Call checkpoints need that: libsoxr's
    state cannot be saved, and a fresh soxr stream primed with recent input drifted by whole samples,
    which moved VAD decisions and so segment boundaries after a handover.)

    An output is produced once the input it reaches has arrived (``taps // 2`` samples of look-ahead,
    8 ms at 8 kHz); ``flush`` at the end of the stream returns the rest, as if zeros followed.
    """

    def __init__(self, sr_in: int, sr_out: int) -> None:
        self.sr_in = sr_in
        self.sr_out = sr_out
        g = gcd(sr_in, sr_out)
        self._up, self._down = sr_out // g, sr_in // g
        self._passthrough = sr_in == sr_out
        self._weights, self._half = _kernel_table(self._up, self._down)
        self._taps = self._weights.shape[1]
        self._weights_by_tap = np.ascontiguousarray(self._weights.T)[:, :, None]  # [tap, phase, 1]
        self.samples_in = 0
        self.samples_out = 0
        # Input from index ``samples_in - len(_buffer)`` on; before the stream began, silence.
        self._buffer = np.zeros(self._half, dtype=np.float32)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Output available after feeding ``chunk`` (1-D float)."""
        chunk = np.asarray(chunk, dtype=np.float32)
        self.samples_in += chunk.size
        if self._passthrough:
            self.samples_out += chunk.size
            return chunk.copy()
        self._buffer = np.concatenate([self._buffer, chunk])
        # Output j is ready once its last tap, floor(j * down / up) + half, has arrived.
        ready = self.samples_in - self._half
        first_in = self.samples_in - self._buffer.size
        return self._produce(-(-ready * self._up // self._down) if ready > 0 else 0, first_in)

    def flush(self) -> np.ndarray:
        """The outputs still waiting for look-ahead, computed as if silence followed; the stream is
        then ready for a new signal. The total output is ``round(samples_in * sr_out / sr_in)``."""
        if self._passthrough:
            return np.zeros(0, dtype=np.float32)
        total = (2 * self.samples_in * self._up + self._down) // (2 * self._down)
        first_in = self.samples_in - self._buffer.size
        self._buffer = np.concatenate([self._buffer, np.zeros(self._taps, dtype=np.float32)])
        tail = self._produce(total, first_in)
        self._buffer = np.zeros(self._half, dtype=np.float32)
        return tail

    def _produce(self, end: int, first_in: int) -> np.ndarray:
        """Outputs ``samples_out .. end - 1`` (``_buffer[0]`` is input ``first_in``); drops input no
        later output reaches."""
        start = self.samples_out
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        if self._down == 1 and self._taps == 2 * self._half:
            out = self._upsample(start, end, first_in)
        else:
            at = np.arange(start, end, dtype=np.int64) * self._down
            lowest = at // self._up - self._half + 1 - first_in  # buffer index of each output's first tap
            # Taps past the kernel's real ones (padding to a power of two) weigh 0: clip their reach.
            taps = np.take(self._buffer, lowest[:, None] + np.arange(self._taps), mode="clip")
            out = _sum_taps((taps * self._weights[at % self._up]).T)
        self.samples_out = end
        keep_from = end * self._down // self._up - self._half + 1 - first_in
        self._buffer = self._buffer[max(0, keep_from):]
        return out

    def _upsample(self, start: int, end: int, first_in: int) -> np.ndarray:
        """``_produce`` for an integer ratio (8 -> 16 kHz): outputs come in whole groups of ``up``, one
        group per input sample, whose taps are one sliding window of the input (no gather)."""
        first, count = start // self._up, (end - start) // self._up
        lowest = first - self._half + 1 - first_in
        buffer = self._buffer[lowest:]
        step = buffer.strides[0]
        windows = as_strided(buffer, (self._taps, count), (step, step), writeable=False)  # [tap, input]
        # [tap, phase, input]: the tap axis first, so each halving adds two contiguous blocks.
        groups = _sum_taps(windows[:, None, :] * self._weights_by_tap)  # [phase, input]
        return np.ascontiguousarray(groups.T).reshape(-1)

    def snapshot(self) -> ResamplerSnapshot:
        history = self._buffer if not self._passthrough else np.zeros(0, dtype=np.float32)
        return ResamplerSnapshot(self.samples_in, self.samples_out, history.copy())

    @classmethod
    def restored(cls, sr_in: int, sr_out: int, snap: ResamplerSnapshot) -> StreamResampler:
        """A stream that goes on where ``snap`` was taken, exactly as the uninterrupted one would."""
        stream = cls(sr_in, sr_out)
        stream.samples_in, stream.samples_out = snap.samples_in, snap.samples_out
        if not stream._passthrough:
            stream._buffer = np.asarray(snap.history, dtype=np.float32).copy()
        return stream
