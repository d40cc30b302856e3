"""Streaming Silero VAD on ONNX Runtime, batched across legs.

The model scores 512-sample windows of 16 kHz audio (32 ms), or 256-sample windows of 8 kHz audio (the
same 32 ms: a telephone leg is scored on its own samples, not upsampled ones). It is recurrent: each leg
carries its own LSTM state [2, 1, 128] and the last 64 (8 kHz: 32) samples of its previous window, which
the model expects prepended to the next window (as silero-vad's own wrapper does). Windows of different
legs at the same step are independent, so one ``run`` call stacks them into a batch [B, 576] (8 kHz legs
in a batch of their own, [B, 288]): measured 1.5 ms per window alone against ~0.45 ms per window in
batches of 16.

Digital silence (windows of exact zeros, which is what a gap in a leg's frames is filled with) is scored
only until a stream has seen ``dormant_after`` such windows in a row: later ones are dormant, not
scored (probability 0), and the stream's state is reset to a fresh leg's. A 20-minute hold then costs
what 2 s of silence costs, and whether a window is dormant depends on the samples alone, so a leg's
probabilities still do not depend on how its audio was chunked or batched.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnxruntime as ort

SAMPLE_RATE = 16000
WINDOW = 512
CONTEXT = 64
STATE_SHAPE = (2, 1, 128)
# The model's window and context (samples) at each rate it takes: the same 32 ms grid at both.
GEOMETRY = {16000: (WINDOW, CONTEXT), 8000: (256, 32)}


def window_of(sample_rate: int) -> int:
    """Samples per VAD window (32 ms) at ``sample_rate`` (8000 or 16000)."""
    try:
        return GEOMETRY[sample_rate][0]
    except KeyError:
        raise ValueError(f"Silero VAD takes 8000 or 16000 Hz, not {sample_rate}") from None


def default_model_path() -> Path:
    """silero_vad.onnx inside the installed silero-vad package (located without importing it: torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the silero-vad package is not installed; set CALLQA_VAD_MODEL_PATH")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"


class SileroVad:
    """One ONNX Runtime session of the Silero VAD model, shared by all legs of a process."""

    def __init__(self, model_path: str | Path | None = None) -> None:
        options = ort.SessionOptions()
        # The model is tiny: threads cost more in synchronisation than they save.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = str(model_path or default_model_path())
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._rates = {rate: np.array(rate, dtype=np.int64) for rate in GEOMETRY}

    def score(self, inputs: np.ndarray, state: np.ndarray, sample_rate: int = SAMPLE_RATE
              ) -> tuple[np.ndarray, np.ndarray]:
        """Speech probabilities [B] of windows with context [B, 576] (8 kHz: [B, 288]), and the next
        state [2, B, 128]."""
        probs, next_state = self._session.run(
            None, {"input": inputs, "state": state, "sr": self._rates[sample_rate]}
        )
        return probs[:, 0], next_state

    def run(self, streams: Sequence[VadStream], chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Feed ``chunks[i]`` to ``streams[i]``; the probabilities of each stream's completed windows."""
        windows = [stream.split_windows(chunk) for stream, chunk in zip(streams, chunks, strict=True)]
        dormant = [stream.dormant_windows(w) for stream, w in zip(streams, windows, strict=True)]
        probs = [np.zeros(len(w), dtype=np.float32) for w in windows]
        for step in range(max((len(w) for w in windows), default=0)):
            active = []
            for i, w in enumerate(windows):
                if len(w) <= step:
                    continue
                if dormant[i][step]:
                    streams[i].go_dormant()  # probability 0; its context is zeros already
                else:
                    active.append(i)
            rates = {streams[i].sample_rate for i in active}
            for rate in sorted(rates):  # one batch per rate: the model takes one sr per call
                batch = active if len(rates) == 1 else [i for i in active if streams[i].sample_rate == rate]
                inputs = np.stack([streams[i].with_context(windows[i][step]) for i in batch])
                state = np.concatenate([streams[i].state for i in batch], axis=1)
                step_probs, next_state = self.score(inputs, state, rate)
                for k, i in enumerate(batch):
                    probs[i][step] = step_probs[k]
                    streams[i].state = next_state[:, k : k + 1, :]
        return probs


@lru_cache(maxsize=4)
def load_vad(model_path: str = "") -> SileroVad:
    """The process-wide VAD session for ``model_path`` (empty: the packaged model).

    Cached: the session holds no per-leg state (that lives in VadStream), and every leg of a worker
    opening its own ONNX session would cost memory and start-up time per call.
    """
    return SileroVad(model_path or None)


class VadStream:
    """The VAD state of one leg: recurrent state, context samples, an incomplete window, and how many
    windows of digital silence came last (``dormant_after`` of them in a row make later ones dormant;
    None: never). ``sample_rate``: the rate of the samples it is fed, 16000 or 8000."""

    def __init__(self, dormant_after: int | None = None, sample_rate: int = SAMPLE_RATE) -> None:
        self.sample_rate = sample_rate
        self.window = window_of(sample_rate)
        self.context_size = GEOMETRY[sample_rate][1]
        self.state = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(self.context_size, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self.dormant_after = dormant_after
        self.zero_windows = 0  # windows of exact zeros in a row, up to the last complete one

    @classmethod
    def restored(cls, state: np.ndarray, context: np.ndarray, pending: np.ndarray,
                 dormant_after: int | None = None, zero_windows: int = 0,
                 sample_rate: int = SAMPLE_RATE) -> VadStream:
        """A stream that goes on from a snapshot of ``state``, ``context``, ``pending`` (and the run of
        zero windows it had reached)."""
        stream = cls(dormant_after, sample_rate)
        context = np.asarray(context, dtype=np.float32)
        if context.size != stream.context_size or np.asarray(pending).size >= stream.window:
            raise ValueError(f"a VAD snapshot with {context.size} context and {np.asarray(pending).size} pending "
                             f"samples is not one of a {sample_rate} Hz stream")
        stream.state = np.asarray(state, dtype=np.float32).reshape(STATE_SHAPE).copy()
        stream._context = context.copy()
        stream._pending = np.asarray(pending, dtype=np.float32).copy()
        stream.zero_windows = zero_windows
        return stream

    @property
    def dormant(self) -> bool:
        """Whether the next window of zeros will be dormant (not scored)."""
        return self.dormant_after is not None and self.zero_windows >= self.dormant_after

    def dormant_windows(self, windows: np.ndarray) -> np.ndarray:
        """Which of ``windows`` (this stream's next complete windows, in order) are dormant: all zeros,
        after ``dormant_after`` windows of zeros in a row. Counts them into the run."""
        count = len(windows)
        if count == 0:
            return np.zeros(0, dtype=bool)
        index = np.arange(count)
        zero = ~windows.any(axis=1)
        # The run each window ends: windows since the last one with a sample that is not zero.
        last_sound = np.maximum.accumulate(np.where(zero, -1, index))
        run = np.where(last_sound >= 0, index - last_sound, index + 1 + self.zero_windows)
        self.zero_windows = int(run[-1])
        if self.dormant_after is None:
            return np.zeros(count, dtype=bool)
        return run > self.dormant_after

    def skip_zeros(self, samples: int) -> int:
        """``split_windows`` and ``dormant_windows`` of ``samples`` zeros, without making them; the
        windows they complete (all dormant: the stream must be ``dormant``, its pending samples zeros)."""
        total = self._pending.size + samples
        windows = total // self.window
        if windows == 0:
            self._pending = np.concatenate([self._pending, np.zeros(samples, dtype=np.float32)])
            return 0
        if not self.dormant or self._pending.any():
            raise RuntimeError("only a dormant stream, with only zeros pending, skips windows")
        self.zero_windows += windows
        self.go_dormant()
        self._pending = np.zeros(total % self.window, dtype=np.float32)
        return windows

    def go_dormant(self) -> None:
        """A dormant window: the recurrent state is reset to a fresh leg's (speech after the silence is
        scored as a new leg's would be), and the context is the window's end, zeros."""
        if self.state.any() or self._context.any():
            self.state = np.zeros(STATE_SHAPE, dtype=np.float32)
            self._context = np.zeros(self.context_size, dtype=np.float32)

    @property
    def context(self) -> np.ndarray:
        """The last 64 (8 kHz: 32) samples of the previous window (prepended to the next one)."""
        return self._context

    @property
    def pending(self) -> np.ndarray:
        """Samples received but not yet scored."""
        return self._pending

    @property
    def pending_samples(self) -> int:
        """Samples received but not yet scored (less than one window)."""
        return int(self._pending.size)

    def split_windows(self, chunk: np.ndarray) -> np.ndarray:
        """Complete windows [k, 512] (8 kHz: [k, 256]) formed by the pending samples and ``chunk``; keeps
        the remainder."""
        samples = np.concatenate([self._pending, np.asarray(chunk, dtype=np.float32)])
        window = self.window
        count = samples.size // window
        self._pending = samples[count * window :]
        return samples[: count * window].reshape(count, window)

    def pad_pending(self) -> np.ndarray:
        """Zeros that complete the pending window (to score the tail of a leg at its end)."""
        return np.zeros((-self._pending.size) % self.window, dtype=np.float32)

    def with_context(self, window: np.ndarray) -> np.ndarray:
        """``window`` with the previous window's last context samples in front; advances the context."""
        joined = np.concatenate([self._context, window])
        self._context = window[-self.context_size :].copy()
        return joined
