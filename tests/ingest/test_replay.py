"""The telephony replay producer against the real broker."""

from __future__ import annotations

import wave
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError, load_audio
from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

pytestmark = pytest.mark.broker

AGENT = Path("/usr/share/pocketsphinx/test/data/cards/001.wav")
CUSTOMER = Path("/usr/share/sounds/alsa/Front_Center.wav")


@pytest.fixture
def stereo_call(tmp_path: Path) -> Path:
    """A stereo 8 kHz call from two real recordings: agent left, customer right (after 0.5 s)."""
    from pipeline.audio.resample import resample

    a = load_audio(AGENT)
    c = load_audio(CUSTOMER)
    agent = resample(a.mono(), a.sample_rate, 8000)
    customer = resample(c.mono(), c.sample_rate, 8000)
    n = max(len(agent), 4000 + len(customer)) + 123  # not a whole number of frames on purpose
    stereo = np.zeros((n, 2), dtype=np.float32)
    stereo[: len(agent), 0] = agent
    stereo[4000 : 4000 + len(customer), 1] = customer
    path = tmp_path / "call.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(codecs.float_to_pcm16(stereo.reshape(-1)).tobytes())
    return path


def test_stereo_file_yields_every_frame_of_both_legs_and_one_start_and_end(
    kafka_settings, stereo_call: Path, read_topic  # type: ignore[no-untyped-def]
) -> None:
    serde = Serde.from_settings()
    options = ReplayOptions(frame_ms=20, encoding="mulaw", calls=3)
    rec = load_recording(stereo_call, options)
    with wave.open(str(stereo_call)) as w:
        n_samples = w.getnframes()
    expected = -(-n_samples // 160)
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, serde),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    report = player.run([rec], options)
    assert len(report.call_ids) == 3 and len(set(report.call_ids)) == 3

    frames = read_topic(kafka_settings.bootstrap, kafka_settings.topic_audio)
    per_leg: Counter[tuple[str, str]] = Counter()
    seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for m in frames:
        f = serde.decode(m.value(), AudioFrame)
        per_leg[(f.call_id, f.leg)] += 1
        seqs[(f.call_id, f.leg)].append(f.seq)
        assert f.encoding == "mulaw" and f.sample_rate == 8000 and f.start_ms == f.seq * 20
    for call_id in report.call_ids:
        assert per_leg[(call_id, "agent")] == expected
        assert per_leg[(call_id, "customer")] == expected
    assert all(s == list(range(expected)) for s in seqs.values())
    assert report.frames_sent == 3 * 2 * expected

    events = [serde.decode(m.value(), CallEvent) for m in
              read_topic(kafka_settings.bootstrap, kafka_settings.topic_call_events)]
    kinds = Counter((e.call_id, e.event_type) for e in events)
    for call_id in report.call_ids:
        assert kinds[(call_id, "start")] == 1 and kinds[(call_id, "end")] == 1
    end = next(e for e in events if e.event_type == "end")
    assert end.frame_counts == {"agent": expected, "customer": expected}
    assert end.legs == ["agent", "customer"]


def test_a_failure_mid_replay_still_closes_every_started_call(kafka_settings, stereo_call, read_topic) -> None:  # type: ignore[no-untyped-def]
    serde = Serde.from_settings()
    options = ReplayOptions(calls=4)
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, serde),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    sent = 0

    def fail_after_some(n: int) -> None:
        nonlocal sent
        sent += n
        if sent > 100:
            raise RuntimeError("gateway lost")

    with pytest.raises(RuntimeError, match="gateway lost"):
        player.run([load_recording(stereo_call, options)], options, on_frames=fail_after_some)
    events = [serde.decode(m.value(), CallEvent) for m in
              read_topic(kafka_settings.bootstrap, kafka_settings.topic_call_events)]
    started = {e.call_id for e in events if e.event_type == "start"}
    closed = {e.call_id for e in events if e.event_type in ("end", "abort")}
    assert len(started) == 4
    assert started == closed
    assert any(e.event_type == "abort" and e.reason for e in events)


def test_unreadable_input_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00garbage")
    with pytest.raises(AudioFileError, match="broken.wav"):
        load_recording(bad, ReplayOptions())
