"""The worker's post-call pass: a finished call is transcribed again by the accurate model and
stored as revision 1 beside the live result, what readers see; a worker killed mid-pass stores it once.
Real broker, real worker processes, real models, real embedded ClickHouse."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.analyze import CallAnalysis, analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.bench.workers import WorkerProcess
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import CallQA, Serde
from pipeline.contracts.messages import PostCallJob
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.qa.call import QaConfig
from tests.conftest import _read_topic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CALL = Path(__file__).resolve().parents[2] / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"
FINAL_MODEL = "moonshine-tiny"  # the family's faster model: the pass is what is tested, not its accuracy


@pytest.fixture(scope="module")
def offline() -> CallAnalysis:
    """`callqa analyze --final-model` of the recording: what revision 1 must hold."""
    (analysis,) = analyze_recordings([CALL], Engine.load(), QaConfig.from_settings(Settings()),
                                     final_engine=Engine.load(FINAL_MODEL))
    return analysis


def _replay(settings: Settings) -> str:
    player = TelephonyReplay(ContractProducer(settings.bootstrap, Serde.from_settings()), settings.topic_audio,
                             settings.topic_call_events)
    (call_id,) = player.run([load_recording(CALL, ReplayOptions())], ReplayOptions()).call_ids
    return call_id


def _wait_revision(worker: WorkerProcess, call_id: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.query("SELECT revision FROM calls_deduped WHERE call_id = {c:String} AND revision = 1", c=call_id):
            return
        if not worker.alive():
            raise RuntimeError(f"worker died: {worker.log_tail()}")
        time.sleep(0.5)
    raise TimeoutError(f"no revision 1 of {call_id} in {timeout_s:.0f} s: {worker.log_tail()}")


def _wait_metric(worker: WorkerProcess, name: str, at_least: float, timeout_s: float = 240.0, **labels: str) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.metric(name, **labels) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} stayed below {at_least}: {worker.log_tail()}")
        time.sleep(0.2)


def _stored_final(worker: WorkerProcess, call_id: str) -> dict[str, Any]:
    segments = worker.query("SELECT leg, start_ms, end_ms, text, revision, model_name FROM segments_deduped "
                            "WHERE call_id = {c:String} AND is_final = 1 ORDER BY start_ms, leg", c=call_id)
    (qa,) = worker.query("SELECT score_pct, auto_failed, revision FROM call_qa_deduped WHERE call_id = {c:String}",
                         c=call_id)
    events = worker.query("SELECT rule, kind, revision FROM qa_events_deduped WHERE call_id = {c:String} "
                          "ORDER BY rule, kind", c=call_id)
    return {"segments": segments, "qa": qa, "events": events}


def _assert_is_the_final_pass(stored: dict[str, Any], offline: CallAnalysis) -> None:
    assert [(s["leg"], s["start_ms"], s["end_ms"], s["text"]) for s in stored["segments"]] == [
        (s.leg, s.start_ms, s.end_ms, s.text) for s in offline.segments]
    assert {(s["revision"], s["model_name"]) for s in stored["segments"]} == {(1, FINAL_MODEL)}
    assert (stored["qa"]["score_pct"], bool(stored["qa"]["auto_failed"]), stored["qa"]["revision"]) == (
        offline.qa.score_pct, offline.qa.auto_failed, 1)
    assert [(e["rule"], e["kind"]) for e in stored["events"]] == sorted((e.rule, e.kind) for e in offline.qa.events)


def test_a_finished_call_gets_revision_1_from_the_final_model_and_readers_show_it(
        kafka_settings: Settings, start_worker: Callable[..., WorkerProcess], offline: CallAnalysis) -> None:
    worker = start_worker(final_model=FINAL_MODEL)
    # A job whose call has no audio on the topic (expired, or never there): skipped, counted, the worker goes on.
    producer = ContractProducer(kafka_settings.bootstrap, Serde.from_settings())
    producer.send(kafka_settings.topic_postcall, "CA-gone", PostCallJob(
        call_id="CA-gone", revision=1, model=FINAL_MODEL, audio_topic=kafka_settings.topic_audio, audio_partition=0,
        audio_from_ms=0, audio_end_offset=1_000, frame_counts={"agent": 10}, end_reason="end"))
    producer.flush()
    call_id = _replay(kafka_settings)
    _wait_revision(worker, call_id)
    _wait_metric(worker, "callqa_postcall_calls_total", 1, outcome="no_audio")

    _assert_is_the_final_pass(_stored_final(worker, call_id), offline)
    # The live pass is kept beside it, by the live model.
    live = worker.query("SELECT count() AS n, any(model_name) AS m FROM segments FINAL WHERE call_id = {c:String} "
                        "AND revision = 0 AND is_final = 1", c=call_id)[0]
    assert live["n"] >= 4 and live["m"] == "tiny.en"
    assert worker.metric("callqa_postcall_jobs_total") == 1
    assert worker.metric("callqa_postcall_calls_total", outcome="written") == 1
    assert worker.metric("callqa_postcall_cpu_seconds_total") > 0
    assert worker.metric("callqa_postcall_read_bytes_total", whose="call") > 0
    # The revision's QA result is on the QA topic too, after the live one.
    serde = Serde.from_settings()
    messages = [serde.decode_any(m.value()) for m in _read_topic(kafka_settings.bootstrap, kafka_settings.topic_qa)]
    results = [m for m in messages if isinstance(m, CallQA) and m.call_id == call_id]
    assert [r.revision for r in results] == [0, 1] and results[1].score_pct == offline.qa.score_pct


def test_a_worker_killed_mid_pass_stores_revision_1_exactly_once(
        kafka_settings: Settings, start_worker: Callable[..., WorkerProcess], offline: CallAnalysis,
        tmp_path: Path) -> None:
    refusing = tmp_path / "store-refuses"  # while it exists, every insert fails (bench/store_fault.py refuses them)
    first = start_worker(final_model=FINAL_MODEL, fault_file=refusing)
    refusing.touch()
    call_id = _replay(kafka_settings)
    # The pass has decoded the call and is writing its revision when the worker dies: nothing of it committed.
    _wait_metric(first, "callqa_postcall_audio_seconds_total", 1.0)
    first.kill9()
    refusing.unlink()

    second = start_worker(final_model=FINAL_MODEL)
    _wait_revision(second, call_id)
    _assert_is_the_final_pass(_stored_final(second, call_id), offline)
    counts = second.query("SELECT revision, count() AS n, uniqExact(segment_id) AS ids FROM segments FINAL "
                          "WHERE call_id = {c:String} AND is_final = 1 GROUP BY revision ORDER BY revision", c=call_id)
    assert [(c["revision"], c["n"], c["ids"]) for c in counts] == [
        (0, counts[0]["n"], counts[0]["n"]), (1, len(offline.segments), len(offline.segments))]
    for table in ("calls", "call_qa"):
        rows = second.query(f"SELECT revision, count() AS n FROM {table} FINAL WHERE call_id = {{c:String}} "  # noqa: S608
                            "GROUP BY revision ORDER BY revision", c=call_id)
        assert [(r["revision"], r["n"]) for r in rows] == [(0, 1), (1, 1)], table
