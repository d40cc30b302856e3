"""What a call survives: a worker killed with -9 under load, a kill near the end of a long call, and a
hold longer than the inactivity timeout (no frames, announced by hold and resume events).

Real broker, real worker processes, real embedded stores. The hold takes its length of wall clock by
nature, so its call starts first, on topics and a worker of its own (``paused_call``, module scope), and
is checked by the last test of the module, once the other tests have used the wait.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.bench import probes
from pipeline.bench.stores import GroupStores
from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.groups import committed_offsets
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker.checkpoint_cipher import MAGIC
from tests.conftest import drop_topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "calls"
OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20)
RATE = 8000
LEG_AUDIO = "callqa_leg_audio_seconds_total"


def replay_in_background(settings: Settings, recordings: list[CallRecording], realtime: bool, prefix: str,
                         live_from_s: float | None = None,
                         on_live: Callable[[], None] | None = None) -> tuple[threading.Thread, list[str]]:
    """Replay on a daemon thread (a realtime replay must not hold up the interpreter's exit);
    the call ids are in the list once the thread is done. ``live_from_s``/``on_live``: TelephonyReplay.run's."""
    player = TelephonyReplay(ContractProducer(settings.bootstrap, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)
    options = ReplayOptions(encoding="mulaw", frame_ms=20, realtime=realtime, call_id_prefix=prefix)
    call_ids: list[str] = []

    def run() -> None:
        call_ids.extend(player.run(recordings, options, live_from_s=live_from_s, on_live=on_live).call_ids)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, call_ids


def stitched(name: str, parts: list[np.ndarray | int], holds_ms: list[tuple[int, int]] | None = None) -> CallRecording:
    """One stereo call made of recordings' legs and silences (an int: that many ms of silence)."""
    legs: dict[str, list[np.ndarray]] = {"agent": [], "customer": []}
    for part in parts:
        for i, leg in enumerate(legs.values()):
            leg.append(np.zeros(part * RATE // 1000, np.float32) if isinstance(part, int) else part[i])
    rec = CallRecording(source=name, legs={k: np.concatenate(v) for k, v in legs.items()}, sample_rate=RATE,
                        holds_ms=holds_ms or [])
    rec.encode("mulaw")
    return rec


def stereo(path: Path) -> np.ndarray:
    """Both legs of a recording, cut to whole 20 ms frames (so the parts after it stay frame-aligned)."""
    rec = load_recording(path, OPTIONS)
    n = min(len(x) for x in rec.legs.values()) // 160 * 160
    return np.stack([rec.legs["agent"][:n], rec.legs["customer"][:n]])


def wait_for(what: str, check: Any, timeout_s: float, worker: WorkerProcess | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except OSError:  # the worker's web server did not answer in time (a busy moment): ask again
            value = None
        if value:
            return value
        if worker is not None and not worker.alive():
            raise RuntimeError(f"worker died while waiting for {what}: {worker.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.5)


def read_metric(worker: WorkerProcess, name: str, **labels: str) -> float:
    """``worker.metric``, asked again while the worker's web server is too busy to answer."""
    value: float = wait_for(f"{name} from {worker.log_path.name}", lambda: [worker.metric(name, **labels)],
                            timeout_s=60, worker=worker)[0]
    return value


# ---- the paused call (started first, checked last) ----------------------------------------------
# The hold outlasts the worker's inactivity timeout, so a worker that judged inactivity during a hold would
# close the call (end_reason "timeout") and drop its second half. (A hold may also outlast twice the
# timeout, past which a jump without one is refused as a corrupt seq: tests/worker/test_stage_intake.py.)
INACTIVITY_TIMEOUT_S = 30
HOLD_MS = 50_000


@dataclass
class PausedCall:
    worker: WorkerProcess
    replay: threading.Thread
    call_ids: list[str]
    hold_start_ms: int
    hold_end_ms: int


@pytest.fixture(scope="module", autouse=True)
def paused_call(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PausedCall]:
    """A call on hold for HOLD_MS in the middle (no frames; then they resume, then the end event), replayed in
    real time to a worker whose inactivity timeout is shorter than the hold, on topics of its own."""
    prefix = f"test.t{uuid.uuid4().hex[:12]}"
    settings = Settings(
        bootstrap_servers=broker, topic_audio=f"{prefix}.audio", topic_call_events=f"{prefix}.events",
        topic_transcripts=f"{prefix}.transcripts", topic_latency=f"{prefix}.latency", topic_qa=f"{prefix}.qa",
        topic_dead_letters=f"{prefix}.dlq", topic_checkpoints=f"{prefix}.checkpoints", topic_live_calls=f"{prefix}.live",
        worker_id=f"{prefix}.worker",
    )
    ensure_topics(settings)
    folder = tmp_path_factory.mktemp("paused")
    port = free_port()
    worker = WorkerProcess(worker_env({
        "bootstrap_servers": settings.bootstrap, "topic_audio": settings.topic_audio,
        "topic_call_events": settings.topic_call_events, "topic_transcripts": settings.topic_transcripts,
        "topic_latency": settings.topic_latency, "topic_qa": settings.topic_qa,
        "topic_dead_letters": settings.topic_dead_letters, "topic_checkpoints": settings.topic_checkpoints,
        "worker_id": settings.worker_id, "clickhouse_url": f"chdb://{(folder / 'chdb').resolve()}",
        "commit_interval_s": "1.0", "model_watch_interval_s": "0", "web_port": str(port),
        "call_inactivity_timeout_s": str(INACTIVITY_TIMEOUT_S),
    }), port, folder / "worker.log")
    worker.start()
    before = stereo(SAMPLES / "call_01.wav")
    after = stereo(SAMPLES / "call_02.wav")
    hold_start = before.shape[1] * 1000 // RATE
    rec = stitched("paused", [before, HOLD_MS, after], holds_ms=[(hold_start, hold_start + HOLD_MS)])
    replay, call_ids = replay_in_background(settings, [rec], realtime=True, prefix="paused")
    try:
        yield PausedCall(worker, replay, call_ids, hold_start, hold_start + HOLD_MS)
    finally:
        worker.stop()
        drop_topics(broker, prefix)


# ---- kill -9 under load --------------------------------------------------------------------------
def test_kill_9_under_load_after_commits_and_a_new_worker_finishes_every_call(
    kafka_settings: Settings, start_group_worker: Any, read_topic: Any
) -> None:
    # Short calls end (and release their offsets) while the long ones still run when the kill comes.
    paths = sorted(SAMPLES.glob("call_0*.wav")) + [
        LIBRARY_DIR / f"{n}.wav" for n in ("01_address_change", "05_rude_agent", "07_escalation_manager")]
    recordings = [load_recording(p, OPTIONS) for p in paths]
    # Checkpoints sealed at rest: the new worker resumes the calls from records it can only read with the key.
    key = os.urandom(32).hex()
    first = start_group_worker(checkpoint_key=key)
    replay, call_ids = replay_in_background(kafka_settings, recordings, realtime=True, prefix="kill")

    def advanced() -> dict[int, int]:
        if first.metric("callqa_segments_total", kind="final") < 3:
            return {}  # the kill should cost real work: transcribed segments
        offsets = committed_offsets(kafka_settings, first.group, kafka_settings.topic_audio)
        return {p: o for p, o in offsets.items() if o > 0}

    # So the new worker cannot pass by reading everything again from the earliest offset.
    wait_for("segments stored and audio offsets committed", advanced, timeout_s=120, worker=first)
    first.kill9()
    assert replay.is_alive(), "the replay ended before the kill: the kill did not happen under load"
    second = start_group_worker(checkpoint_key=key)
    replay.join()

    calls = GroupStores([first, second]).wait_finished(call_ids, timeout_s=300)
    assert second.alive(), f"the new worker died: {second.log_tail()}"
    assert "Traceback" not in second.log_text()
    # A call may be finished in both stores (the first worker stored it, then died before committing);
    # every row of it must then agree with the segments over both stores.
    assert {r["end_reason"] for c in call_ids for r in calls.finished[c]} == {"end"}
    assert calls.inconsistencies(call_ids) == []
    finished_by_second = [c for c in call_ids if calls.finished_in[c] == {1}]
    assert finished_by_second, "the first worker had finished every call: the kill was not mid-load"
    # Against an independent reference, not the stores' own counts: each call's finals are exactly those
    # `callqa analyze` finds in its recording (same bounds, same text), each stored once over both stores.
    assert calls.differences(dict(zip(call_ids, offline_finals(paths), strict=True))) == []
    # The group's commits reach the end of every partition (else this waits out its timeout and fails)...
    wait_for("the new worker commits the end of each partition", lambda: _caught_up(kafka_settings, second),
             timeout_s=60, worker=second)
    # ...and the new worker resumed from the group's commits and the calls' checkpoints, not from the
    # earliest offset: it took in less audio than the replay sent.
    sent_s = sum(len(leg) for rec in recordings for leg in rec.legs.values()) / RATE
    fed_s = read_metric(second, LEG_AUDIO)
    assert 0 < fed_s < sent_s, f"the new worker took {fed_s:.0f} s of leg audio of the {sent_s:.0f} s sent"
    assert read_metric(second, "callqa_calls_resumed_total") > 0  # from sealed checkpoints
    # Every record on the checkpoint topic is sealed (or a tombstone): no text or audio in the clear.
    records = read_topic(kafka_settings.bootstrap, kafka_settings.topic_checkpoints)
    assert records and all(m.value() is None or m.value().startswith(MAGIC) for m in records)

    # No state left behind: every call is over, so every key's newest record becomes a tombstone, also
    # those the killed worker wrote "finished" and committed past without deleting.
    def left_behind() -> list[str]:
        newest = {m.key(): m.value() for m in read_topic(kafka_settings.bootstrap, kafka_settings.topic_checkpoints,
                                                          idle_s=1.0)}
        return sorted(k.decode() for k, v in newest.items() if v is not None)

    wait_for("every checkpoint key tombstoned", lambda: not left_behind(), timeout_s=90, worker=second)


def offline_finals(paths: list[Path]) -> list[list[tuple[str, int, int, str]]]:
    """Each recording's final segments as `callqa analyze` finds them: (leg, start_ms, end_ms, text)."""
    analyses = analyze_recordings(paths, Engine.load(), QaConfig.from_settings(Settings()))
    return [[(s.leg, s.start_ms, s.end_ms, s.text) for s in a.segments] for a in analyses]


def _caught_up(settings: Settings, worker: WorkerProcess) -> dict[int, int] | None:
    from confluent_kafka import Consumer, TopicPartition

    from pipeline.broker.security import kafka_config

    committed = committed_offsets(settings, worker.group, settings.topic_audio)
    probe = Consumer({**kafka_config(settings), "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        highs = {p: probe.get_watermark_offsets(TopicPartition(settings.topic_audio, p), timeout=10)[1]
                 for p in range(settings.audio_partitions)}
    finally:
        probe.close()
    with_data = {p: h for p, h in highs.items() if h > 0}
    return committed if all(committed.get(p) == h for p, h in with_data.items()) else None


# ---- bounded replay of a long call ----------------------------------------------------------------
# Five minutes: long enough that re-decoding from the call's start (600 s of leg audio) is ten times the bound
# below. `callqa bench scale-out` (part 3, `--long-call-s`) and `callqa bench check` (``long-call``) kill a
# 20-minute call the same way.
CALL_S = 300
MAX_SEGMENT_MS = 15_000
COMMIT_INTERVAL_S = 1.0
CHECKPOINT_INTERVAL_MS = 1000
INFLIGHT_MB = 1
SLACK_S = 2.0  # per leg: VAD windows, pre/post roll, the checkpoint interval's audio between snapshots
LIVE_FROM_S = 280  # the call's last 20 s come in real time; the kill is in them, in back-to-back speech
LIVE_BEFORE_KILL_S = 5.0  # of real time before the kill: a few checkpoints
SAMPLE_GAP_S = 0.5  # per leg: audio the worker may take between the last metrics sample and the kill
CHECKPOINTS = "callqa_checkpoints_total"


def long_call() -> CallRecording:
    """Library calls looped to CALL_S. The first three quarters alternate a call's first minute and 1.5 minutes
    of silence (dead air costs the VAD little and inference nothing, which keeps the test short); the
    rest is calls back to back, so the kill at 90 % lands in speech with segments open."""
    names = sorted(p for p in LIBRARY_DIR.glob("*.wav") if "long" not in p.name and "hold" not in p.name)
    parts: list[np.ndarray | int] = []
    used_ms = 0
    for i, path in enumerate(names):
        call = stereo(path)
        minute = np.zeros((2, 60 * RATE), np.float32)
        minute[:, :call.shape[1]] = call[:, :60 * RATE]
        parts.append(minute)
        used_ms += 60_000
        if used_ms < CALL_S * 750:
            parts.append(90_000)
            used_ms += 90_000
        if used_ms >= CALL_S * 1000 or i == len(names) - 1:
            break
    rec = stitched("long-call", parts)
    rec.legs = {k: v[:CALL_S * RATE] for k, v in rec.legs.items()}
    assert all(len(v) == CALL_S * RATE for v in rec.legs.values())
    rec.encode("mulaw")
    return rec


@dataclass(frozen=True)
class FeedSample:
    """One read of the worker's metrics: when, the audio fed to its segmenters, its durable checkpoints."""

    at: float
    fed_s: float
    checkpoints: float


def feed_sample(worker: WorkerProcess) -> FeedSample | None:
    try:
        text = worker.metrics_text()
    except OSError:  # a busy moment: the next read
        return None
    return FeedSample(time.monotonic(), probes.metric(text, LEG_AUDIO), probes.metric(text, CHECKPOINTS, status="open"))


def checkpoint_lag_s(history: list[FeedSample]) -> float:
    """The most audio the newest durable checkpoint can be behind the last sample, beyond what its legs
    hold (an open segment each) and what is in flight. That checkpoint (count C at the last sample) was
    begun after the one before it was durable (one at a time), so after the last sample that saw C - 2
    or fewer: its snapshots were taken no earlier than the audio fed by then."""
    last = history[-1]
    before = [s for s in history if s.checkpoints <= last.checkpoints - 2]
    return last.fed_s - (before[-1] if before else history[0]).fed_s


def test_a_long_call_killed_near_its_end_re_decodes_at_most_one_segment_and_one_interval_per_leg(
    kafka_settings: Settings, start_worker: Any
) -> None:
    rec = long_call()
    n_legs = len(rec.legs)
    total_s = sum(len(x) for x in rec.legs.values()) / RATE
    # A small in-flight budget: the segmenter cannot run far ahead of inference, whose audio a crash loses.
    worker = start_worker(max_inflight_audio_mb=str(INFLIGHT_MB), max_segment_ms=str(MAX_SEGMENT_MS),
                          commit_interval_s=str(COMMIT_INTERVAL_S), checkpoint_interval_ms=str(CHECKPOINT_INTERVAL_MS))
    assert LEG_AUDIO in worker.metrics_text(), f"the worker exports no {LEG_AUDIO}"

    # The call's first LIVE_FROM_S go as fast as the worker takes them; once it has, the rest comes in real
    # time, as a live call's does. (Killed while catching up on a backlog, a worker re-decodes what it got
    # through in a commit interval at many times real time: more, but no different in kind.)
    def wait_until_caught_up() -> None:
        wait_for("the worker to take the backlog", lambda: worker.metric(LEG_AUDIO) >= n_legs * (LIVE_FROM_S - 1),
                 timeout_s=600, worker=worker)

    replay, call_ids = replay_in_background(kafka_settings, [rec], realtime=False, prefix="long",
                                            live_from_s=LIVE_FROM_S, on_live=wait_until_caught_up)
    wait_until_caught_up()  # here too: the samples below are of the real-time part
    history: list[FeedSample] = []
    live_until = time.monotonic() + LIVE_BEFORE_KILL_S
    while time.monotonic() < live_until or not history:
        if (sample := feed_sample(worker)) is not None:
            history.append(sample)
        time.sleep(0.1)
    worker.kill9()
    old = history[-1].fed_s  # nothing is fed between the last sample and the kill but what the lag covers
    lag_s = checkpoint_lag_s(history)
    worker.start()  # same group, same store; the replay goes on in real time
    inflight_s = INFLIGHT_MB * 1024 * 1024 / (16000 * 4)  # float32 at 16 kHz
    bound = n_legs * (MAX_SEGMENT_MS / 1000 + SLACK_S) + inflight_s + lag_s + n_legs * SAMPLE_GAP_S

    def figures() -> tuple[float, str]:
        re_decoded = old + read_metric(worker, LEG_AUDIO) - total_s
        return re_decoded, (
            f"re-decoded after the kill: {re_decoded:.1f} s of {total_s:.0f} s of leg audio (bound {bound:.1f} s "
            f"= {n_legs} legs x ({MAX_SEGMENT_MS / 1000:.0f} s segment + {SLACK_S:.0f} s + {SAMPLE_GAP_S} s) + "
            f"{inflight_s:.1f} s in flight + {lag_s:.1f} s fed since the newest checkpoint began, of "
            f"{history[-1].checkpoints - history[0].checkpoints:.0f} in the last {LIVE_BEFORE_KILL_S} s); "
            f"{read_metric(worker, 'callqa_frames_dropped_total', reason='before_checkpoint'):.0f} frames dropped as "
            f"before the checkpoint, {read_metric(worker, 'callqa_calls_resumed_total'):.0f} call(s) resumed")

    replay.join()
    try:
        rows = worker.wait_for_calls(call_ids, timeout_s=300)
    except TimeoutError:
        raise AssertionError(f"the call did not finish after the restart; {figures()[1]}") from None
    re_decoded, summary = figures()
    print(f"\n{summary}")
    assert rows[0]["end_reason"] == "end"
    assert re_decoded >= 0, "less audio was fed than the call has: audio was skipped"
    assert re_decoded <= bound, summary
    assert read_metric(worker, "callqa_calls_resumed_total") >= 1
    calls = GroupStores([worker]).read(call_ids)
    assert calls.inconsistencies(call_ids) == []


# ---- the paused call, checked last --------------------------------------------------------------
def test_a_hold_longer_than_the_inactivity_timeout_keeps_one_call_with_both_halves_transcribed(
    paused_call: PausedCall
) -> None:
    paused_call.replay.join(timeout=HOLD_MS / 1000 + 120)
    assert not paused_call.replay.is_alive()
    worker = paused_call.worker
    rows = worker.wait_for_calls(paused_call.call_ids, timeout_s=180)
    assert rows[0]["end_reason"] == "end"
    # Finished once, at its end event: never closed by the timeout during the hold, and none of its
    # frames after the pause dropped as coming after the call's end.
    assert worker.metric("callqa_calls_finished_total") == 1
    assert worker.metric("callqa_calls_finished_total", how="end") == 1
    assert worker.metric("callqa_frames_dropped_total", reason="after_call_end") == 0
    segments = worker.query("SELECT leg, start_ms, end_ms, text FROM segments FINAL WHERE call_id = {c:String} "
                            "AND is_final = 1 ORDER BY start_ms", c=paused_call.call_ids[0])
    before = [s for s in segments if s["end_ms"] <= paused_call.hold_start_ms]
    after = [s for s in segments if s["start_ms"] >= paused_call.hold_end_ms]
    assert len(before) >= 2 and len(after) >= 2, f"{len(before)} segments before the pause, {len(after)} after"
    assert len(before) + len(after) == len(segments), "a segment spans the pause"
    assert all(s["text"].strip() for s in segments)
    assert rows[0]["segments"] == len(segments)
