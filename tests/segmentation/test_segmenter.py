"""Segmentation of real recordings: coverage, silence, endpoints, cuts and chunking."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config.segmentation import SegmentationSettings
from pipeline.eval.speech_span import speech_span_ms
from pipeline.segmentation.segmenter import Segmenter, SpeechSegment, accept_many
from pipeline.segmentation.vad import WINDOW, VadStream


def _run(segmenter: Segmenter, audio: np.ndarray, chunk: int | None = None) -> list[SpeechSegment]:
    chunk = chunk or max(audio.size, 1)
    segments = []
    for i in range(0, audio.size, chunk):
        segments += segmenter.accept(audio[i : i + chunk])
    return segments + segmenter.flush()


def _covered_ms(segments: list[SpeechSegment], start: int, end: int) -> int:
    return sum(max(0, min(end, s.end_ms) - max(start, s.start_ms)) for s in segments)


def test_every_eval_utterance_is_covered_by_its_segments(eval_set, line_noise, settings, vad) -> None:
    for utterance in eval_set:
        audio = np.concatenate([line_noise[:16000], utterance.audio, line_noise[16000:32000]])
        segments = _run(Segmenter(settings, vad), audio)
        start, end = (1000 + t for t in speech_span_ms(utterance.audio, 16000))
        assert segments, utterance.id
        assert _covered_ms(segments, start, end) >= 0.95 * (end - start), utterance.id
        for segment in segments:
            assert segment.start_ms < end and segment.end_ms > start, f"{utterance.id}: segment off speech"
            assert segment.audio.dtype == np.float32
            np.testing.assert_array_equal(segment.audio, audio[segment.start_sample - segment.lead_samples : segment.end_sample])


def test_silence_and_line_noise_yield_no_segment(line_noise, settings, vad) -> None:
    assert _run(Segmenter(settings, vad), np.zeros(80000, np.float32), chunk=320) == []
    assert _run(Segmenter(settings, vad), line_noise, chunk=320) == []


def test_streaming_in_20_ms_chunks_gives_the_segments_of_one_chunk(call_01_legs, settings, vad) -> None:
    for leg in call_01_legs:
        whole = _run(Segmenter(settings, vad), leg)
        streamed = _run(Segmenter(settings, vad), leg, chunk=320)
        assert len(whole) >= 3
        assert [(s.start_sample, s.end_sample, s.reason) for s in streamed] == [
            (s.start_sample, s.end_sample, s.reason) for s in whole
        ]
        for a, b in zip(whole, streamed, strict=True):
            np.testing.assert_array_equal(a.audio, b.audio)


def test_sample_call_legs_find_each_placed_utterance(call_manifest, call_01_legs, settings, vad) -> None:
    utterances = call_manifest["calls"][0]["utterances"]
    for channel, leg in enumerate(call_01_legs):
        segments = _run(Segmenter(settings, vad), leg, chunk=320)
        placed = [u for u in utterances if u["channel"] == channel]
        assert len(segments) == len(placed)
        for u, segment in zip(placed, segments, strict=True):
            assert segment.start_ms <= u["speech_start_ms"] + 100
            assert segment.end_ms >= u["speech_end_ms"]
            assert segment.reason == "endpoint"


def test_endpoint_silence_decides_whether_a_pause_splits(eval_set, line_noise, vad) -> None:
    first, second = (next(u for u in eval_set if u.id == i).audio for i in ("cards/001", "cards/003"))
    pause = line_noise[:16000]  # 1 s, plus the recordings' own silence at their edges
    audio = np.concatenate([line_noise[:8000], first, pause, second, line_noise[:8000]])
    split = _run(Segmenter(SegmentationSettings(endpoint_silence_ms=500), vad), audio)
    joined = _run(Segmenter(SegmentationSettings(endpoint_silence_ms=2000), vad), audio)
    assert len(split) == 2 and split[0].reason == "endpoint"
    assert len(joined) == 1
    assert joined[0].start_ms == split[0].start_ms


def test_segment_closes_endpoint_silence_after_speech(eval_set, line_noise, settings, vad) -> None:
    utterance = next(u for u in eval_set if u.id == "goforward").audio
    segmenter = Segmenter(settings, vad)
    audio = np.concatenate([utterance, line_noise[:32000]])
    probs = vad.run([VadStream()], [audio])[0]
    last_speech_window = int(np.flatnonzero(probs >= settings.vad_threshold)[-1])
    closed_at = None
    for i in range(0, audio.size, 320):
        if segmenter.accept(audio[i : i + 320]):
            closed_at = (i + 320) // 16
            break
        if i // 16 > 1000:
            assert segmenter.in_speech == (segmenter.open_segment_audio() is not None)
    assert closed_at is not None
    silence_from = (last_speech_window + 1) * WINDOW // 16
    assert settings.endpoint_silence_ms <= closed_at - silence_from <= settings.endpoint_silence_ms + 64


def test_pre_roll_and_post_roll_surround_the_speech_windows(eval_set, line_noise, settings, vad) -> None:
    audio = np.concatenate([line_noise[:16000], next(u for u in eval_set if u.id == "cards/002").audio,
                            line_noise[:16000]])
    probs = vad.run([VadStream()], [audio])[0]
    speech = np.flatnonzero(probs >= settings.vad_threshold)
    (segment,) = _run(Segmenter(settings, vad), audio)
    assert segment.start_ms == speech[0] * WINDOW // 16 - settings.pre_roll_ms
    last_above_negative = speech[-1] + np.argmax(probs[speech[-1]:] < settings.vad_neg_threshold)
    assert segment.end_ms == last_above_negative * WINDOW // 16 + settings.post_roll_ms


def test_long_speech_is_cut_at_quiet_points_within_the_maximum(eval_set, vad) -> None:
    reading = np.concatenate([u.audio for u in eval_set if u.id.startswith("librivox/")])  # 24.7 s
    settings = SegmentationSettings(max_segment_ms=6000, endpoint_silence_ms=2000)
    segments = _run(Segmenter(settings, vad), reading, chunk=320)
    assert len(segments) >= 4
    assert all(s.duration_ms <= 6000 for s in segments)
    assert sum(s.reason == "max_length" for s in segments) >= 3
    probs = vad.run([VadStream()], [reading])[0]
    for before, after in zip(segments, segments[1:], strict=False):
        if before.reason == "max_length":
            assert after.start_sample == before.end_sample  # no audio lost at a cut
            # the cut is decided when the segment reaches the maximum, among the windows of its second half
            decided_at = -(-(before.start_sample + 6000 * 16) // WINDOW) * WINDOW
            searched = probs[(before.start_sample + decided_at) // 2 // WINDOW : decided_at // WINDOW]
            assert probs[before.end_sample // WINDOW] == searched.min()
    assert [s.index for s in segments] == list(range(len(segments)))


def test_min_speech_drops_short_segments(eval_set, line_noise, vad) -> None:
    short, long = (next(u for u in eval_set if u.id == i).audio for i in ("cards/001", "cards/005"))
    audio = np.concatenate([line_noise[:8000], short, line_noise[:24000], long, line_noise[:8000]])
    kept = _run(Segmenter(SegmentationSettings(min_speech_ms=1500), vad), audio)
    assert len(_run(Segmenter(SegmentationSettings(), vad), audio)) == 2
    assert len(kept) == 1 and kept[0].speech_ms >= 1500 and kept[0].start_ms > 2000


def test_accept_many_batches_legs_like_separate_segmenters(call_01_legs, settings, vad) -> None:
    alone = [_run(Segmenter(settings, vad), leg, chunk=320) for leg in call_01_legs]
    segmenters = [Segmenter(settings, vad) for _ in call_01_legs]
    together: list[list[SpeechSegment]] = [[] for _ in call_01_legs]
    n = max(leg.size for leg in call_01_legs)
    for i in range(0, n, 320):
        for k, closed in enumerate(accept_many(segmenters, [leg[i : i + 320] for leg in call_01_legs])):
            together[k] += closed
    for k, segmenter in enumerate(segmenters):
        together[k] += segmenter.flush()
    for a, b in zip(alone, together, strict=True):
        assert [(s.start_ms, s.end_ms) for s in a] == [(s.start_ms, s.end_ms) for s in b]


def test_accept_many_needs_one_shared_vad(settings, vad) -> None:
    from pipeline.segmentation.vad import SileroVad

    with pytest.raises(ValueError, match="share"):
        accept_many([Segmenter(settings, vad), Segmenter(settings, SileroVad())], [np.zeros(320)] * 2)


def test_provisional_end_is_the_endpoint_segment_it_becomes(call_01_legs, settings, vad) -> None:
    """Early decoding transcribes the provisional segment before its endpoint: every segment closed at
    its endpoint was provisional with the same samples first, and one whose speech resumed was not."""
    for leg in call_01_legs:
        segmenter = Segmenter(settings, vad)
        last: dict[tuple[int, int], np.ndarray] = {}
        closed: list[SpeechSegment] = []
        for i in range(0, leg.size, 320):
            for seg in segmenter.accept(leg[i : i + 320]):
                closed.append(seg)
                if seg.reason == "endpoint":
                    key = (seg.start_sample, seg.end_sample)
                    assert key in last, f"segment {key} closed without a provisional end"
                    np.testing.assert_array_equal(last[key], seg.audio)
            key_now = segmenter.provisional_end()
            if key_now is not None and key_now not in last:
                last[key_now] = segmenter.provisional_audio(*key_now)
        endpoint_keys = {(s.start_sample, s.end_sample) for s in closed if s.reason == "endpoint"}
        assert len(endpoint_keys) >= 3
        # Provisional ends that speech overtook (a pause shorter than the endpoint) closed nothing.
        assert set(last) >= endpoint_keys


def test_a_long_turn_ends_at_its_next_short_pause(eval_set, vad) -> None:
    """Past long_segment_ms, a pause of long_segment_endpoint_ms closes the segment; before it, only the
    usual endpoint does. A reading with its natural pauses: with the rule, more segments, each close at a
    pause (not a cut), and none ends at a pause before long_segment_ms of it has passed."""
    reading = np.concatenate([u.audio for u in eval_set if u.id.startswith("librivox/")])  # 24.7 s, no long pause
    base = SegmentationSettings(endpoint_silence_ms=600, long_segment_ms=0)
    whole = _run(Segmenter(base, vad), reading, chunk=320)
    short = base.model_copy(update={"long_segment_ms": 4000, "long_segment_endpoint_ms": 200})
    stretches = _run(Segmenter(short, vad), reading, chunk=320)
    assert len(stretches) > len(whole)
    assert {s.reason for s in stretches} <= {"endpoint", "flush"}
    probs = vad.run([VadStream()], [reading])[0]
    for before, after in zip(stretches, stretches[1:], strict=False):
        # the pause that closed it began after 4 s of the segment (its end is that pause plus the post-roll)
        pause_start = before.end_sample - short.post_roll_ms * 16
        assert pause_start - before.start_sample >= 4000 * 16
        assert after.start_sample >= before.end_sample  # no audio given twice
        quiet = probs[pause_start // WINDOW: pause_start // WINDOW + 200 * 16 // WINDOW]
        assert (quiet < short.vad_neg_threshold).all()  # closed on silence, not mid-word
    # streaming in 20 ms chunks and in one go decide the same cuts
    assert [(s.start_sample, s.end_sample) for s in _run(Segmenter(short, vad), reading)] == [
        (s.start_sample, s.end_sample) for s in stretches]
