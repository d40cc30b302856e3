"""Sample-rate conversion: one-shot with libsoxr (files), streaming with an exact polyphase filter (legs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil, gcd

import numpy as np
import soxr

QUALITY = "HQ"
# The streaming filter: input samples each output reaches when upsampling (scaled up when downsampling),
# its Kaiser window's beta (about 85 dB of stop-band attenuation) and its cut-off as a fraction of the
# lower Nyquist frequency. For 8 -> 16 kHz that is flat to 3.7 kHz, -3 dB near 3.8 kHz and images
# below -80 dB from 4.05 kHz on, like soxr's HQ filter: a wider transition (32 or 64 taps) let images
# of 3.7-4 kHz through and cost 2-3 words on the 117-word eval set, within noise but one-sided.
TAPS = 128
KAISER_BETA = 8.6
PASSBAND = 0.955
# The stream computes in integers held exactly by float64: input as 16-bit sample values (what every
# telephony codec decodes to, so nothing is lost) and weights scaled by 2**30. Each product is exact and
# every partial sum stays below 2**53, so a sum does not depend on the order BLAS or numpy add in.
INPUT_SCALE = 2.0**15
WEIGHT_SCALE = 2.0**30
INPUT_LIMIT = 4.0  # |sample| clipped here (far above full scale) so the sums stay exact


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
    """Windowed-sinc weights [up, taps] for each output phase (integers, see WEIGHT_SCALE) and the
    kernel's half width.

    Output ``j`` falls at input time ``t = j * down / up``; its phase is ``(j * down) % up`` and its
    taps are the ``taps`` input samples around ``t``. Each row sums to 1 (unit gain at DC).
    """
    ratio = max(1.0, down / up)  # downsampling: a wider kernel with a lower cut-off
    half = ceil(TAPS * ratio / 2)
    cutoff = min(1.0, up / down) * PASSBAND  # in units of the input's Nyquist frequency
    frac = np.arange(up)[:, None] / up
    tau = frac + (half - 1) - np.arange(2 * half)[None, :]  # t - (input index) of each tap
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (tau / half) ** 2, 0, None))) / np.i0(KAISER_BETA)
    weights = cutoff * np.sinc(cutoff * tau) * window
    weights /= weights.sum(axis=1, keepdims=True)
    return np.round(weights * WEIGHT_SCALE), half


class StreamResampler:
    """Converts a mono stream chunk by chunk with a windowed-sinc polyphase filter.

    Output ``j`` is computed from exactly the ``taps`` input samples around its time, in exact
    arithmetic (see INPUT_SCALE), so the output does not depend on how the input was chunked. Its
    whole state is those input samples and two counters: a stream restored from a snapshot goes on
    bit for bit as the uninterrupted one. (Call checkpoints need that: libsoxr's state cannot be saved,
    and a fresh soxr stream primed with recent input drifted by whole samples, which moved VAD
    decisions and so segment boundaries after a handover.)

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
        self.samples_in = 0
        self.samples_out = 0
        # Input (as 16-bit sample values) from index ``samples_in - len(_buffer)`` on; silence before.
        self._buffer = np.zeros(self._half, dtype=np.float64)

    @property
    def lookahead(self) -> int:
        """Input samples an output waits for past its own time (0 when the rates are equal)."""
        return 0 if self._passthrough else self._half

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Output available after feeding ``chunk`` (1-D float)."""
        chunk = np.asarray(chunk, dtype=np.float32)
        self.samples_in += chunk.size
        if self._passthrough:
            self.samples_out += chunk.size
            return chunk.copy()
        self._buffer = np.concatenate([self._buffer, _as_levels(chunk)])
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
        self._buffer = np.concatenate([self._buffer, np.zeros(self._taps, dtype=np.float64)])
        tail = self._produce(total, first_in)
        self._buffer = np.zeros(self._half, dtype=np.float64)
        return tail

    def _produce(self, end: int, first_in: int) -> np.ndarray:
        """Outputs ``samples_out .. end - 1`` (``_buffer[0]`` is input ``first_in``); drops input no
        later output reaches."""
        start = self.samples_out
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        if self._down == 1:
            sums = self._upsample(start, end, first_in)
        else:
            at = np.arange(start, end, dtype=np.int64) * self._down
            lowest = at // self._up - self._half + 1 - first_in  # buffer index of each output's first tap
            taps = self._buffer[lowest[:, None] + np.arange(self._taps)]
            sums = np.einsum("ij,ij->i", taps, self._weights[at % self._up])
        self.samples_out = end
        keep_from = end * self._down // self._up - self._half + 1 - first_in
        self._buffer = self._buffer[max(0, keep_from):]
        return (sums * (1.0 / (INPUT_SCALE * WEIGHT_SCALE))).astype(np.float32)

    def _upsample(self, start: int, end: int, first_in: int) -> np.ndarray:
        """``_produce`` for an integer ratio (8 -> 16 kHz): outputs come in whole groups of ``up``, one
        group per input sample; each phase is one correlation of the input with its weights."""
        first, count = start // self._up, (end - start) // self._up
        lowest = first - self._half + 1 - first_in
        window = self._buffer[lowest : lowest + count + self._taps - 1]
        sums = np.empty(count * self._up, dtype=np.float64)
        for phase in range(self._up):
            sums[phase :: self._up] = np.correlate(window, self._weights[phase], "valid")
        return sums

    def snapshot(self) -> ResamplerSnapshot:
        history = self._buffer / INPUT_SCALE if not self._passthrough else np.zeros(0)
        return ResamplerSnapshot(self.samples_in, self.samples_out, history.astype(np.float32))

    @classmethod
    def restored(cls, sr_in: int, sr_out: int, snap: ResamplerSnapshot) -> StreamResampler:
        """A stream that goes on where ``snap`` was taken, exactly as the uninterrupted one would."""
        stream = cls(sr_in, sr_out)
        stream.samples_in, stream.samples_out = snap.samples_in, snap.samples_out
        if not stream._passthrough:
            history = _as_levels(np.asarray(snap.history, dtype=np.float32))
            # The next output's first tap must be in the history. A snapshot from an older callqa
            # (soxr, which lagged by up to ~100 ms) may not reach back that far: silence stands in.
            reach = snap.samples_in - (snap.samples_out * stream._down // stream._up - stream._half + 1)
            stream._buffer = np.concatenate([np.zeros(max(0, reach - history.size)), history])
        return stream


def _as_levels(samples: np.ndarray) -> np.ndarray:
    """Float samples as 16-bit sample values (float64 integers); exact for decoded telephony audio."""
    return np.round(np.clip(samples, -INPUT_LIMIT, INPUT_LIMIT).astype(np.float64) * INPUT_SCALE)
