"""Batched greedy Whisper decoding over segments of different lengths, with a self-attention KV cache.

Each segment is encoded in its own window (its length rounded up to a bucket, not Whisper's fixed 30 s),
so a batch may mix window lengths: cross-attention keys are padded to the longest and masked. Greedy
decoding then runs all rows in lockstep, and a row that has ended leaves the batch.

Short windows make Whisper prone to never emitting <|endoftext|> and repeating a phrase. Two guards:
a cap on new tokens proportional to the audio duration (tokens per second plus a small allowance), and
a loop stop once the output ends in `loop_copies` back-to-back copies of a block of 2+ tokens. A block
made only of digits, number words and separators ("1, " or "-1" or " one") is not a loop: card and phone
numbers repeat digits ("four one one one one one ..." is "4-1-1-1-1..."), and cutting them lost the
digits (the card number came out as "4-1"); the token cap still bounds a real runaway. Only a
row stopped by a guard has its looping tail cut back to one copy: a row that ended by itself keeps
genuine repeats ("five five"). And a row stopped by a guard in a shortened window is decoded again in
a longer one (`full_window_retry`): first `retry_bucket_s` (10 s), then, if it still loops, the full
30 s window, where Whisper rarely loops. The cheap window serves most segments; on the eval set the
10 s retry fixes every row the 30 s one did (same WER) for a fifth of the encoder cost, and retries had
cost as much as all first passes together. A third guard is faster-whisper's: a row that ends by itself
but whose text compresses too well (zlib ratio above `compression_ratio_max`, 2.4) is repetitive, and
is retried in the longer windows too; its text is not cut (a real "no, no, no, no" stays), and after
the last window it stands as decoded. One case skips the 10 s retry: a row whose tail is one digit
said over and over ("-1-1-1-1", "111-111") stops there at once, and goes straight to 30 s. Whisper
loses count of such runs in the 5, 10, 15, 20 and 25 s windows alike (the call library's "six oh one
one, one one one one, ..." came out "6-11-11-11-..." in all of them, and right only at 30 s); stopping
early and skipping 10 s took its card turns' decoding from 0.53-0.66 s to 0.46-0.49 s with the same
text, and the call library's WER 5.91 -> 5.89 % (8 kHz mu-law).

Rows that end by themselves are doubted too (`_doubt`), and a doubtful row is decoded again: after its
context without it (an echo), in the longer windows (repetitive), or straight at 30 s when the 10 s
window shares the doubt: it ended far too early for its audio, its whole text is one phrase said twice
("1 1": a short phrase in a window of mostly zero padding), or its average log-probability is below
faster-whisper's fallback threshold (our fallback is the window, not a temperature).
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from pipeline.asr.beam import SegmentBeam
from pipeline.asr.onnx_model import DecoderStepInputs, DecoderStepOutputs, WhisperOnnx
from pipeline.asr.results import NO_SPEECH_THRESHOLD
from pipeline.qa.numbers import UNITS

FRAMES_PER_SECOND = 100
MAX_WINDOW_FRAMES = 3000
# Why a row that ended by itself is decoded again (GreedyDecoder._doubt).
Doubt = Literal["echo", "repetitive", "short", "twice", "unsure"]
STRAIGHT_TO_FULL: frozenset[str] = frozenset({"short", "twice", "unsure"})  # the 10 s window shares these
LOST_COUNT_TAIL = 8  # tokens at the end of a row that must all say one digit to stop it (lost_count)


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
    suppress_ids_begin: tuple[int, ...] = (220, 50256)  # blank and <|endoftext|> (tiny.en ids)
    loop_copies: int = 3
    full_window_retry: bool = True
    retry_bucket_s: float = 10.0
    compression_ratio_max: float = 2.4  # 0 = no check
    # True: a one-digit run decodes on to its token cap and through every retry window, as before 94ee17a.
    retry_digit_runs: bool = False
    # Text tokens of a row's context (its leg's previous text) that condition its decoding; 0 = none.
    context_tokens: int = 0
    # A row of at least `short_check_s` that ends by itself with fewer tokens per second than this ended
    # early (Whisper's <|endoftext|> at a pause, the rest of the speech dropped): retried at 30 s. 0 = off.
    min_tokens_per_second: float = 1.5
    short_check_s: float = 6.0
    # A row decoded after a context that repeats a block of `echo_block` tokens, or copies `echo_span`
    # tokens of the context, is decoded again without it (Whisper's prompt-copying failure).
    echo_block: int = 4
    echo_span: int = 6
    # Hypotheses kept per segment: 1 = greedy; more = beam search (pipeline.asr.beam), each hypothesis
    # a decoder row of its own, batched with the other segments' rows.
    beam_size: int = 1
    # Beam ranking in windows short of 30 s: Whisper expects speech to go on into the zero padding, so
    # per-token scores (length penalty 1, faster-whisper's) favour saying it twice ("1 1", "16 16 16").
    short_window_length_penalty: float = 0.0
    short_window_fill: float = 0.5  # a window at least this full of audio keeps the length penalty 1
    # A row whose whole text is one phrase said twice ("1 1", "Yesterday. Yesterday.") in a short window,
    # mostly zero padding, where Whisper hears the phrase go on: decoded again at 30 s (Asterisk prompts
    # "one" "ten" "three" said twice, right at 30 s). A real "no no" is said twice there too.
    retry_whole_twice: bool = True
    # A row that ends by itself in a short window with an average log-probability below this is decoded
    # again at 30 s, Whisper's own window: faster-whisper's fallback threshold (-1.0) on its temperature
    # retries, with the window as our fallback. -inf = off.
    retry_logprob: float = -math.inf

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
    # A guard stopped it in a run of one digit said over and over, which Whisper miscounts in every window
    # short of 30 s: its retry skips the 10 s window and goes straight to 30 s (DecodeOptions.retry_digit_runs).
    lost_count: bool = False
    # Why a row that ended by itself is decoded again (``GreedyDecoder._doubt``), or None.
    doubt: Doubt | None = None

    @property
    def echo(self) -> bool:
        """Decoded after a context and echoes it or itself: decoded again without context."""
        return self.doubt == "echo"

    @property
    def straight_to_full(self) -> bool:
        """Its retry skips the 10 s window for 30 s: a lost count, or a doubt the 10 s window shares."""
        return self.lost_count or self.doubt in STRAIGHT_TO_FULL


@dataclass(frozen=True)
class BatchTimings:
    encode_ms: float
    decode_ms: float
    steps: int

    def __add__(self, more: BatchTimings) -> BatchTimings:
        """The timings of a batch and of a further pass over some of its rows, together."""
        return BatchTimings(self.encode_ms + more.encode_ms, self.decode_ms + more.decode_ms, self.steps + more.steps)


FinalRow = Callable[[int, DecodedSegment], None]
"""Called (in the decoding thread) with a row's index and result as soon as that row is final."""


DIGIT_WORDS = {word: str(digit) for word, digit in UNITS.items()}  # "oh" -> "0", "one" -> "1", ...
NUMBER_WORDS = frozenset([*DIGIT_WORDS, "double", "triple"])
_DIGITS = re.compile(r"\d+")
_SEPARATORS = re.compile(r"[,.\-/]+")


@dataclass(frozen=True)
class NumberTokens:
    """The vocabulary's digit and number-word tokens, and the separators said between digits."""

    digits: frozenset[int] = frozenset()
    separators: frozenset[int] = frozenset()
    said: Mapping[int, str] = field(default_factory=dict)  # digit token -> the digits it says ("111", "1")

    @classmethod
    def of(cls, tokens: Sequence[str]) -> NumberTokens:
        """From byte-level BPE strings ("Ġ" marks a leading space), as the vocabulary stores them."""
        digits, separators, said = set(), set(), {}
        for token_id, token in enumerate(tokens):
            word = token.replace("\u0120", "").lower()
            if _DIGITS.fullmatch(word) or word in NUMBER_WORDS:
                digits.add(token_id)
                said[token_id] = DIGIT_WORDS.get(word, "" if word in NUMBER_WORDS else word)
            elif _SEPARATORS.fullmatch(word):
                separators.add(token_id)
        return cls(frozenset(digits), frozenset(separators), said)

    def is_number(self, block: Sequence[int]) -> bool:
        """Whether `block` is digits said one after another (with separators), not a looping phrase."""
        return any(t in self.digits for t in block) and all(
            t in self.digits or t in self.separators for t in block
        )

    def one_digit_run(self, tail: Sequence[int], min_digits: int = 3) -> bool:
        """Whether `tail` is one digit said over and over ("-1-1-1", "111 111", "one one one"), with
        at least `min_digits` digit tokens: the run Whisper loses count of in any window."""
        said = "".join(self.said.get(t, "") for t in tail)
        return (
            self.is_number(tail)
            and sum(t in self.digits for t in tail) >= min_digits
            and len(set(said)) == 1
        )


def compression_ratio(text: str) -> float:
    """UTF-8 bytes per zlib-compressed byte, as faster-whisper measures repetitive output."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def ends_in_loop(
    tokens: list[int],
    copies: int,
    min_block: int = 2,
    max_block: int = 16,
    numbers: NumberTokens = NumberTokens(),
) -> bool:
    """Whether `tokens` ends in `copies` consecutive copies of one block of min_block..max_block tokens.

    A block that is a number (see ``NumberTokens.is_number``) does not count: repeated digits are speech.
    """
    for block in range(min_block, min(max_block, len(tokens) // copies) + 1):
        tail = tokens[-block:]
        if numbers.is_number(tail):
            continue
        if all(tokens[-(k + 1) * block : len(tokens) - k * block] == tail for k in range(1, copies)):
            return True
    return False


def echoes(tokens: Sequence[int], prompt: Sequence[int], block: int = 4, span: int = 6,
           numbers: NumberTokens = NumberTokens()) -> bool:
    """Whether text decoded after ``prompt`` shows Whisper's prompt-copying failure: a block of `block`
    tokens said twice in it ("Okay. One moment. Okay. One moment.") or `span` consecutive tokens of the
    prompt copied. Numbers do not count (digits repeat)."""
    grams: set[tuple[int, ...]] = set()
    for i in range(len(tokens) - block + 1):
        gram = tuple(tokens[i:i + block])
        if gram in grams and not numbers.is_number(gram):
            return True
        grams.add(gram)
    said = {tuple(prompt[i:i + span]) for i in range(len(prompt) - span + 1)}
    return any(
        tuple(tokens[i:i + span]) in said and not numbers.is_number(tokens[i:i + span])
        for i in range(len(tokens) - span + 1)
    )


def says_twice(tokens: Sequence[int], min_block: int = 3, numbers: NumberTokens = NumberTokens()) -> bool:
    """Whether a block of `min_block`+ tokens (not a number) comes twice back to back anywhere in
    ``tokens``: "10 of clubs 10 of clubs", "Seven of clubs. Seven of clubs."."""
    for block in range(min_block, len(tokens) // 2 + 1):
        for i in range(len(tokens) - 2 * block + 1):
            first = tokens[i:i + block]
            if first == tokens[i + block:i + 2 * block] and not numbers.is_number(first):
                return True
    return False


def whole_text_twice(text: str) -> bool:
    """Whether ``text``'s words are one run said twice ("1 1", "Time... Time...", "R. R.")."""
    words = re.findall(r"[\w']+", text.lower())
    half = len(words) // 2
    return half > 0 and len(words) == 2 * half and words[:half] == words[half:]


def cut_loop(tokens: list[int], max_block: int = 16, numbers: NumberTokens = NumberTokens()) -> list[int]:
    """Cut a looping tail (two or more back-to-back copies of a block, the last maybe partial) to one copy.

    Picks the earliest start at which the rest of the output is such a loop, so the most repetition goes.
    A tail of repeated digits is kept as it is: Whisper may run on past the digits said, but cutting
    "4-1-1-1-..." to "4-1" loses a card number's digits for certain, keeping them loses few or none.
    """
    for start in range(len(tokens)):
        rest = tokens[start:]
        for block in range(1, min(max_block, len(rest) // 2) + 1):
            if all(rest[i] == rest[i % block] for i in range(len(rest))):
                return tokens if numbers.is_number(rest[:block]) else tokens[: start + block]
    return tokens


def _renumbered(on_final: FinalRow, rows: list[int]) -> FinalRow:
    """``on_final`` for a sub-batch whose row i is the batch's row rows[i]."""
    return lambda i, result: on_final(rows[i], result)


def pad_window(mel: np.ndarray, frames: int) -> np.ndarray:
    """Zero-pad (or trim) a [n_mels, T] log-mel to `frames`, as faster-whisper pads to its window."""
    out = np.zeros((mel.shape[0], frames), np.float32)
    used = min(frames, mel.shape[1])
    out[:, :used] = mel[:, :used]
    return out


class GreedyDecoder:
    """Decodes lists of log-mel segments with one model. Batches may run at once in several threads:
    it keeps no per-batch state, and ONNX Runtime sessions allow concurrent runs."""

    def __init__(self, model: WhisperOnnx, options: DecodeOptions) -> None:
        self.model = model
        self.options = options
        self.specials = model.vocabulary.specials
        vocab = int(model.decoder_input("logit_bias").shape[0])
        suppressed = set(options.suppress_ids) | set(self.specials.always_suppressed)
        self._suppress = np.zeros(vocab, np.float32)
        self._suppress[sorted(i for i in suppressed if i < vocab)] = -np.inf
        self._suppress_begin = self._suppress.copy()
        self._suppress_begin[list(options.suppress_ids_begin)] = -np.inf
        self.numbers = NumberTokens.of(model.vocabulary.tokens)

    def _encode(
        self, mels: list[np.ndarray], window: WindowPolicy, wide: bool = False
    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, list[int]]:
        """Encode each window-length group once; return cross K/V padded to the longest, and its mask."""
        windows = [window.window_frames(m.shape[1]) for m in mels]
        groups: dict[int, list[int]] = {}
        for row, frames in enumerate(windows):
            groups.setdefault(frames, []).append(row)
        longest = max(windows) // 2
        cross: list[tuple[np.ndarray, np.ndarray]] = []
        mask = np.zeros((len(mels), longest), np.float32)
        for frames, rows in groups.items():
            # Only a full 30 s window (a last-chance retry, a 25-30 s turn) encodes wide: it is the one
            # costly enough (677 -> 386 ms on 2 cores) to pay for taking the event loop's core.
            encoded = self.model.encode(
                np.stack([pad_window(mels[r], frames) for r in rows]), wide and frames >= MAX_WINDOW_FRAMES
            )
            if not cross:
                shape = (len(mels), encoded[0][0].shape[1], longest, encoded[0][0].shape[3])
                cross = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in encoded]
            for (k, v), (layer_k, layer_v) in zip(cross, encoded, strict=True):
                k[rows, :, : frames // 2] = layer_k
                v[rows, :, : frames // 2] = layer_v
            mask[rows, : frames // 2] = 1.0
        return cross, mask, windows

    def decode(
        self, mels: list[np.ndarray], durations_s: list[float], wide: bool = False, on_final: FinalRow | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[DecodedSegment], BatchTimings]:
        """Decode a batch; rows a guard stopped in a short window are retried in longer ones.
        ``wide``: encode on the model's wide encoder (nothing else is waiting for the cores).
        ``on_final``: told of each row once its result is final, while the rest of the batch still
        decodes: a short reply need not wait for a long turn (or a retry) that shares its batch.
        ``contexts``: per row, the tokens of its leg's previous text to condition on (Whisper's
        <|startofprev|> prompt, the last `DecodeOptions.context_tokens` of them), or none."""
        released: set[int] = set()

        def release(row: int, result: DecodedSegment) -> None:
            if on_final is not None and row not in released:
                released.add(row)
                on_final(row, result)

        results, timings = self._decode_once(mels, durations_s, self.options.window, wide, release, contexts)
        echo = [r for r, result in enumerate(results) if result.echo]
        if echo and contexts is not None:
            # Decoded again without context, in the same window; their retries go without it too.
            again, more = self._decode_once(
                [mels[r] for r in echo], [durations_s[r] for r in echo], self.options.window, wide,
                _renumbered(release, echo),
            )
            for r, result in zip(echo, again, strict=True):
                results[r] = result
            contexts = [() if r in echo else c for r, c in enumerate(contexts)]
            timings += more
        if self.options.full_window_retry:
            for window in (WindowPolicy(self.options.retry_bucket_s), WindowPolicy(0)):
                retry = [
                    r
                    for r, result in enumerate(results)
                    if result.stopped_by_guard
                    and (window.bucket_s <= 0 or not result.straight_to_full)
                    and window.window_frames(mels[r].shape[1]) > result.window_frames
                ]
                if not retry:
                    continue
                again, more = self._decode_once(
                    [mels[r] for r in retry], [durations_s[r] for r in retry], window, wide,
                    _renumbered(release, retry), [contexts[r] for r in retry] if contexts is not None else None,
                )
                for r, result in zip(retry, again, strict=True):
                    results[r] = result
                timings += more
        for row, result in enumerate(results):
            release(row, result)  # rows a guard stopped with no longer window left
        return results, timings

    def _decode_once(
        self,
        mels: list[np.ndarray],
        durations_s: list[float],
        window: WindowPolicy,
        wide: bool = False,
        on_ended: FinalRow | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[DecodedSegment], BatchTimings]:
        """One pass in one window policy; ``on_ended`` hears of each row that ends by <|endoftext|>
        (no guard stopped it, so no retry will change it) as soon as it does. ``contexts``: per row, the
        text tokens to condition on (previous text), or none."""
        if self.options.beam_size > 1:
            return self._beam_once(mels, durations_s, window, wide, on_ended, contexts)
        started = time.perf_counter()
        cross, mask, windows = self._encode(mels, window, wide)
        encoded = time.perf_counter()
        caps = np.array([self.options.token_cap(d) for d in durations_s])
        # A row that a 30 s window may still decode again stops as soon as it is in a one-digit run.
        retryable = [self.options.full_window_retry and frames < MAX_WINDOW_FRAMES for frames in windows]
        rows = len(mels)
        eot = self.specials.end_of_text
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprob_sum = np.zeros(rows)
        done = np.zeros(rows, bool)
        guarded = np.zeros(rows, bool)  # stopped by the token cap or the loop stop, or doubted
        # ended by <|endoftext|>, but doubtful (repetitive, too short, an echo...): retried, its text not cut
        doubts: list[Doubt | None] = [None] * rows
        prompts = [self._context_text(contexts, r) for r in range(rows)]
        out, next_position, self_mask = self._prefill(rows, contexts, cross, mask)
        no_speech = out.no_speech_prob.astype(np.float64)
        step = DecoderStepInputs(
            tokens=np.zeros((rows, 1), np.int64),
            positions=np.zeros((rows, 1), np.int64),
            past=out.present,
            cross=cross,
            cross_mask=mask,
            self_mask=self_mask,
            logit_bias=self._suppress,
            no_speech_id=self.specials.no_speech,
        )
        out = self._prompt_rest(step, next_position)
        steps = 2
        active = np.arange(rows)  # original row of each batch position still decoding
        while True:
            for position, row in enumerate(active):
                token = int(out.next_token[position])
                logprob_sum[row] += float(out.next_logprob[position])
                if token == eot:
                    done[row] = True
                    ended = self._segment(tokens[row], logprob_sum[row], no_speech[row], windows[row], False)
                    doubt = self._doubt(ended, durations_s[row], prompts[row])
                    if doubt is not None:
                        guarded[row] = True  # a longer window may decode it better
                        doubts[row] = doubt
                    elif on_ended is not None:
                        on_ended(int(row), ended)
                    continue
                tokens[row].append(token)
                if self._guard_stops(tokens[row], caps[row], retryable[row]):
                    done[row] = guarded[row] = True
            if done.all():
                break
            keep = ~done[active]
            step.tokens = out.next_token[keep].reshape(-1, 1).astype(np.int64)
            step.past = out.present
            step.self_mask = np.concatenate([step.self_mask, np.ones((len(active), 1), np.float32)], axis=1)
            if not keep.all():
                # Finished rows leave the batch, so later steps cost only what is still decoding.
                active = active[keep]
                next_position = next_position[keep]
                step.past = [(k[keep], v[keep]) for k, v in step.past]
                step.cross = [(k[keep], v[keep]) for k, v in step.cross]
                step.cross_mask = step.cross_mask[keep]
                step.self_mask = step.self_mask[keep]
            step.positions = next_position.reshape(-1, 1)
            next_position = next_position + 1
            out = self.model.decode_step(step)
            steps += 1
        finished = time.perf_counter()
        stopped = [bool(guarded[r]) and doubts[r] is None for r in range(rows)]  # by a guard, mid-speech
        results = [
            self._segment(
                cut_loop(tokens[r], numbers=self.numbers) if stopped[r] else tokens[r],
                logprob_sum[r], no_speech[r], windows[r], bool(guarded[r]),
                stopped[r] and self._lost_count(tokens[r]), doubts[r],
            )
            for r in range(rows)
        ]
        timings = BatchTimings((encoded - started) * 1000, (finished - encoded) * 1000, steps)
        return results, timings

    def _beam_once(
        self,
        mels: list[np.ndarray],
        durations_s: list[float],
        window: WindowPolicy,
        wide: bool = False,
        on_ended: FinalRow | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[DecodedSegment], BatchTimings]:
        """``_decode_once`` by beam search: every live hypothesis of every segment is a row of one
        decoder batch; each step reorders the rows' caches to the hypotheses they now continue. A
        segment's guards stop its hypotheses one by one (``SegmentBeam``)."""
        started = time.perf_counter()
        cross, mask, windows = self._encode(mels, window, wide)
        encoded = time.perf_counter()
        segments = len(mels)
        caps = [self.options.token_cap(d) for d in durations_s]
        retryable = [self.options.full_window_retry and frames < MAX_WINDOW_FRAMES for frames in windows]
        beams = [
            SegmentBeam(self.options.beam_size, self.specials.end_of_text, self._length_penalty(mel, frames))
            for mel, frames in zip(mels, windows, strict=True)
        ]
        out, next_position, self_mask = self._prefill(segments, contexts, cross, mask)
        no_speech = out.no_speech_prob.astype(np.float64)
        step = DecoderStepInputs(
            tokens=np.zeros((segments, 1), np.int64), positions=np.zeros((segments, 1), np.int64),
            past=out.present, cross=cross, cross_mask=mask, self_mask=self_mask, logit_bias=self._suppress,
            no_speech_id=self.specials.no_speech, top_k=beams[0].candidates_per_row,
        )
        out = self._prompt_rest(step, next_position)
        steps = 2
        results: list[DecodedSegment | None] = [None] * segments
        owners = np.arange(segments)  # the segment of each decoder row; a segment's rows are contiguous
        while True:
            sources: list[int] = []
            tokens: list[int] = []
            for segment in dict.fromkeys(owners.tolist()):
                rows = np.flatnonzero(owners == segment)
                beam = beams[segment]

                def stop(hyp: tuple[int, ...], segment: int = segment) -> bool:
                    return self._guard_stops(list(hyp), caps[segment], retryable[segment])

                grown = beam.advance(out.top_tokens[rows], out.top_logprobs[rows], stop)
                sources.extend(int(rows[source]) for source in grown)
                tokens.extend(hyp.tokens[-1] for hyp in beam.live)
                if beam.done:
                    results[segment] = self._beam_result(
                        beam, no_speech[segment], windows[segment], on_ended, segment, durations_s[segment],
                        self._context_text(contexts, segment),
                    )
            if not sources:
                break
            index = np.array(sources)
            new_owners = owners[index]
            step.past = [(k[index], v[index]) for k, v in out.present]
            if not np.array_equal(new_owners, owners):
                # Rows per segment changed: their audio (the same for every row of a segment) follows.
                step.cross = [(k[new_owners], v[new_owners]) for k, v in cross]
                step.cross_mask = mask[new_owners]
            owners = new_owners
            next_position = next_position[index]
            step.self_mask = np.concatenate([step.self_mask[index], np.ones((len(index), 1), np.float32)], axis=1)
            step.tokens = np.array(tokens, np.int64).reshape(-1, 1)
            step.positions = next_position.reshape(-1, 1)
            next_position = next_position + 1
            out = self.model.decode_step(step)
            steps += 1
        finished = time.perf_counter()
        done = [r for r in results if r is not None]
        assert len(done) == segments, "every segment's beam ends"
        return done, BatchTimings((encoded - started) * 1000, (finished - encoded) * 1000, steps)

    def _length_penalty(self, mel: np.ndarray, window_frames: int) -> float:
        """faster-whisper's 1 in a 30 s window or one the audio mostly fills; in a short window that is
        mostly zero padding, `short_window_length_penalty`."""
        if window_frames >= MAX_WINDOW_FRAMES or mel.shape[1] >= self.options.short_window_fill * window_frames:
            return 1.0
        return self.options.short_window_length_penalty

    def _beam_result(
        self, beam: SegmentBeam, no_speech: float, window_frames: int, on_ended: FinalRow | None, row: int,
        duration_s: float, prompt: Sequence[int],
    ) -> DecodedSegment:
        """A finished beam's winner as a row's result; told to ``on_ended`` when no retry can change it."""
        best = beam.best(lambda hyp: says_twice(hyp, numbers=self.numbers))
        tokens = cut_loop(list(best.tokens), numbers=self.numbers) if best.guarded else list(best.tokens)
        text = self.model.vocabulary.decode(tokens)
        result = DecodedSegment(
            tokens=tokens, text=text,
            avg_logprob=float(best.logprob / (len(best.tokens) + 1)), no_speech_prob=float(no_speech),
            window_frames=window_frames, stopped_by_guard=best.guarded,
            lost_count=best.guarded and self._lost_count(list(best.tokens)),
        )
        doubt = None if best.guarded else self._doubt(result, duration_s, prompt)
        guarded = best.guarded or doubt is not None
        result = replace(result, stopped_by_guard=guarded, doubt=doubt)
        if not guarded and on_ended is not None:
            on_ended(row, result)
        return result

    def _prefill(
        self, rows: int, contexts: Sequence[Sequence[int]] | None, cross: list[tuple[np.ndarray, np.ndarray]],
        cross_mask: np.ndarray,
    ) -> tuple[DecoderStepOutputs, np.ndarray, np.ndarray]:
        """Run every row's prompt up to <|startoftranscript|> in one step, whose output gives the
        no-speech probability. A row with context starts <|startofprev|> + its last `context_tokens`
        text tokens; rows are left-padded to one length, the padding masked and skipped in positions.
        Returns the step's output, each row's next position, and the self-attention mask so far."""
        specials = self.specials
        head_end = specials.prompt.index(specials.start_of_transcript) + 1
        heads = [
            self._context_prefix(contexts[r] if contexts is not None else ()) + specials.prompt[:head_end]
            for r in range(rows)
        ]
        width = max(len(h) for h in heads)
        tokens = np.full((rows, width), specials.end_of_text, np.int64)
        positions = np.zeros((rows, width), np.int64)
        self_mask = np.zeros((rows, width), np.float32)
        for r, head in enumerate(heads):
            pad = width - len(head)
            tokens[r, pad:] = head
            positions[r, pad:] = np.arange(len(head))
            self_mask[r, pad:] = 1.0
        out = self.model.decode_step(DecoderStepInputs(
            tokens=tokens, positions=positions, past=self.model.empty_cache(rows), cross=cross,
            cross_mask=cross_mask, self_mask=self_mask,
            logit_bias=self._suppress, no_speech_id=specials.no_speech,
        ))
        return out, np.array([len(h) for h in heads], np.int64), self_mask

    def _prompt_rest(self, step: DecoderStepInputs, next_position: np.ndarray) -> DecoderStepOutputs:
        """The prompt's tokens after <|startoftranscript|> (<|notimestamps|>, or language and task
        first), in one step whose output is each row's first text token; ``next_position`` moves on."""
        rest = self.specials.prompt[self.specials.prompt.index(self.specials.start_of_transcript) + 1:]
        rows = len(next_position)
        step.tokens = np.tile(np.array(rest, np.int64), (rows, 1))
        step.positions = next_position.reshape(-1, 1) + np.arange(len(rest))
        step.self_mask = np.concatenate([step.self_mask, np.ones((rows, len(rest)), np.float32)], axis=1)
        step.logit_bias = self._suppress_begin
        out = self.model.decode_step(step)
        step.logit_bias = self._suppress
        next_position += len(rest)
        return out

    def _guard_stops(self, tokens: list[int], cap: int, retryable: bool) -> bool:
        """Whether a row (or hypothesis) must stop here: its token cap, a loop, or a one-digit run that
        a longer window may still count right."""
        return (
            len(tokens) >= cap
            or ends_in_loop(tokens, self.options.loop_copies, numbers=self.numbers)
            or (retryable and self._lost_count(tokens))
        )

    def _context_text(self, contexts: Sequence[Sequence[int]] | None, row: int) -> tuple[int, ...]:
        """The context tokens row `row` is decoded after (without <|startofprev|>), or ()."""
        return self._context_prefix(contexts[row])[1:] if contexts is not None else ()

    def _context_prefix(self, context: Sequence[int]) -> tuple[int, ...]:
        """<|startofprev|> and the context's last `context_tokens` text tokens; () without context."""
        limit = self.options.context_tokens
        text = [t for t in context if not self.model.vocabulary.is_special(t)]
        if limit <= 0 or not text or self.specials.start_of_prev is None:
            return ()
        return (self.specials.start_of_prev, *text[-limit:])

    def _lost_count(self, tokens: list[int]) -> bool:
        """Whether a row ends in one digit said over and over (the loop stop lets digit runs be): short
        windows only miscount those ("6-11-11-11-..." to the token cap for "six oh one one, one one one
        one, ..." at 5-25 s, "601-11, 111-11, ..." at 30 s), so they stop early and skip the 10 s retry."""
        return not self.options.retry_digit_runs and self.numbers.one_digit_run(tokens[-LOST_COUNT_TAIL:])

    def _doubt(self, ended: DecodedSegment, duration_s: float, prompt: Sequence[int]) -> Doubt | None:
        """Why a row that ended by itself is still retried, or None: "echo" (decoded after a context
        that it copies or repeats itself after), "repetitive" (compresses too well); and, in a window
        short of 30 s only (the 30 s window is Whisper's own, with nothing longer to try), "short"
        (ended far too early for its audio), "twice" (its whole text said twice: "1 1", "Yesterday.
        Yesterday.") and "unsure" (average log-probability below ``retry_logprob``, and not likely
        silence)."""
        o = self.options
        if prompt and echoes(ended.tokens, prompt, o.echo_block, o.echo_span, self.numbers):
            return "echo"
        if self._repetitive(ended.text):
            return "repetitive"
        if ended.window_frames >= MAX_WINDOW_FRAMES:
            return None
        if duration_s >= o.short_check_s and len(ended.tokens) < o.min_tokens_per_second * duration_s:
            return "short"
        if o.retry_whole_twice and whole_text_twice(ended.text):
            return "twice"
        # Unsure but likely no speech is silence, which the no-speech rule drops: faster-whisper skips its
        # fallback there too, and a 30 s window over noise only invites a hallucination.
        if ended.avg_logprob < o.retry_logprob and ended.no_speech_prob <= NO_SPEECH_THRESHOLD:
            return "unsure"
        return None

    def _repetitive(self, text: str) -> bool:
        limit = self.options.compression_ratio_max
        return limit > 0 and compression_ratio(text) > limit

    def _segment(
        self, tokens: list[int], logprob_sum: float, no_speech: float, window_frames: int, guarded: bool,
        lost_count: bool = False, doubt: Doubt | None = None,
    ) -> DecodedSegment:
        return DecodedSegment(
            tokens=tokens,
            text=self.model.vocabulary.decode(tokens),
            avg_logprob=float(logprob_sum / (len(tokens) + 1)),
            no_speech_prob=float(no_speech),
            window_frames=window_frames,
            stopped_by_guard=guarded,
            lost_count=lost_count,
            doubt=doubt,
        )
