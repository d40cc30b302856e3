"""Batched greedy Whisper decoding over segments of different lengths, with a self-attention KV cache.

Each segment is encoded in its own window (its length rounded up to a bucket, not Whisper's fixed 30 s),
so a batch may mix window lengths: cross-attention keys are padded to the longest and masked. Greedy
decoding then runs all rows in lockstep; rows that have ended keep feeding <|endoftext|> until all end.

Short windows make Whisper prone to never emitting <|endoftext|> and repeating a phrase. Two guards:
a cap on new tokens proportional to the audio duration (tokens per second plus a small allowance), and
a loop stop once the output ends in `loop_copies` back-to-back copies of a block of 2+ tokens. Only a
row stopped by a guard has its looping tail cut back to one copy: a row that ended by itself keeps
genuine repeats ("five five"). And a row stopped by a guard in a shortened window is decoded again in
the full 30 s window (`full_window_retry`), where Whisper rarely loops: the cheap window serves most
segments and the few that go wrong pay Whisper's usual price.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.asr.onnx_model import WhisperOnnx
from pipeline.asr.vocabulary import END_OF_TEXT, NO_SPEECH, NO_TIMESTAMPS, START_OF_TRANSCRIPT

FRAMES_PER_SECOND = 100
MAX_WINDOW_FRAMES = 3000
# Special ids that faster-whisper always suppresses beside config.json's list (transcribe, translate,
# start-of-transcript, start-of-prev, start-of-lm, no-speech).
_ALWAYS_SUPPRESSED = (50358, 50357, 50257, 50360, 50359, 50361)
PROMPT = (START_OF_TRANSCRIPT, NO_TIMESTAMPS)


@dataclass(frozen=True)
class WindowPolicy:
    """How long an encoder window a segment gets: its length rounded up to `bucket_s` (0 = always 30 s)."""

    bucket_s: float = 2.0

    def window_frames(self, mel_frames: int) -> int:
        if self.bucket_s <= 0:
            return MAX_WINDOW_FRAMES
        bucket = max(2, int(round(self.bucket_s * FRAMES_PER_SECOND)))
        bucket += bucket % 2  # the stride-2 convolution needs an even number of frames
        return min(MAX_WINDOW_FRAMES, max(bucket, math.ceil(mel_frames / bucket) * bucket))


@dataclass(frozen=True)
class DecodeOptions:
    window: WindowPolicy = field(default_factory=WindowPolicy)
    max_tokens_per_second: float = 6.0
    token_allowance: int = 6
    max_new_tokens: int = 224
    suppress_ids: tuple[int, ...] = ()
    suppress_ids_begin: tuple[int, ...] = (220, END_OF_TEXT)
    loop_copies: int = 3
    full_window_retry: bool = True

    def token_cap(self, duration_s: float) -> int:
        return min(
            self.max_new_tokens, self.token_allowance + math.ceil(self.max_tokens_per_second * duration_s)
        )


@dataclass(frozen=True)
class DecodedSegment:
    tokens: list[int]
    text: str
    avg_logprob: float
    no_speech_prob: float
    window_frames: int
    stopped_by_guard: bool


@dataclass(frozen=True)
class BatchTimings:
    encode_ms: float
    decode_ms: float
    steps: int


def ends_in_loop(tokens: list[int], copies: int, min_block: int = 2, max_block: int = 16) -> bool:
    """Whether `tokens` ends in `copies` consecutive copies of one block of min_block..max_block tokens."""
    for block in range(min_block, min(max_block, len(tokens) // copies) + 1):
        tail = tokens[-block:]
        if all(tokens[-(k + 1) * block : len(tokens) - k * block] == tail for k in range(1, copies)):
            return True
    return False


def cut_loop(tokens: list[int], max_block: int = 16) -> list[int]:
    """Cut a looping tail (two or more back-to-back copies of a block, the last maybe partial) to one copy.

    Picks the earliest start at which the rest of the output is such a loop, so the most repetition goes.
    """
    for start in range(len(tokens)):
        rest = tokens[start:]
        for block in range(1, min(max_block, len(rest) // 2) + 1):
            if all(rest[i] == rest[i % block] for i in range(len(rest))):
                return tokens[: start + block]
    return tokens


def pad_window(mel: np.ndarray, frames: int) -> np.ndarray:
    """Zero-pad (or trim) a [n_mels, T] log-mel to `frames`, as faster-whisper pads to its window."""
    out = np.zeros((mel.shape[0], frames), np.float32)
    used = min(frames, mel.shape[1])
    out[:, :used] = mel[:, :used]
    return out


def _log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1, keepdims=True)
    return logits - (top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True)))


class GreedyDecoder:
    """Decodes lists of log-mel segments with one model; not thread-safe (one batch at a time)."""

    def __init__(self, model: WhisperOnnx, options: DecodeOptions) -> None:
        self.model = model
        self.options = options
        vocab = int(model.decoder.get_outputs()[0].shape[2])
        suppressed = set(options.suppress_ids) | set(_ALWAYS_SUPPRESSED)
        self._suppress = np.zeros(vocab, np.float32)
        self._suppress[sorted(i for i in suppressed if i < vocab)] = -np.inf
        self._suppress_begin = self._suppress.copy()
        self._suppress_begin[list(options.suppress_ids_begin)] = -np.inf

    def _encode(
        self, mels: list[np.ndarray], window: WindowPolicy
    ) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, list[int]]:
        """Encode each window-length group once; return cross K/V padded to the longest, and its mask."""
        windows = [window.window_frames(m.shape[1]) for m in mels]
        groups: dict[int, list[int]] = {}
        for row, frames in enumerate(windows):
            groups.setdefault(frames, []).append(row)
        longest = max(windows) // 2
        cross_k = cross_v = np.empty(0, np.float32)
        mask = np.zeros((len(mels), longest), np.float32)
        for frames, rows in groups.items():
            batch = np.stack([pad_window(mels[r], frames) for r in rows])
            k, v = self.model.encode(batch)
            if cross_k.size == 0:
                shape = (k.shape[0], len(mels), k.shape[2], longest, k.shape[4])
                cross_k, cross_v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            cross_k[:, rows, :, : frames // 2] = k
            cross_v[:, rows, :, : frames // 2] = v
            mask[rows, : frames // 2] = 1.0
        return (cross_k, cross_v), mask, windows

    def decode(
        self, mels: list[np.ndarray], durations_s: list[float]
    ) -> tuple[list[DecodedSegment], BatchTimings]:
        """Decode a batch; rows a guard stopped in a short window are retried in the full window."""
        results, timings = self._decode_once(mels, durations_s, self.options.window)
        retry = [
            r
            for r, result in enumerate(results)
            if self.options.full_window_retry
            and result.stopped_by_guard
            and result.window_frames < MAX_WINDOW_FRAMES
        ]
        if not retry:
            return results, timings
        again, more = self._decode_once(
            [mels[r] for r in retry], [durations_s[r] for r in retry], WindowPolicy(0)
        )
        for r, result in zip(retry, again, strict=True):
            results[r] = result
        return results, BatchTimings(
            timings.encode_ms + more.encode_ms, timings.decode_ms + more.decode_ms, timings.steps + more.steps
        )

    def _decode_once(
        self, mels: list[np.ndarray], durations_s: list[float], window: WindowPolicy
    ) -> tuple[list[DecodedSegment], BatchTimings]:
        started = time.perf_counter()
        cross, mask, windows = self._encode(mels, window)
        encoded = time.perf_counter()
        caps = np.array([self.options.token_cap(d) for d in durations_s])
        rows = len(mels)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprob_sum = np.zeros(rows)
        done = np.zeros(rows, bool)
        guarded = np.zeros(rows, bool)  # stopped by the token cap or the loop stop, not by <|endoftext|>
        step_tokens = np.tile(np.array(PROMPT, np.int64), (rows, 1))
        cache = self.model.empty_cache(rows)
        no_speech = np.zeros(rows)
        steps = 0
        while not done.all():
            logits, cache = self.model.decode_step(step_tokens, cache, cross, mask)
            if steps == 0:
                no_speech = np.exp(_log_softmax_rows(logits[:, 0, :])[:, NO_SPEECH])
            scores = _log_softmax_rows(
                logits[:, -1, :] + (self._suppress_begin if steps == 0 else self._suppress)
            )
            chosen = scores.argmax(axis=-1)
            for row in np.flatnonzero(~done):
                token = int(chosen[row])
                logprob_sum[row] += scores[row, token]
                if token == END_OF_TEXT:
                    done[row] = True
                    continue
                tokens[row].append(token)
                if len(tokens[row]) >= caps[row] or ends_in_loop(tokens[row], self.options.loop_copies):
                    done[row] = guarded[row] = True
            step_tokens = np.where(done, END_OF_TEXT, chosen).reshape(rows, 1).astype(np.int64)
            steps += 1
        finished = time.perf_counter()
        tokens = [cut_loop(t) if guarded[r] else t for r, t in enumerate(tokens)]
        results = [
            DecodedSegment(
                tokens=tokens[r],
                text=self.model.vocabulary.decode(tokens[r]),
                avg_logprob=float(logprob_sum[r] / (len(tokens[r]) + 1)),
                no_speech_prob=float(no_speech[r]),
                window_frames=windows[r],
                stopped_by_guard=bool(guarded[r]),
            )
            for r in range(rows)
        ]
        timings = BatchTimings((encoded - started) * 1000, (finished - encoded) * 1000, steps)
        return results, timings
