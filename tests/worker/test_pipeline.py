"""The whole streaming pipeline: real broker, real worker process, real embedded ClickHouse."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.asr.engine import Engine
from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, CallEvent, DeadLetter, Serde, TranscriptSegment
from pipeline.contracts.messages import CallQA
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "calls"
OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20)
SEGMENTS_SQL = (
    "SELECT call_id, leg, start_ms, end_ms, text, segment_id FROM segments FINAL "
    "WHERE has(splitByChar(',', {ids:String}), call_id) ORDER BY call_id, leg, start_ms"
)


@pytest.fixture(scope="module")
def recordings() -> list[CallRecording]:
    return [load_recording(p, OPTIONS) for p in sorted(SAMPLES.glob("*.wav"))]


@pytest.fixture(scope="module")
def offline(recordings: list[CallRecording], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    """`callqa transcribe`'s engine path on exactly the μ-law audio the replay sends, per recording and leg."""
    engine = Engine.load()
    folder = tmp_path_factory.mktemp("ulaw")
    out: dict[str, list[tuple]] = {}  # type: ignore[type-arg]
    for rec in recordings:
        rows = []
        for leg, payload in rec.encoded.items():
            path = folder / f"{Path(rec.source).stem}-{leg}.ulaw"
            path.write_bytes(payload)
            rows += [(leg, r.start_ms, r.end_ms, r.text.strip()) for r in engine.transcribe_file(path)]
        out[rec.source] = sorted(rows)
    return out


def long_turns(duration_ms: int) -> CallRecording:
    """The first ``duration_ms`` of the library's long complaint, whose opening turns last 3-10 s."""
    whole = load_recording(LIBRARY_DIR / "23_long_complaint.wav", OPTIONS)
    samples = whole.sample_rate * duration_ms // 1000
    call = CallRecording(source=f"{whole.source}[:{duration_ms} ms]", sample_rate=whole.sample_rate,
                         legs={leg: audio[:samples] for leg, audio in whole.legs.items()})
    call.encode(OPTIONS.encoding)
    return call


def replay(settings: Any, recordings: list[CallRecording], calls: int = 0, realtime: bool = False) -> list[str]:
    player = TelephonyReplay(ContractProducer(settings.bootstrap, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)
    report = player.run(recordings, ReplayOptions(encoding="mulaw", calls=calls, realtime=realtime))
    return report.call_ids


def by_call(rows: list[dict[str, Any]]) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    out: dict[str, list[tuple]] = {}  # type: ignore[type-arg]
    for r in rows:
        out.setdefault(r["call_id"], []).append((r["leg"], r["start_ms"], r["end_ms"], r["text"]))
    return {k: sorted(v) for k, v in out.items()}


def test_streamed_calls_equal_offline_transcription_segment_for_segment(
    kafka_settings, start_worker, recordings, offline  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker()
    call_ids = replay(kafka_settings, recordings)
    rows = worker.wait_for_calls(call_ids)
    assert {r["end_reason"] for r in rows} == {"end"}
    stored = by_call(worker.query(SEGMENTS_SQL, ids=",".join(call_ids)))
    for i, call_id in enumerate(call_ids):
        expected = offline[recordings[i].source]
        assert len(expected) >= 5
        assert stored[call_id] == expected
    # every segment once, with the id derived from call/leg/start
    ids = worker.query("SELECT segment_id, count() AS n FROM segments FINAL WHERE has(splitByChar(',', {ids:String}),"
                       " call_id) GROUP BY segment_id HAVING n > 1", ids=",".join(call_ids))
    assert ids == []
    qa = worker.query("SELECT call_id, score_pct FROM call_qa FINAL WHERE has(splitByChar(',', {ids:String}), call_id)",
                      ids=",".join(call_ids))
    assert len(qa) == len(call_ids)
    latency = worker.query("SELECT count() AS n, min(end_to_end_ms) AS lo FROM latency FINAL "
                           "WHERE has(splitByChar(',', {ids:String}), call_id)", ids=",".join(call_ids))
    assert latency[0]["n"] == sum(len(v) for v in stored.values())
    assert latency[0]["lo"] >= 0


def test_reordered_duplicated_and_missing_frames_and_a_call_without_end(
    kafka_settings, start_worker, recordings, offline, read_topic  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker(call_inactivity_timeout_s="3", reorder_window_ms="200")
    serde = Serde.from_settings()
    producer = ContractProducer(kafka_settings.bootstrap, serde)
    rec = recordings[0]
    call_id = f"messy-{time.time_ns()}"
    rng = random.Random(7)
    producer.send(kafka_settings.topic_call_events, call_id, CallEvent(call_id, "start", legs=list(rec.legs)))
    frames = []
    for leg, payload in rec.encoded.items():
        for seq in range(-(-len(payload) // 160)):
            frames.append(AudioFrame(call_id, leg, seq, seq * 20, 8000, "mulaw", payload[seq * 160:(seq + 1) * 160]))  # type: ignore[arg-type]
    # shuffle within windows of 4 frames (jitter), duplicate ~2 %, drop 3 isolated frames
    for i in range(0, len(frames) - 4, 4):
        chunk = frames[i:i + 4]
        rng.shuffle(chunk)
        frames[i:i + 4] = chunk
    dropped = {frames[500].seq, frames[1200].seq, frames[1700].seq}
    sent_dups = 0
    for f in frames:
        if f.seq in dropped and f.leg == frames[500].leg:
            continue
        producer.send(kafka_settings.topic_audio, call_id, f)
        if rng.random() < 0.02:
            producer.send(kafka_settings.topic_audio, call_id, f)
            sent_dups += 1
    producer.send_raw(kafka_settings.topic_audio, call_id.encode(), b"\x00\x00\x00\x00\x01garbage")
    producer.flush()  # no end event: the worker must close the call by itself

    rows = worker.wait_for_calls([call_id], timeout_s=120)
    assert rows[0]["end_reason"] == "timeout"
    assert worker.metric("callqa_frames_dropped_total", reason="duplicate") == sent_dups
    assert worker.metric("callqa_gap_frames_total") >= 3
    assert worker.metric("callqa_dead_letters_total") == 1
    stored = by_call(worker.query(SEGMENTS_SQL, ids=call_id))[call_id]
    expected = offline[rec.source]
    # three missing 20 ms frames barely change the audio: the same segments come out
    assert [(leg, start) for leg, start, _, _ in stored] == [(leg, start) for leg, start, _, _ in expected]
    letters = [serde.decode_any(m.value()) for m in read_topic(kafka_settings.bootstrap,
                                                               kafka_settings.topic_dead_letters)]
    assert len(letters) == 1 and isinstance(letters[0], DeadLetter)
    # a reference to the bad message, not its bytes (tests/worker/test_no_pii_at_rest.py has the rest)
    assert (letters[0].original_topic, letters[0].call_id) == (kafka_settings.topic_audio, call_id)
    assert letters[0].raw is None and kafka_settings.topic_audio in letters[0].reason


def test_kill_9_mid_call_then_restart_stores_every_segment_exactly_once(
    kafka_settings, start_worker, recordings, offline, read_topic  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker()
    import threading

    ids: list[str] = []
    player = threading.Thread(target=lambda: ids.extend(replay(kafka_settings, recordings, realtime=True)))
    player.start()
    # Mid-call: killed once some segments are stored (9 s into the calls on an idle machine; on a 2-core one
    # busy with the rest of the suite the first store came later, so a fixed sleep killed it before any).
    deadline = time.monotonic() + 120
    while (before := worker.query("SELECT count() AS n FROM segments")[0]["n"]) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    ended_before = worker.query("SELECT count() AS n FROM calls")[0]["n"]
    worker.kill9()
    player.join()
    worker.start()  # same consumer group, same store: resumes from the committed offsets
    worker.wait_for_calls(ids)
    stored = by_call(worker.query(SEGMENTS_SQL, ids=",".join(ids)))
    for i, call_id in enumerate(ids):
        assert stored[call_id] == offline[recordings[i].source]
    raw = worker.query("SELECT count() AS n FROM segments")[0]["n"]
    assert before > 0 and ended_before < len(ids), (before, ended_before)  # the crash really happened mid-stream
    assert raw >= sum(len(v) for v in stored.values())
    # Exactly once for a read_committed consumer of the topics: each final and each call's QA result once,
    # though the restarted worker decoded again what came after the dead one's last checkpoints.
    serde = Serde.from_settings()
    finals = Counter(m.segment_id for m in (serde.decode_any(r.value()) for r in read_topic(
        kafka_settings.bootstrap, kafka_settings.topic_transcripts)) if isinstance(m, TranscriptSegment)
        and m.is_final and m.call_id in ids)
    assert sum(finals.values()) == sum(len(v) for v in stored.values())
    assert [s for s, n in finals.items() if n > 1] == []
    qa = Counter(m.call_id for m in (serde.decode_any(r.value()) for r in read_topic(
        kafka_settings.bootstrap, kafka_settings.topic_qa)) if isinstance(m, CallQA) and m.call_id in ids)
    assert qa == dict.fromkeys(ids, 1)


def test_overload_holds_the_inflight_bound_and_the_lag_drains(
    kafka_settings, start_worker, recordings  # type: ignore[no-untyped-def]
) -> None:
    limit_mb = 1
    worker = start_worker(max_inflight_audio_mb=str(limit_mb), stream_buffer_maxsize="64", max_poll_records="50")
    ids = replay(kafka_settings, recordings, calls=6)  # 2 minutes of audio at once
    worker.wait_for_calls(ids, timeout_s=400)
    largest_segment = 15 * 16000 * 4
    assert 0 < worker.metric("callqa_inflight_audio_peak_bytes") <= limit_mb * 1024 * 1024 + largest_segment
    deadline = time.monotonic() + 30
    while worker.metric("callqa_consumer_lag") > 0 and time.monotonic() < deadline:
        time.sleep(1)
    assert worker.metric("callqa_consumer_lag") == 0


def test_partials_precede_finals_and_readers_see_only_finals(
    kafka_settings, start_worker, recordings, read_topic  # type: ignore[no-untyped-def]
) -> None:
    # A preview that waits over preview_max_wait_ms for a decoding thread is dropped; on a 2-core machine
    # shared with the rest of the suite that wait is the machine's, not the worker's: 0 never drops one.
    worker = start_worker(partial_interval_ms="1000", preview_max_wait_ms="0")
    # A partial still decoding when its segment closes is superseded by the final, rightly: with the
    # samples' 3 s turns a loaded CI machine superseded every one. Turns of 6-10 s leave it seconds.
    ids = replay(kafka_settings, [long_turns(30_000)], realtime=True)
    worker.wait_for_calls(ids)
    # The topic keeps every message; the table's background merges may already have folded partials away.
    serde = Serde.from_settings()
    messages = [serde.decode_any(m.value()) for m in read_topic(kafka_settings.bootstrap, kafka_settings.topic_transcripts)]
    segments = [m for m in messages if isinstance(m, TranscriptSegment) and m.call_id == ids[0]]
    partial_ids = {m.segment_id for m in segments if not m.is_final}
    final_ids = {m.segment_id for m in segments if m.is_final}
    outcomes = {o: worker.metric("callqa_partials_total", outcome=o)
                for o in ("published", "superseded", "skipped", "dropped", "failed")}
    assert partial_ids, f"no partial on the topic; the worker's partial outcomes: {outcomes}"
    assert partial_ids <= final_ids  # a partial carries its final's id
    deduped = worker.query("SELECT segment_id, is_final FROM segments FINAL WHERE call_id = {c:String}", c=ids[0])
    assert all(r["is_final"] for r in deduped) and {r["segment_id"] for r in deduped} == final_ids
    assert worker.metric("callqa_partial_delay_seconds_count") >= 1
    # Every partial the worker counts as published is on the topic, and none was dropped as stale.
    assert worker.metric("callqa_partials_total", outcome="published") == len(
        [m for m in segments if not m.is_final])
    assert worker.metric("callqa_partials_total", outcome="dropped") == 0


def test_hot_model_reload_takes_a_higher_signed_version_and_refuses_equal_or_unsigned_ones(
    kafka_settings, start_worker, recordings, offline, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    import shutil
    import threading
    from dataclasses import replace

    from pipeline.asr.manifest import Manifest, latest_model_folder
    from pipeline.asr.signing import (
        SIGNATURE_FILE,
        generate_key,
        load_private_key,
        public_key_text,
        sign_model,
    )
    from pipeline.config import get_settings

    source = latest_model_folder(Path(get_settings().models_dir), "tiny.en")
    models = tmp_path / "models"
    public = generate_key(tmp_path / "models.key")
    (tmp_path / "models.pub").write_text(public_key_text(public) + "\n")
    key = load_private_key(tmp_path / "models.key")

    def place(folder_name: str, manifest_version: int, signed: bool = True) -> Path:
        # Prepared aside and renamed into place, as `callqa models build` does: the watcher must never
        # see a half-written version.
        staging = tmp_path / f"staging-{folder_name}"
        shutil.copytree(source, staging)
        (staging / SIGNATURE_FILE).unlink(missing_ok=True)  # the real build may carry another key's
        replace(Manifest.read(staging), version=manifest_version).write(staging)
        if signed:
            sign_model(staging, key)
        (models / "tiny.en").mkdir(parents=True, exist_ok=True)
        return staging.rename(models / "tiny.en" / folder_name)

    def wait_for(metric: str, value: float, **labels: str) -> None:
        deadline = time.monotonic() + 30
        while worker.metric(metric, **labels) != value and time.monotonic() < deadline:
            time.sleep(0.5)
        assert worker.metric(metric, **labels) == value

    place("1", 1)
    worker = start_worker(models_dir=str(models), model_watch_interval_s="1",
                          model_public_key=str(tmp_path / "models.pub"))
    assert worker.metric("callqa_model_version") == 1
    ids: list[str] = []
    player = threading.Thread(target=lambda: ids.extend(replay(kafka_settings, recordings[:1], realtime=True)))
    player.start()
    place("2", 1)  # claims to be version 1 again: refused
    wait_for("callqa_model_reloads_refused_total", 1, reason="version")
    unsigned = place("3", 3, signed=False)  # built, `callqa models sign` not run yet: refused until it is
    wait_for("callqa_model_reloads_refused_total", 1, reason="signature")
    assert worker.metric("callqa_model_version") == 1
    sign_model(unsigned, key)
    wait_for("callqa_model_version", 3)
    player.join()
    worker.wait_for_calls(ids)  # the call running across the swap lost nothing
    rows = worker.query("SELECT leg, start_ms, end_ms, text, model_version FROM segments FINAL "
                        "WHERE call_id = {c:String} ORDER BY leg, start_ms", c=ids[0])
    assert sorted((r["leg"], r["start_ms"], r["end_ms"], r["text"]) for r in rows) == offline[recordings[0].source]
    assert {r["model_version"] for r in rows} <= {1, 3}
    after = replay(kafka_settings, recordings[:1])
    worker.wait_for_calls(after)
    versions = worker.query("SELECT DISTINCT model_version AS v FROM segments FINAL WHERE call_id = {c:String}",
                            c=after[0])
    assert versions == [{"v": 3}]
    log = worker.log_path.read_text()
    assert log.count("model reload refused") == 2  # each refused version said once, not at every look
    assert f"{unsigned}: refused: missing signature" in log


def _decoding_children(pid: int) -> list[int]:
    """Process ids of ``pid``'s multiprocessing children that decode (not its resource tracker)."""
    def read(path: Path) -> bytes:  # a thread or a child may end between the listing and the read
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b""

    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in read(task / "children").split()
            if b"spawn_main" in read(Path(f"/proc/{child.decode()}/cmdline"))]


def test_the_default_on_two_cores_decodes_in_two_child_processes_with_the_offline_text(
    kafka_settings, start_worker, recordings, offline  # type: ignore[no-untyped-def]
) -> None:
    """CALLQA_INFERENCE_PROCESSES's default (-1, auto), which the rest of the suite sets to 0 (conftest): on
    2+ cores a worker decodes in two child processes, and stores what offline transcription gives."""
    import os

    assert len(os.sched_getaffinity(0)) >= 2, "this test needs the 2 cores the project's machines have"
    worker = start_worker(inference_processes="-1")
    assert worker.proc is not None and len(_decoding_children(worker.proc.pid)) == 2
    call_ids = replay(kafka_settings, recordings[:1])
    worker.wait_for_calls(call_ids)
    stored = by_call(worker.query(SEGMENTS_SQL, ids=",".join(call_ids)))
    assert stored[call_ids[0]] == offline[recordings[0].source]
