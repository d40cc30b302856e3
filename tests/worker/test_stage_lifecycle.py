"""CallLifecycle (pipeline/worker/lifecycle.py): call events, when a call closes (in stream time), and how
it completes. Real stages behind it with a fake transcriber and in-memory ports; no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallEvent, CallQA, LiveCall
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker.budget import InflightBudget
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.clock import StreamClock
from pipeline.worker.intake import LegAudio
from pipeline.worker.legs import LegState
from pipeline.worker.lifecycle import CallLifecycle
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker
from pipeline.worker.ports import Transcription
from pipeline.worker.registry import CallRegistry
from pipeline.worker.release import ReleaseGate
from pipeline.worker.segmentation import LegSegmentation
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks
from pipeline.worker.transcription import TranscriptionScheduler

SETTINGS = Settings(topic_audio="audio", topic_call_events="events")
AUDIO, EVENTS = ("audio", 0), ("events", 0)
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"


class WordsTranscriber:
    idle = False

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        return Transcription(f"{len(audio_16k)} samples", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


class Stage:
    def __init__(self) -> None:
        metrics, self.ports, self.offsets, self.clock = WorkerMetrics(), MemoryPorts(), OffsetTracker(), StreamClock()
        tasks = CallTasks(metrics)
        self.registry = CallRegistry(SETTINGS, QaConfig.from_settings(SETTINGS), self.front_end,
                                     MemoryCheckpointStore(), metrics)
        self.segmentation = LegSegmentation(metrics)
        outputs = CallOutputs(SETTINGS, self.ports, self.ports, metrics)
        gate = ReleaseGate(SETTINGS, outputs, tasks, self.clock)
        scheduler = TranscriptionScheduler(SETTINGS, WordsTranscriber(), InflightBudget(64 << 20), gate, outputs,
                                           tasks, metrics)
        self.lifecycle = CallLifecycle(SETTINGS, self.registry, self.offsets, self.clock, self.segmentation,
                                       scheduler, gate, outputs, tasks)

    @staticmethod
    def front_end(rate: int, encoding: str) -> LegFrontEnd:
        return LegFrontEnd(rate, encoding, SETTINGS)

    async def completed(self) -> None:
        """Every call's tasks done."""
        while any(c.pending for c in [*self.registry.calls.values(), *self.registry.awaiting_release]):
            await asyncio.gather(*[t for c in [*self.registry.calls.values(), *self.registry.awaiting_release]
                                   for t in c.pending])

    def call_rows(self) -> list[tuple[str, str]]:
        return [(row["call_id"], row["end_reason"]) for table, row in self.ports.rows if table == "calls"]


async def test_an_end_event_after_all_frames_completes_the_call() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start", at_ms=5_000, tenant="acme"))
    call = stage.registry.calls["c1"]
    assert call.start is not None and call.started_at_ms == 5_000 and call.audio_tp == AUDIO
    await stage.lifecycle.on_event(EVENTS, 1, CallEvent("c1", "end", frame_counts={}))
    await stage.completed()
    assert stage.call_rows() == [("c1", "end")] and stage.registry.awaiting_release == [call]
    # The live desk's summary at the start, then the call's QA, and the summary's tombstone at its end.
    summary, qa = stage.ports.messages
    assert isinstance(summary, LiveCall) and summary.tenant == "acme" and summary.started_at_ms == 5_000
    assert isinstance(qa, CallQA) and qa.tenant == "acme"
    assert stage.ports.tombstones == [(SETTINGS.topic_live_calls, "c1")]


async def test_an_abort_closes_the_call_at_once_with_frames_missing() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "abort", frame_counts={"agent": 100}))
    await stage.completed()
    assert stage.call_rows() == [("c1", "abort")]


async def test_behind_with_frames_missing_the_call_closes_once_stream_time_passed_the_end_by_the_wait_bound() -> None:
    stage = Stage()
    stage.lifecycle.lag = lambda tp: 50  # behind: stream time is the partition's newest producer time
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "end", at_ms=10_000, frame_counts={"agent": 100}))
    # Past the grace is not enough: another producer's newer frames may come before this call's last ones.
    wait_ms = int(SETTINGS.end_wait_max_s * 1000)
    stage.clock.advance(AUDIO, 10_000 + SETTINGS.end_grace_ms)
    await stage.lifecycle.close_due()
    stage.clock.advance(AUDIO, 10_000 + wait_ms - 1)
    await stage.lifecycle.close_due()
    assert "c1" in stage.registry.calls and stage.call_rows() == []
    stage.clock.advance(AUDIO, 10_000 + wait_ms)
    await stage.lifecycle.close_due()
    await stage.completed()
    assert stage.call_rows() == [("c1", "end")]


async def test_a_call_quiet_for_the_inactivity_timeout_of_stream_time_is_closed_and_finished_once() -> None:
    stage = Stage()
    stage.lifecycle.lag = lambda tp: 50
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start"))
    call = stage.registry.calls["c1"]
    call.last_frame_produced_ms = 1_000
    stage.clock.advance(AUDIO, 1_000 + int(SETTINGS.call_inactivity_timeout_s * 1000))
    await stage.lifecycle.close_due()
    await stage.completed()
    assert stage.call_rows() == [("c1", "timeout")] and "c1" in stage.registry.finished
    assert await stage.registry.call_for("c1", AUDIO) is None  # its late frames open nothing


async def test_closing_flushes_the_open_segment_and_its_final_comes_before_the_calls_qa() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start"))
    call = stage.registry.calls["c1"]
    leg = call.legs["agent"] = LegState.open("c1", "agent", stage.front_end(8000, "mulaw"), 20,
                                             SETTINGS.max_segment_ms, SETTINGS.reorder_window_ms)
    payload = load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20)).encoded["agent"]
    seq, segmenter = 0, leg.front_end.segmenter
    while not segmenter.in_speech or len(segmenter.open_segment_audio()) < 16_000:  # 1 s into a segment
        samples = leg.release(seq, payload[seq * 160:(seq + 1) * 160], seq * 20)
        stage.segmentation.segment([LegAudio(call, leg, [] if samples is None else [samples])])
        seq += 1
    open_start = segmenter.open_segment_start_ms
    await stage.lifecycle.on_event(EVENTS, 1, CallEvent("c1", "end", frame_counts={"agent": seq}))
    await stage.completed()
    kinds = [type(m).__name__ for m in stage.ports.messages]
    assert kinds == ["LiveCall", "TranscriptSegment", "LatencyMetric", "CallQA"]
    assert stage.ports.finals()[0].start_ms == open_start


async def test_events_of_finished_calls_are_consumed_and_of_other_partitions_ignored() -> None:
    stage = Stage()
    stage.registry.remember_finished("done")
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("done", "end"))
    assert stage.offsets.committable() == {EVENTS: 1} and not stage.registry.calls
    stage.registry.on_assigned({("audio", 1), ("events", 1)})
    await stage.lifecycle.on_event(EVENTS, 1, CallEvent("c2", "start"))
    assert not stage.registry.calls and stage.offsets.committable() == {EVENTS: 1}


async def test_handing_over_waits_for_calls_already_ending_there() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "end", frame_counts={}))
    call: CallState = stage.registry.calls["c1"]
    assert call.finishing and call.pending  # its completion is a task of its own
    await stage.lifecycle.settle_ending({AUDIO}, timeout_s=60)
    assert not call.pending and stage.call_rows() == [("c1", "end")]
