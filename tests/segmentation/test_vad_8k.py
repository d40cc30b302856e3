"""Silero VAD at 8 kHz on a telephone leg's own samples (vad_sample_rate 8000): the segments do not depend
on chunking, their 16 kHz audio is the whole leg's upsampled stream bit for bit, long digital silence is
skipped as at 16 kHz, and a snapshot continues exactly; a leg at another rate keeps the 16 kHz VAD."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import StreamResampler, resample
from pipeline.config import Settings
from pipeline.config.segmentation import SegmentationSettings
from pipeline.segmentation.segmenter import Segmenter, Silence, SpeechSegment, accept_many
from pipeline.segmentation.vad import SileroVad, VadStream

from .conftest import CALLS_DIR

FRAME_8K = 160  # 20 ms


def _spans(segments: list[SpeechSegment]) -> list[tuple[int, int, int, int, str]]:
    return [(s.index, s.start_sample, s.end_sample, s.speech_ms, s.reason) for s in segments]


def _same(got: list[SpeechSegment], want: list[SpeechSegment], where: str = "") -> None:
    assert _spans(got) == _spans(want), where
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.audio, b.audio, err_msg=where)


def _run(segmenter: Segmenter, audio: np.ndarray, chunk: int) -> list[SpeechSegment]:
    segments = []
    for i in range(0, audio.size, chunk):
        segments += segmenter.accept(audio[i:i + chunk])
    return segments + segmenter.flush()


def _upsampled(audio_8k: np.ndarray) -> np.ndarray:
    stream = StreamResampler(8000, 16000)
    return np.concatenate([stream.process(audio_8k), stream.flush()])


@pytest.fixture(scope="module")
def legs_8k() -> list[np.ndarray]:
    """Both legs of call_01 as a gateway delivers them: 8 kHz, G.711 mu-law, decoded."""
    audio = load_audio(CALLS_DIR / "call_01.wav")
    return [codecs.decode(codecs.encode(resample(audio.samples[c], audio.sample_rate, 8000), "mulaw"), "mulaw")
            for c in range(2)]


def test_8k_segments_do_not_depend_on_chunking_and_are_the_upsampled_legs_audio(legs_8k, vad: SileroVad) -> None:
    settings = SegmentationSettings()
    for leg in legs_8k:
        whole = _run(Segmenter(settings, vad, input_rate=8000), leg, leg.size)
        assert len(whole) >= 3
        for chunk in (FRAME_8K, 1000, 8000 + 17):
            _same(_run(Segmenter(settings, vad, input_rate=8000), leg, chunk), whole, f"chunk {chunk}")
        wide = _upsampled(leg)
        for s in whole:  # what the 16 kHz path would have cut: the leg upsampled whole, bit for bit
            np.testing.assert_array_equal(s.audio, wide[s.start_sample - s.lead_samples:s.end_sample])


def test_front_end_scores_an_8k_leg_at_8k_and_other_rates_at_16k() -> None:
    eight = LegFrontEnd(8000, "mulaw", Settings(vad_sample_rate=8000))
    assert eight.segmenter.input_rate == 8000 and eight.segmenter.vad_stream.window == 256
    for rate in (16000, 11025, 48000):
        other = LegFrontEnd(rate, "pcm16", Settings(vad_sample_rate=8000))
        assert other.segmenter.input_rate == 16000 and other.segmenter.vad_stream.window == 512
    off = LegFrontEnd(8000, "mulaw", Settings(vad_sample_rate=16000))
    assert off.segmenter.input_rate == 16000 and off.segmenter.vad_stream.window == 512
    with pytest.raises(ValueError, match="8000 or 16000"):
        Settings(vad_sample_rate=11025)


def test_a_16k_leg_gives_the_same_segments_whatever_vad_sample_rate_says(legs_8k) -> None:
    leg = resample(legs_8k[0], 8000, 16000)
    got = []
    for rate in (8000, 16000):
        front_end = LegFrontEnd(16000, "pcm16", Settings(vad_sample_rate=rate))
        got.append([s for i in range(0, leg.size, 320) for s in front_end.accept_samples(leg[i:i + 320])]
                   + front_end.finish())
    _same(got[0], got[1])


def test_open_segment_audio_is_the_upsampled_leg_so_far(legs_8k, vad: SileroVad) -> None:
    """Partial transcripts and early decodes read the open segment at 16 kHz: at 8 kHz it is made as the
    segment grows, and it reaches as far as the 16 kHz path's would (what the VAD has been given)."""
    leg = legs_8k[0]
    wide = _upsampled(leg)
    segmenter = Segmenter(SegmentationSettings(), vad, input_rate=8000)
    opened = provisional = 0
    for i in range(0, leg.size, FRAME_8K):
        segmenter.accept(leg[i:i + FRAME_8K])
        assert segmenter.samples_received == 2 * max(0, i + FRAME_8K - 64)
        audio = segmenter.open_segment_audio()
        if audio is None:
            continue
        start = segmenter.open_segment_start_ms * 16 - segmenter.open_segment_lead  # the recogniser's lead too
        assert start + audio.size == segmenter.samples_received
        np.testing.assert_array_equal(audio, wide[start:start + audio.size])
        opened += 1
        key = segmenter.provisional_end()
        if key is not None:
            np.testing.assert_array_equal(segmenter.provisional_audio(*key), wide[start:key[1]])
            provisional += 1
    assert opened > 100 and provisional > 0


@pytest.mark.parametrize("boundary_ms", [2000, 0])
def test_skipping_zeros_at_8k_is_accepting_them(legs_8k, vad: SileroVad, boundary_ms: int) -> None:
    leg = legs_8k[0]
    settings = SegmentationSettings(gap_boundary_ms=boundary_ms)
    rng = np.random.default_rng(3)
    cuts = [int(c) for c in rng.integers(8000, leg.size - 8000 * 6, 4)]
    for cut, gap in zip(cuts * 2, [50, 10_000, 63 * 256, 20_000 + 17, 8000 * 70, 31, 64, 65], strict=False):
        skipped, made = Segmenter(settings, vad, input_rate=8000), Segmenter(settings, vad, input_rate=8000)
        closed = [skipped.accept(leg[:cut]), made.accept(leg[:cut])]
        closed[0] += skipped.take(Silence(gap))
        closed[1] += made.accept(np.zeros(gap, dtype=np.float32))
        assert skipped.samples_received == made.samples_received
        assert skipped.vad_stream.zero_windows == made.vad_stream.zero_windows
        after = leg[cut:cut + 8000 * 5]
        closed[0] += skipped.accept(after) + skipped.flush()
        closed[1] += made.accept(after) + made.flush()
        _same(closed[0], closed[1], f"cut {cut}, gap {gap}")


def test_an_8k_snapshot_restores_where_it_was(legs_8k, vad: SileroVad) -> None:
    """Between segments, in a pause and inside digital silence before and after it is a boundary: the
    restored segmenter closes the uninterrupted one's segments, bit for bit."""
    settings = SegmentationSettings()
    leg = np.concatenate([legs_8k[0][:8000 * 12], np.zeros(8000 * 3, np.float32), legs_8k[0][8000 * 12:8000 * 20]])
    reference = _run(Segmenter(settings, vad, input_rate=8000), leg, FRAME_8K)
    restored = dormant = 0
    for at in range(FRAME_8K * 3, leg.size, FRAME_8K * 23):
        first = Segmenter(settings, vad, input_rate=8000)
        closed = [s for i in range(0, at, FRAME_8K) for s in first.accept(leg[i:min(at, i + FRAME_8K)])]
        if first.in_speech:
            continue
        snap = first.snapshot()
        assert snap.input_rate == 8000 and snap.vad_context.size == 32 and snap.vad_pending.size < 256
        resumed = Segmenter(settings, vad, input_rate=8000)
        resumed.restore(snap)
        assert resumed.samples_received == first.samples_received
        assert resumed.vad_stream.zero_windows == first.vad_stream.zero_windows or (
            first.vad_stream.dormant and resumed.vad_stream.dormant)
        closed += _run(resumed, leg[at:], FRAME_8K)
        _same(closed, reference, f"restored at {at}")
        restored += 1
        dormant += first.vad_stream.dormant
    assert restored >= 20 and dormant >= 1


def test_front_end_snapshots_restore_at_the_vad_rate_they_were_taken_at(legs_8k) -> None:
    """A checkpoint of either kind (one from before 8 kHz VAD included) continues exactly on a worker set
    either way; a snapshot of no known VAD rate is refused."""
    frames = codecs.encode(legs_8k[1], "mulaw")
    frames_list = [frames[i:i + FRAME_8K] for i in range(0, len(frames), FRAME_8K)]
    for taken, restored_as in ((16000, 8000), (8000, 16000), (8000, 8000)):
        whole = LegFrontEnd(8000, "mulaw", Settings(vad_sample_rate=taken))
        reference = [s for f in frames_list for s in whole.accept(f)] + whole.finish()
        first = LegFrontEnd(8000, "mulaw", Settings(vad_sample_rate=taken))
        closed: list[SpeechSegment] = []
        for cut in range(len(frames_list)):
            closed += first.accept(frames_list[cut])
            if closed and not first.segmenter.in_speech:  # between segments, after the first one
                break
        resumed = LegFrontEnd(8000, "mulaw", Settings(vad_sample_rate=restored_as))
        resampler, segmenter, keypad = first.snapshot()
        resumed.restore(resampler, segmenter, keypad)
        assert resumed.segmenter.input_rate == (8000 if taken == 8000 else 16000)
        closed += [s for f in frames_list[cut + 1:] for s in resumed.accept(f)] + resumed.finish()
        _same(closed, reference, f"taken at {taken}, restored set to {restored_as}")
    _, snap, _ = LegFrontEnd(8000, "mulaw", Settings()).snapshot()
    with pytest.raises(ValueError, match="context"):
        LegFrontEnd(8000, "mulaw", Settings()).restore(resampler, type(snap)(
            snap.vad_state, np.zeros(48, np.float32), snap.vad_pending, 0, 0, 0, 0, snap.audio))
    with pytest.raises(ValueError, match="8000 Hz"):  # an 8 kHz segmenter's snapshot on a 16 kHz leg
        LegFrontEnd(16000, "pcm16", Settings()).restore(resampler, segmenter)


def test_batched_legs_at_both_rates_score_as_each_alone(legs_8k, vad: SileroVad) -> None:
    settings = SegmentationSettings()
    narrow = [legs_8k[0][:8000 * 15], legs_8k[1][:8000 * 12]]
    wide = [_upsampled(x) for x in narrow]
    inputs = [narrow[0], wide[0], narrow[1], wide[1]]
    rates = [8000, 16000, 8000, 16000]
    alone = [_run(Segmenter(settings, vad, input_rate=r), x, x.size) for r, x in zip(rates, inputs, strict=True)]
    together = [Segmenter(settings, vad, input_rate=r) for r in rates]
    closed: list[list[SpeechSegment]] = [[] for _ in inputs]
    for t in range(0, 15 * 50):  # 20 ms at a time, legs running out at different moments
        chunks = [x[t * (r // 50):(t + 1) * (r // 50)] for x, r in zip(inputs, rates, strict=True)]
        for k, got in enumerate(accept_many(together, chunks)):
            closed[k] += got
    for k, segmenter in enumerate(together):
        closed[k] += segmenter.flush()
        assert _spans(closed[k]) == _spans(alone[k])


def test_vad_at_8k_scores_speech_high_and_line_noise_low(legs_8k, vad: SileroVad) -> None:
    probs = vad.run([VadStream(sample_rate=8000)], [legs_8k[0]])[0]
    assert probs.size == legs_8k[0].size // 256
    assert np.median(probs) > 0.9  # the agent leg talks most of the time
    noise = np.random.default_rng(7).normal(0, 1e-3, 8000 * 5).astype(np.float32)  # -60 dBFS
    assert vad.run([VadStream(sample_rate=8000)], [noise])[0].max() < 0.1
    chunked = VadStream(sample_rate=8000)
    pieces = [vad.run([chunked], [legs_8k[0][i:i + FRAME_8K]])[0] for i in range(0, 8000 * 10, FRAME_8K)]
    np.testing.assert_array_equal(np.concatenate(pieces), probs[:np.concatenate(pieces).size])
