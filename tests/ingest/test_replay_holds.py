"""Holds: a call on hold sends no frames at all; the end event still counts every frame of the call."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

pytestmark = pytest.mark.broker


def test_no_frame_of_either_leg_is_sent_inside_a_hold(kafka_settings, read_topic, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    stereo = (rng.standard_normal((8000 * 3, 2)) * 0.05).astype(np.float32)  # 3 s, 150 frames of 20 ms
    path = tmp_path / "held.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(codecs.float_to_pcm16(stereo.reshape(-1)).tobytes())
    options = ReplayOptions(frame_ms=20, encoding="mulaw")
    rec = load_recording(path, options)
    rec.holds_ms = [(1000, 2010)]  # frames 50..99 lie wholly inside; frame 100 (2000-2020) does not
    serde = Serde.from_settings()
    report = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, serde), kafka_settings.topic_audio,
                             kafka_settings.topic_call_events).run([rec], options)

    frames = [serde.decode(m.value(), AudioFrame) for m in read_topic(kafka_settings.bootstrap,
                                                                       kafka_settings.topic_audio, expected=200)]
    kept = [*range(50), *range(100, 150)]
    for leg in ("agent", "customer"):
        assert sorted(f.seq for f in frames if f.leg == leg) == kept
    assert report.frames_sent == 2 * len(kept)
    events = [serde.decode(m.value(), CallEvent) for m in read_topic(kafka_settings.bootstrap,
                                                                      kafka_settings.topic_call_events)]
    end = [e for e in events if e.event_type == "end"]
    # the call is still 150 frames long: the worker fills the hold with silence when frames resume
    assert len(end) == 1 and end[0].frame_counts == {"agent": 150, "customer": 150}
    # the hold's start and end go on the events topic, at their place on the call clock, between the
    # start and the end (a worker keeps the call open through it and measures it)
    assert [(e.event_type, e.offset_ms) for e in events] == [("start", -1), ("hold", 1000), ("resume", 2010),
                                                              ("end", -1)]
    assert {(e.tenant, e.queue) for e in events} == {(options.tenant, options.queue)}
    assert report.events_sent == 4
