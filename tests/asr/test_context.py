"""Decoding after a leg's previous text (Whisper's <|startofprev|> prompt) and when that text is dropped.

The decoder must condition exactly as the reference does: faster-whisper's ``initial_prompt`` on the same
weights, in the same 30 s window, gives the same text segment by segment; and rows with prompts of
different lengths, batched together (left-padded, masked), decode as each does alone.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.asr.context import LegContext
from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.engine import Engine
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.audio.files import load_audio
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.segmentation.segmenter import SpeechSegment

# an agent leg of the call library (built by `make setup`): its first five segments of one speaker's running talk
SAMPLE = LIBRARY_DIR / "02_card_payment.wav"


def _final(text: str, tokens: tuple[int, ...], end_ms: int, avg_logprob: float = -0.2,
           no_speech: float = 0.0) -> tuple[TranscriptResult, int]:
    return TranscriptResult(0, end_ms, text, avg_logprob, no_speech, "tiny.en", 1, tokens), end_ms


def test_context_follows_a_leg_and_is_dropped_after_a_long_gap_or_an_unreliable_final() -> None:
    ctx = LegContext(max_gap_ms=30_000)
    assert ctx.for_segment(0) == ()
    ctx.update(*_final(" Hello.", (1, 2), 2_000))
    ctx.update(*_final(" Card number?", (3, 4), 5_000))
    assert ctx.for_segment(6_000) == (1, 2, 3, 4)
    assert ctx.for_segment(36_000) == ()  # 31 s after the last final: stale
    ctx.update(*_final(" Old news.", (9,), 4_000))  # decoded late, older than what it holds
    assert ctx.for_segment(6_000) == (1, 2, 3, 4)
    ctx.update(*_final("", (), 7_000, no_speech=0.9, avg_logprob=-2.0))  # silence: the text before stands
    assert ctx.for_segment(8_000) == (1, 2, 3, 4)
    ctx.update(*_final(" I need to design.", (5, 6), 9_000, avg_logprob=-1.4))  # unreliable: start over
    assert ctx.for_segment(10_000) == ()
    ctx.update(*_final(" Yes.", (7,), 11_000))
    ctx.update(*_final(" no no no no no no no no no no no no no no no", (8,) * 15, 13_000))  # repetitive
    assert ctx.for_segment(14_000) == ()


@pytest.fixture(scope="module")
def leg_segments(recognizer_fp32: Recognizer, asr_settings) -> list[SpeechSegment]:  # type: ignore[no-untyped-def]
    audio = load_audio(SAMPLE)
    engine = Engine(recognizer_fp32, asr_settings)
    return engine.leg_segments(audio.samples[0], audio.sample_rate)[:5]  # 4 conditioned: each a 30 s window


def _with_context(recognizer: Recognizer, tokens: int, window_s: float = 0.0) -> Recognizer:
    options = replace(recognizer.decoder.options, context_tokens=tokens, window=WindowPolicy(window_s),
                      full_window_retry=False)
    conditioned = Recognizer(recognizer.model, options)
    return conditioned


def test_previous_text_conditions_decoding_as_faster_whispers_initial_prompt(
    recognizer_fp32: Recognizer, leg_segments: list[SpeechSegment], faster_whisper_fp32  # type: ignore[no-untyped-def]
) -> None:
    """Each segment after the previous one's text, in a 30 s window: the reference's text, word for word,
    and the prompt is really read: it moves every conditioned segment's log-probability."""
    ours = _with_context(recognizer_fp32, 200)
    previous: TranscriptResult | None = None
    changed = 0
    for segment in leg_segments:
        context = previous.tokens if previous is not None else ()
        result = ours.recognize([segment], contexts=[context])[0]
        assert isinstance(result, TranscriptResult)
        alone = ours.recognize([segment])[0]
        assert isinstance(alone, TranscriptResult)
        if context:
            assert result.avg_logprob != alone.avg_logprob, segment.start_ms
            changed += alone.text != result.text
        reference, _ = faster_whisper_fp32.transcribe(
            np.asarray(segment.audio, np.float32), beam_size=1, temperature=0.0, without_timestamps=True,
            condition_on_previous_text=False, initial_prompt=previous.text if previous is not None else None,
        )
        assert result.text == " ".join(s.text.strip() for s in reference), (segment.start_ms, context)
        previous = result
    print(f"context changed the text of {changed} of {len(leg_segments) - 1} segments")


@pytest.mark.slow
def test_rows_with_prompts_of_different_lengths_decode_in_one_batch_as_alone(
    recognizer_fp32: Recognizer, leg_segments: list[SpeechSegment]
) -> None:
    ours = _with_context(recognizer_fp32, 32, window_s=5.0)
    segments = [AudioSegment(s.start_ms, s.end_ms, s.audio) for s in leg_segments[1:]]
    prior = ours.recognize(leg_segments)
    pool = tuple(t for r in prior if isinstance(r, TranscriptResult) for t in r.tokens)
    assert len(pool) >= 32
    # one row without any prompt beside rows whose prompts are 3-32 tokens long
    contexts = [pool[-k:] if k else () for k in (32, 0, 7, 19, 3, 25, 12)[: len(segments)]]
    assert len(segments) >= 3
    together = ours.recognize(segments, contexts=contexts)
    for segment, context, batched in zip(segments, contexts, together, strict=True):
        alone = ours.recognize([segment], contexts=[context])[0]
        assert isinstance(batched, TranscriptResult) and isinstance(alone, TranscriptResult)
        assert batched.text == alone.text
        assert batched.tokens == alone.tokens


def test_context_is_bounded_to_its_last_tokens(recognizer_fp32: Recognizer,
                                                leg_segments: list[SpeechSegment]) -> None:
    """Only the last `context_tokens` text tokens are read: a longer context with the same tail decodes the
    same, whatever came before it."""
    ours = _with_context(recognizer_fp32, 8, window_s=5.0)
    prior = ours.recognize(leg_segments[:3])
    tail = tuple(t for r in prior if isinstance(r, TranscriptResult) for t in r.tokens)
    assert len(tail) > 8
    noise = tuple(range(300, 340))  # 40 other text tokens before the tail
    a = ours.recognize([leg_segments[3]], contexts=[tail])[0]
    b = ours.recognize([leg_segments[3]], contexts=[noise + tail])[0]
    bare = ours.recognize([leg_segments[3]])[0]
    assert isinstance(a, TranscriptResult) and isinstance(b, TranscriptResult)
    assert isinstance(bare, TranscriptResult)
    assert a.tokens == b.tokens and a.avg_logprob == pytest.approx(b.avg_logprob, abs=1e-5)
    assert a.avg_logprob != bare.avg_logprob  # the tail itself is read


def test_echoes_finds_a_block_said_twice_or_a_copied_stretch_of_the_prompt() -> None:
    from pipeline.asr.decoding import echoes

    prompt = (10, 11, 12, 13, 14, 15, 16, 17)
    assert echoes((1, 2, 3, 4, 1, 2, 3, 4), ())  # "Okay. One moment. Okay. One moment."
    assert not echoes((1, 2, 3, 4, 5, 1, 2, 3), ())  # three tokens again: ordinary speech
    assert echoes((1, 12, 13, 14, 15, 16, 17, 2), prompt)  # six tokens of the prompt
    assert not echoes((1, 12, 13, 14, 15, 16, 2), prompt)


def test_a_row_that_copies_its_context_is_decoded_again_without_it(
    recognizer_fp32: Recognizer, leg_segments: list[SpeechSegment]
) -> None:
    """A segment whose context is its own text copies it (the failure the guard is for): it is decoded
    again in the same window without context, and that text stands, released once."""
    ours = _with_context(recognizer_fp32, 64, window_s=5.0)
    segment = leg_segments[2]
    bare = ours.recognize([segment])[0]
    assert isinstance(bare, TranscriptResult) and len(bare.tokens) >= 6
    told: list[int] = []
    again = ours.recognize([segment], contexts=[bare.tokens], on_result=lambda i, _: told.append(i))[0]
    assert isinstance(again, TranscriptResult)
    assert again.tokens == bare.tokens and again.avg_logprob == pytest.approx(bare.avg_logprob, abs=1e-5)
    assert told == [0]
