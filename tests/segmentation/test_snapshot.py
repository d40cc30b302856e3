"""A leg's audio path resumed from a snapshot goes on exactly as the uninterrupted one (call checkpoints)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import ResamplerSnapshot, StreamResampler, resample
from pipeline.config import Settings
from pipeline.segmentation.segmenter import SpeechSegment

CALLS_DIR = Path(__file__).resolve().parents[2] / "samples" / "calls"


@pytest.fixture(scope="module")
def mulaw_frames() -> list[bytes]:
    """The agent leg of call_01 as a gateway sends it: 8 kHz mu-law, 20 ms frames."""
    audio = load_audio(CALLS_DIR / "call_01.wav")
    leg = codecs.encode(resample(audio.samples[0], audio.sample_rate, 8000), "mulaw")
    return [leg[i:i + 160] for i in range(0, len(leg), 160)]


def _spans(segments: list[SpeechSegment]) -> list[tuple[int, int]]:
    return [(s.start_sample, s.end_sample) for s in segments]


@pytest.mark.slow
def test_resumed_front_end_closes_the_same_segments(mulaw_frames: list[bytes]) -> None:
    """Resumed at many quiet moments, the next segments are the uninterrupted leg's, bit for bit
    (a handover re-decodes them, and the store drops the repeat by segment id only if it is equal)."""
    settings = Settings()
    whole = LegFrontEnd(8000, "mulaw", settings)
    reference = [s for f in mulaw_frames for s in whole.accept(f)] + whole.finish()
    assert len(reference) >= 3, "the recording should hold several segments"

    first = LegFrontEnd(8000, "mulaw", settings)
    closed: list[SpeechSegment] = []
    resumed_at = 0
    for k, frame in enumerate(mulaw_frames):
        closed += first.accept(frame)
        if k % 9 or first.segmenter.in_speech:
            continue
        resumed = LegFrontEnd(8000, "mulaw", settings)
        resumed.restore(*first.snapshot())
        after: list[SpeechSegment] = []
        for later in mulaw_frames[k + 1:]:
            after += resumed.accept(later)
            if len(after) == 2:
                break
        else:
            after += resumed.finish()
        resumed_at += 1
        for got, want in zip(after, reference[len(closed):], strict=False):
            assert (got.index, got.start_sample, got.end_sample) == (want.index, want.start_sample,
                                                                      want.end_sample), f"resumed at frame {k}"
            assert np.array_equal(got.audio, want.audio), f"resumed at frame {k}"
    assert resumed_at >= 30


def test_snapshot_refused_inside_a_segment(mulaw_frames: list[bytes]) -> None:
    front_end = LegFrontEnd(8000, "mulaw", Settings())
    for frame in mulaw_frames:
        front_end.accept(frame)
        if front_end.segmenter.in_speech:
            break
    with pytest.raises(RuntimeError, match="between segments"):
        front_end.snapshot()


@pytest.mark.parametrize("rate", [8000, 11025, 16000])
def test_resampler_restored_matches_the_uninterrupted_stream(rate: int) -> None:
    x = np.random.default_rng(rate).standard_normal(rate * 5).astype(np.float32) * 0.1
    chunks = [x[i:i + rate // 50] for i in range(0, x.size, rate // 50)]
    whole = StreamResampler(rate, 16000)
    reference = np.concatenate([whole.process(c) for c in chunks] + [whole.flush()])
    for cut in (1, 2, 5, 9, 10, 77, 160, 249):
        head = StreamResampler(rate, 16000)
        out = [head.process(c) for c in chunks[:cut]]
        tail = StreamResampler.restored(rate, 16000, head.snapshot())
        out += [tail.process(c) for c in chunks[cut:]] + [tail.flush()]
        got = np.concatenate(out)
        assert got.size == reference.size
        # Bit for bit: a VAD probability moved by float rounding can move a segment boundary.
        assert np.array_equal(got, reference)
        assert tail.samples_out == reference.size


def test_resampler_restores_a_snapshot_whose_history_is_short() -> None:
    """A checkpoint written by an older callqa (soxr lagged its input) still restores: what its
    history lacks is taken as silence, and the output keeps its length and timing."""
    x = np.random.default_rng(5).standard_normal(8000).astype(np.float32) * 0.1
    whole = StreamResampler(8000, 16000)
    reference = np.concatenate([whole.process(x), whole.flush()])
    old = ResamplerSnapshot(samples_in=4000, samples_out=6340, history=x[3200:4000])  # 830 samples behind
    tail = StreamResampler.restored(8000, 16000, old)
    rest = np.concatenate([tail.process(x[4000:]), tail.flush()])
    assert rest.size == reference.size - 6340
    np.testing.assert_allclose(rest[400:], reference[6740:], atol=1e-6)  # once past the missing input
