"""The telephony replay producer against the real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipeline.audio import codecs
from pipeline.audio.files import AudioFileError, load_audio
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
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


class RecordingProducer(ContractProducer):
    """The real producer, noting what was sent and each flush, in order."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, str]] = []

    def send(self, topic, key, message, on_failure=None) -> None:  # type: ignore[no-untyped-def]
        self.log.append(("end" if isinstance(message, CallEvent) and message.event_type == "end" else "msg", key))
        super().send(topic, key, message, on_failure)

    def flush(self, timeout_s: float = 60.0) -> None:
        super().flush(timeout_s)
        self.log.append(("flushed", ""))


def test_a_calls_end_event_is_sent_only_once_its_frames_are_on_the_broker(
        kafka_settings, stereo_call: Path) -> None:  # type: ignore[no-untyped-def]
    # Its frames and its end are on two topics: after a broker restart a producer's queues drain in any
    # order, and an end read first closed the call without its last frames.
    options = ReplayOptions(frame_ms=20, encoding="mulaw", calls=2)
    producer = RecordingProducer(kafka_settings.bootstrap, Serde.from_settings())
    TelephonyReplay(producer, kafka_settings.topic_audio, kafka_settings.topic_call_events).run(
        [load_recording(stereo_call, options)], options)
    ends = [i for i, (what, _) in enumerate(producer.log) if what == "end"]
    assert len(ends) == 2
    for i in ends:
        call = producer.log[i][1]
        last_frame = max(j for j, (what, key) in enumerate(producer.log[:i]) if what == "msg" and key == call)
        assert ("flushed", "") in producer.log[last_frame:i], producer.log[last_frame:i + 1]


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


def test_more_than_two_channels_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "conference.flac"
    soundfile.write(path, np.zeros((8000, 3), np.float32), 8000)
    with pytest.raises(AudioFileError, match=r"conference\.flac.*3 channels"):
        load_recording(path, ReplayOptions())


# ---- `callqa replay` itself, on the formats recorders write ------------------------------------------
def _replay_cli(settings, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "CALLQA_BOOTSTRAP_SERVERS": settings.bootstrap, "COLUMNS": "400"}
    env.update({f"CALLQA_{name.upper()}": value for name, value in settings.model_dump().items()
                if name.startswith("topic_")})
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "replay", "--fast", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def _leg_audio(frames: list[AudioFrame], call_id: str, leg: str) -> np.ndarray:
    mine = sorted((f for f in frames if f.call_id == call_id and f.leg == leg), key=lambda f: f.seq)
    assert [f.seq for f in mine] == list(range(len(mine)))
    return codecs.decode(b"".join(f.payload for f in mine), "mulaw")


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)
    return float(np.dot(a[:n], b[:n]) / np.sqrt(np.dot(a[:n], a[:n]) * np.dot(b[:n], b[:n])))


def test_cli_replays_a_mulaw_wav_and_a_44k_flac_with_both_legs(
    kafka_settings, stereo_call: Path, read_topic, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    from pipeline.audio.resample import resample

    legs_8k = load_audio(stereo_call).samples  # [2, n] at 8 kHz: agent left, customer right
    ulaw = tmp_path / "recorder.wav"
    soundfile.write(ulaw, legs_8k.T, 8000, subtype="ULAW")
    flac = tmp_path / "export.flac"
    soundfile.write(flac, resample(legs_8k, 8000, 44100).T, 44100, subtype="PCM_24")

    result = _replay_cli(kafka_settings, str(ulaw), str(flac))
    assert result.returncode == 0, result.stderr
    serde = Serde.from_settings()
    events = [serde.decode(m.value(), CallEvent) for m in
              read_topic(kafka_settings.bootstrap, kafka_settings.topic_call_events, expected=4)]
    ends = {e.call_id: e for e in events if e.event_type == "end"}
    assert len(ends) == 2 and {e.call_id for e in events if e.event_type == "start"} == set(ends)
    total = sum(sum(e.frame_counts.values()) for e in ends.values())
    frames = [serde.decode(m.value(), AudioFrame) for m in
              read_topic(kafka_settings.bootstrap, kafka_settings.topic_audio, expected=total)]
    assert len(frames) == total
    # Messages of CALLQA_AUDIO_MESSAGE_MS (the replay command's default), the last of a leg short.
    message_bytes = 8 * Settings().audio_message_ms
    expected_frames = -(-legs_8k.shape[1] // message_bytes)
    assert {len(f.payload) for f in frames if f.seq < min(e.frame_counts["agent"] for e in ends.values()) - 1} \
        == {message_bytes}
    for call_id in sorted(ends):  # call ids follow the order of the files: recorder.wav, then export.flac
        assert ends[call_id].legs == ["agent", "customer"]
        assert abs(ends[call_id].frame_counts["agent"] - expected_frames) <= 1
        agent, customer = _leg_audio(frames, call_id, "agent"), _leg_audio(frames, call_id, "customer")
        assert _correlation(agent, legs_8k[0]) > 0.95 and _correlation(customer, legs_8k[1]) > 0.95
        assert abs(_correlation(agent, legs_8k[1])) < 0.3  # left stays the agent's leg


def test_cli_replay_sends_nothing_when_a_file_is_unreadable(
    kafka_settings, stereo_call: Path, read_topic, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    notes = tmp_path / "notes.wav"
    notes.write_text("customer called about a claim\n" * 20)
    result = _replay_cli(kafka_settings, str(stereo_call), str(notes), str(tmp_path / "gone.mp3"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert "notes.wav" in lines[0] and "not a recognised audio format" in lines[0]
    assert "gone.mp3" in lines[1] and "no such file" in lines[1]
    assert lines[2] == "2 of 3 files unreadable: nothing replayed"
    assert read_topic(kafka_settings.bootstrap, kafka_settings.topic_call_events, idle_s=2.0) == []
    assert read_topic(kafka_settings.bootstrap, kafka_settings.topic_audio, idle_s=2.0) == []
