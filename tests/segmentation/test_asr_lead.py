"""asr_lead_ms: the recogniser hears audio before a segment's pre-roll, the segment's times do not move, and
the lead never reaches into the leg's previous segment; at 16 and at 8 kHz, through snapshot and partials."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import StreamResampler, resample
from pipeline.config.segmentation import SegmentationSettings
from pipeline.segmentation.segmenter import Segmenter, SpeechSegment
from pipeline.segmentation.vad import SileroVad

from .conftest import CALLS_DIR

LEAD_MS = 200


def _run(segmenter: Segmenter, audio: np.ndarray, chunk: int) -> list[SpeechSegment]:
    segments = []
    for i in range(0, audio.size, chunk):
        segments += segmenter.accept(audio[i:i + chunk])
    return segments + segmenter.flush()


@pytest.fixture(scope="module")
def leg_8k() -> np.ndarray:
    audio = load_audio(CALLS_DIR / "call_01.wav")
    return codecs.decode(codecs.encode(resample(audio.samples[0], audio.sample_rate, 8000), "mulaw"), "mulaw")


def _wide(leg_8k: np.ndarray) -> np.ndarray:
    stream = StreamResampler(8000, 16000)
    return np.concatenate([stream.process(leg_8k), stream.flush()])


@pytest.mark.parametrize("rate", [16000, 8000])
def test_the_lead_is_heard_not_timed(leg_8k: np.ndarray, vad: SileroVad, rate: int) -> None:
    leg = leg_8k if rate == 8000 else _wide(leg_8k)
    wide = _wide(leg_8k)
    plain = _run(Segmenter(SegmentationSettings(), vad, input_rate=rate), leg, rate // 50)
    led = _run(Segmenter(SegmentationSettings(asr_lead_ms=LEAD_MS), vad, input_rate=rate), leg, rate // 50)
    assert len(plain) >= 3
    assert [(s.start_sample, s.end_sample, s.speech_ms, s.reason) for s in led] == \
        [(s.start_sample, s.end_sample, s.speech_ms, s.reason) for s in plain]
    previous_end = 0
    grown = 0
    for s in led:
        want_lead = min(LEAD_MS * 16, s.start_sample - previous_end)
        assert s.lead_samples == want_lead  # the lead stops at the previous segment's end
        assert s.audio.size == s.lead_samples + s.end_sample - s.start_sample
        np.testing.assert_array_equal(s.audio, wide[s.start_sample - s.lead_samples:s.end_sample])
        grown += s.lead_samples > 0
        previous_end = s.end_sample
    assert grown >= 2


def test_partials_early_decodes_and_a_restored_segmenter_hear_the_same_lead(leg_8k: np.ndarray,
                                                                           vad: SileroVad) -> None:
    settings = SegmentationSettings(asr_lead_ms=LEAD_MS)
    whole = _run(Segmenter(settings, vad, input_rate=8000), leg_8k, leg_8k.size)
    seg = Segmenter(settings, vad, input_rate=8000)
    got: list[SpeechSegment] = []
    provisional: dict[tuple[int, int], np.ndarray] = {}
    saw_open = False
    for i in range(0, leg_8k.size, 160):
        got += seg.accept(leg_8k[i:i + 160])
        if seg.in_speech:
            audio = seg.open_segment_audio()
            assert audio is not None and audio.size > seg.open_segment_lead
            saw_open = True
            key = seg.provisional_end()
            if key is not None:
                provisional[key] = seg.provisional_audio(*key)
        elif got and i % 8000 == 0:  # between segments: a checkpoint, restored into a new segmenter
            snap = seg.snapshot()
            seg = Segmenter(settings, vad, input_rate=8000)
            seg.restore(snap)
    got += seg.flush()
    assert saw_open
    assert [(s.start_sample, s.end_sample, s.lead_samples) for s in got] == \
        [(s.start_sample, s.end_sample, s.lead_samples) for s in whole]
    for s, w in zip(got, whole, strict=True):
        np.testing.assert_array_equal(s.audio, w.audio)
        if (s.start_sample, s.end_sample) in provisional:  # an early decode hears what the final would
            np.testing.assert_array_equal(provisional[(s.start_sample, s.end_sample)], s.audio)
    assert any((s.start_sample, s.end_sample) in provisional for s in got)
