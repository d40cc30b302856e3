"""Long digital silence (a hold's gap) is a boundary: the VAD is reset and the rest is skipped, not scored,
and taking it by its length (``skip_zeros``, ``silence_to_segmenter``) is exactly taking its zeros."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.config.segmentation import SegmentationSettings
from pipeline.segmentation.segmenter import Segmenter, Silence, SpeechSegment
from pipeline.segmentation.vad import WINDOW, SileroVad, VadStream

BOUNDARY_WINDOWS = 63  # the default gap_boundary_ms, 2000 ms, in 32 ms windows (rounded up)


def _spans(segments: list[SpeechSegment]) -> list[tuple[int, int, int, str]]:
    return [(s.start_sample, s.end_sample, s.speech_ms, s.reason) for s in segments]


def _same_state(a: Segmenter, b: Segmenter) -> None:
    assert a.in_speech == b.in_speech and a.samples_received == b.samples_received
    if not a.in_speech:
        sa, sb = a.snapshot(), b.snapshot()
        for name in ("vad_state", "vad_context", "vad_pending", "audio"):
            np.testing.assert_array_equal(getattr(sa, name), getattr(sb, name), err_msg=name)
        assert (sa.windows_done, sa.last_end, sa.emitted, sa.audio_start) == (
            sb.windows_done, sb.last_end, sb.emitted, sb.audio_start)
    assert a.vad_stream.zero_windows == b.vad_stream.zero_windows


@pytest.mark.parametrize("boundary_ms", [2000, 0])
def test_skipping_zeros_is_accepting_them(call_01_legs, vad: SileroVad, boundary_ms: int) -> None:
    """Wherever the silence starts (in speech, in a pause, mid-window) and however long it is."""
    leg = call_01_legs[0]
    settings = SegmentationSettings(gap_boundary_ms=boundary_ms)
    rng = np.random.default_rng(3)
    cuts = [int(c) for c in rng.integers(16000, leg.size - 16000 * 6, 6)]
    gaps = [100, 20_000, BOUNDARY_WINDOWS * WINDOW, 40_000 + 17, 16000 * 70]
    for cut, gap in zip(cuts * 2, gaps * 2, strict=False):
        skipped, made = Segmenter(settings, vad), Segmenter(settings, vad)
        closed = [skipped.accept(leg[:cut]), made.accept(leg[:cut])]
        closed[0] += skipped.take(Silence(gap))
        closed[1] += made.accept(np.zeros(gap, dtype=np.float32))
        _same_state(skipped, made)
        after = leg[cut:cut + 16000 * 5]
        closed[0] += skipped.accept(after) + skipped.flush()
        closed[1] += made.accept(after) + made.flush()
        assert _spans(closed[0]) == _spans(closed[1]), f"cut {cut}, gap {gap}"
        assert all(np.array_equal(a.audio, b.audio) for a, b in zip(*closed, strict=True))


def test_dormant_windows_are_not_scored_and_speech_after_them_is_scored_as_a_fresh_legs(
    call_01_legs, vad: SileroVad
) -> None:
    speech = call_01_legs[0][: 16000 * 4 // WINDOW * WINDOW]
    zeros = np.zeros(WINDOW * 200, dtype=np.float32)
    audio = np.concatenate([speech, zeros, speech])
    whole = vad.run([VadStream(BOUNDARY_WINDOWS)], [audio])[0]
    stream = VadStream(BOUNDARY_WINDOWS)
    chunked = np.concatenate([vad.run([stream], [audio[i:i + 320]])[0] for i in range(0, audio.size, 320)])
    np.testing.assert_array_equal(chunked, whole)  # dormancy depends on the samples, not their chunks
    first, silence, second = np.split(whole, [speech.size // WINDOW, (speech.size + zeros.size) // WINDOW])
    assert (silence[:BOUNDARY_WINDOWS] > 0).all() and (silence[BOUNDARY_WINDOWS:] == 0).all()
    np.testing.assert_array_equal(second, vad.run([VadStream()], [speech])[0])
    np.testing.assert_array_equal(first, second)
    # Without a boundary, every window of the silence is scored and the VAD goes on from its state.
    never = vad.run([VadStream()], [audio])[0]
    assert (never > 0).all() and not np.array_equal(never[-second.size:], second)


def test_a_snapshot_inside_digital_silence_restores_where_it_was(call_01_legs, vad: SileroVad) -> None:
    """Taken before the run is a boundary (its length is in the snapshot's audio) or after (the VAD's
    state is reset): the restored segmenter goes on exactly as the uninterrupted one."""
    settings = SegmentationSettings()
    leg = call_01_legs[0]
    cut = 16000 * 6
    silence = np.zeros(16000 * 3, dtype=np.float32)
    tail = leg[cut:cut + 16000 * 6]
    whole = Segmenter(settings, vad)
    reference = whole.accept(leg[:cut]) + whole.accept(silence) + whole.accept(tail) + whole.flush()
    restored_at = set()
    for at in range(320, silence.size, 320 * 7):
        first = Segmenter(settings, vad)
        closed = first.accept(leg[:cut])
        for i in range(0, at, 320):
            closed += first.accept(silence[i:i + 320])
        if first.in_speech:
            continue
        resumed = Segmenter(settings, vad)
        resumed.restore(first.snapshot())
        assert resumed.vad_stream.zero_windows == first.vad_stream.zero_windows or (
            first.vad_stream.dormant and resumed.vad_stream.dormant)
        closed += resumed.accept(silence[at:]) + resumed.accept(tail) + resumed.flush()
        assert _spans(closed) == _spans(reference), f"restored {at} samples into the silence"
        restored_at.add(first.vad_stream.dormant)
    assert restored_at == {False, True}


def _made(pieces: list[np.ndarray | Silence]) -> np.ndarray:
    return np.concatenate([np.zeros(p.samples, np.float32) if isinstance(p, Silence) else p for p in pieces])


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 44100])
def test_resampling_silence_by_its_length_gives_what_resampling_its_zeros_gives(rate: int) -> None:
    # An 8 kHz leg resampled before its VAD, as every other rate. The keypad detector is off: it holds a leg's
    # last 66-100 ms back until a gap lets them out, and here the resampler's output is compared piece by piece.
    settings = Settings(vad_sample_rate=16000, keypad_tones=False)
    signal = np.random.default_rng(rate).standard_normal(rate).astype(np.float32) * 0.1
    for gap in (rate // 50, rate * 2 + 7, rate * 5):
        skipped, made = LegFrontEnd(rate, "pcm16", settings), LegFrontEnd(rate, "pcm16", settings)
        before = [skipped.to_segmenter(signal), made.to_segmenter(signal)]
        pieces = skipped.silence_to_segmenter(gap)
        zeros = made.to_segmenter(np.zeros(gap, dtype=np.float32))
        if gap >= rate:  # all but the filter's tail of a long gap comes as a run given by its length
            assert sum(p.samples for p in pieces if isinstance(p, Silence)) > zeros.size - 16000 // 5
        after = [skipped.to_segmenter(signal), made.to_segmenter(signal)]
        np.testing.assert_array_equal(np.concatenate([before[0], _made(pieces), after[0]]),
                                      np.concatenate([before[1], zeros, after[1]]))
        (resampler, *_), (reference, *_) = skipped.snapshot(), made.snapshot()
        assert (resampler.samples_in, resampler.samples_out) == (reference.samples_in, reference.samples_out)
        np.testing.assert_array_equal(resampler.history, reference.history)
