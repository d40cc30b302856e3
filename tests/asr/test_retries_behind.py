"""Retries behind first passes (issue 25): a row's window retry leaves its batch for a later one while
first passes wait, and gives the text it would have given inline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.decoding import MAX_WINDOW_FRAMES, DecodedSegment, RetryLater
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.audio.mel import log_mel_spectrogram
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance


def _digit_one(settings: Settings, recognizer: Recognizer) -> AudioSegment:
    """Asterisk's "one" as the gateway sends it: "1 1" in its 5 s window, a doubt decoded again at 30 s."""
    from pipeline.asr.engine import Engine
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import load_asterisk_set

    utterance = next(u for u in load_asterisk_set() if u.id == "asterisk/digits/1")
    received = conditioned([utterance], "8k-mulaw")[0]
    (segment,) = Engine(recognizer, settings).leg_segments(received.audio, 16000)
    audio = np.asarray(segment.audio, np.float32)
    return AudioSegment(0, audio.size // 16, audio)


def _plain(eval_sets: dict[str, list[EvalUtterance]], index: int) -> AudioSegment:
    utterance = eval_sets["8k-mulaw"][index]
    return AudioSegment(0, int(utterance.duration_s * 1000), utterance.audio)


def test_a_deferred_retry_resumed_later_gives_the_inline_text(
    recognizer_fp32: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    retried, plain = _digit_one(asr_settings, recognizer_fp32), _plain(eval_sets, 3)
    decoder = recognizer_fp32.decoder
    mels = [log_mel_spectrogram(np.asarray(s.audio)) for s in (retried, plain)]
    durations = [np.asarray(s.audio).size / 16000 for s in (retried, plain)]
    inline, _ = decoder.decode(mels, durations)
    assert all(isinstance(r, DecodedSegment) for r in inline)
    assert inline[0].text.strip() == "1" and inline[0].window_frames == MAX_WINDOW_FRAMES  # type: ignore[union-attr]

    told: list[int] = []
    asked: list[bool] = []
    deferred, _ = decoder.decode(mels, durations, on_final=lambda row, _: told.append(row),
                                 defer=lambda: asked.append(True) or True)
    assert asked == [True]
    later = deferred[0]
    assert isinstance(later, RetryLater) and later.first.text.strip() == "1 1"
    assert deferred[1] == inline[1] and told == [1]  # the plain row is final, and told so, at once

    resumed, _ = decoder.decode(mels[:1], durations[:1], on_final=lambda row, _: told.append(row),
                                resumed=[later.first])
    assert resumed == inline[:1] and told == [1, 0]

    not_now, _ = decoder.decode(mels, durations, defer=lambda: False)  # nothing waits: retried inline
    assert not_now == inline


class Recording:
    """The real recognizer, noting each call (first passes or retries, and of which segments); its first
    call waits for ``gate``, so the test can queue more segments while it runs."""

    def __init__(self, inner: Recognizer, names: dict[int, str]) -> None:
        self.inner, self.names = inner, names
        self.calls: list[tuple[str, list[str]]] = []
        self.gate = threading.Event()
        self.started = threading.Event()
        self.retries_later = inner.retries_later
        self.decoder, self.name, self.version = inner.decoder, inner.name, inner.version

    def _note(self, kind: str, segments: Sequence[AudioSegment]) -> None:
        self.calls.append((kind, [self.names[id(s)] for s in segments]))
        if len(self.calls) == 1:
            self.started.set()
            assert self.gate.wait(60)

    def recognize(self, segments: Any, *args: Any) -> list[TranscriptResult | Exception]:
        self._note("inline", segments)
        return self.inner.recognize(segments, *args)

    def recognize_deferring(self, segments: Any, *args: Any, **kwargs: Any) -> list[Any]:
        self._note("retry" if kwargs.get("resumed") else "first", segments)
        return self.inner.recognize_deferring(segments, *args, **kwargs)


async def _a_then_b(
    recognizer: Recognizer, a: AudioSegment, b: AudioSegment, behind: bool, close_early: bool = False
) -> tuple[Recording, list[str], list[TranscriptResult]]:
    """Submit A; while A's batch runs, submit B; return the calls, the order A and B came back, and results."""
    recording = Recording(recognizer, {id(a): "A", id(b): "B"})
    batcher = SegmentBatcher(recording, max_batch=8, max_wait_ms=5, retries_behind=behind)  # type: ignore[arg-type]
    await batcher.start()
    order: list[str] = []

    async def submit(name: str, segment: AudioSegment) -> TranscriptResult:
        result = await batcher.submit(segment)
        order.append(name)
        return result

    first = asyncio.create_task(submit("A", a))
    assert await asyncio.to_thread(recording.started.wait, 60)
    second = asyncio.create_task(submit("B", b))
    await asyncio.sleep(0.05)  # B queued while A's first pass runs
    assert batcher._first_passes_waiting()
    closing = asyncio.create_task(batcher.close()) if close_early else None
    await asyncio.sleep(0.01)
    recording.gate.set()
    results = await asyncio.gather(first, second)
    if closing is not None:
        await closing
    else:
        await batcher.close()
    return recording, order, list(results)


@pytest.mark.slow
async def test_a_retry_waits_behind_a_first_pass_that_came_after_it(
    recognizer_fp32: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    a, b = _digit_one(asr_settings, recognizer_fp32), _plain(eval_sets, 3)
    alone = [recognizer_fp32.recognize([s])[0] for s in (a, b)]

    recording, order, results = await _a_then_b(recognizer_fp32, a, b, behind=True)
    assert recording.calls == [("first", ["A"]), ("first", ["B"]), ("retry", ["A"])]
    assert order == ["B", "A"]  # B's final did not wait for A's 30 s retry
    assert [r.tokens for r in results] == [r.tokens for r in alone]  # type: ignore[union-attr]
    assert results[0].text.strip() == "1"

    recording, order, results = await _a_then_b(recognizer_fp32, a, b, behind=False)
    assert recording.calls == [("inline", ["A"]), ("inline", ["B"])]
    assert order == ["A", "B"]  # inline: B waited for A's retry
    assert [r.tokens for r in results] == [r.tokens for r in alone]  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_retry_left_for_later_is_still_done_when_the_batcher_closes(
    recognizer_fp32: Recognizer, asr_settings: Settings, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    a, b = _digit_one(asr_settings, recognizer_fp32), _plain(eval_sets, 3)
    recording, order, results = await _a_then_b(recognizer_fp32, a, b, behind=True, close_early=True)
    assert sorted(order) == ["A", "B"]
    assert results[0].text.strip() == "1" and ("retry", ["A"]) in recording.calls
