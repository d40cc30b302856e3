"""TranscriptionScheduler (pipeline/worker/transcription.py): closed segments to the transcriber under the
in-flight budget, and what each outcome (text, silence, failure) leads to. A scripted transcriber, fake
segmenters, in-memory ports; no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.config import Settings
from pipeline.contracts.messages import DeadLetter, TranscriptSegment
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.worker.budget import InflightBudget
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.ports import TranscriberDeadError, Transcription
from pipeline.worker.release import ReleaseGate
from pipeline.worker.reorder import FrameReorderBuffer
from pipeline.worker.segmentation import ClosedSegment, announce
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks
from pipeline.worker.transcription import TranscriptionScheduler

SILENT, FAILS, DEAD = 2.0, 3.0, 4.0  # what a segment's samples are filled with says how it decodes


class ScriptedTranscriber:
    """Decodes a segment by the value its samples are filled with; waits for ``go`` before each decode."""

    idle = False  # no early decodes

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.go.set()
        self.decoded = 0

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        await self.go.wait()
        self.decoded += 1
        value = float(audio_16k[0])
        if value == FAILS:
            raise RuntimeError("inference failed")
        if value == DEAD:
            raise TranscriberDeadError("the batcher died")
        text = "" if value == SILENT else f"words {value:g}"
        return Transcription(text, -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0, is_silence=value == SILENT)


@dataclass
class QuietSegmenter:
    """A leg's VAD that has heard a minute and is between segments; or holds an open segment."""

    samples_received: int = 60_000 * 16
    open_segment_start_ms: int | None = None
    open_audio: np.ndarray | None = None
    open_segment_lead: int = 0

    @property
    def open_segment_ms(self) -> int | None:
        return None if self.open_audio is None else (self.open_audio.size - self.open_segment_lead) // 16

    def open_segment_audio(self) -> np.ndarray | None:
        return self.open_audio


@dataclass
class FakeFrontEnd:
    segmenter: QuietSegmenter


@dataclass
class Stage:
    scheduler: TranscriptionScheduler
    transcriber: ScriptedTranscriber
    ports: MemoryPorts
    tasks: CallTasks
    budget: InflightBudget
    metrics: WorkerMetrics
    call: CallState


def _stage(budget_bytes: int = 64 << 20, **settings: int) -> Stage:
    config = Settings(**settings)  # type: ignore[arg-type]
    ports, metrics, transcriber = MemoryPorts(), WorkerMetrics(), ScriptedTranscriber()
    tasks, budget = CallTasks(metrics), InflightBudget(budget_bytes)
    outputs = CallOutputs(config, ports, ports, metrics)
    scheduler = TranscriptionScheduler(config, transcriber, budget, ReleaseGate(config, outputs, tasks), outputs,
                                       tasks, metrics)
    call = CallState("c1", analyzer=CallAnalyzer("c1", QaConfig.from_settings(config)))
    call.legs["agent"] = LegState("c1", "agent", FakeFrontEnd(QuietSegmenter()),  # type: ignore[arg-type]
                                  20, FrameReorderBuffer(4), 100)
    return Stage(scheduler, transcriber, ports, tasks, budget, metrics, call)


def _closed(stage: Stage, start_ms: int, value: float, samples: int = 8000) -> ClosedSegment:
    start = start_ms * 16
    seg = SpeechSegment(0, start, start + samples, np.full(samples, value, np.float32), samples // 16, "endpoint")
    closed = ClosedSegment(stage.call, stage.call.legs["agent"], seg)
    announce([closed])
    return closed


async def _settled(stage: Stage) -> None:
    await asyncio.gather(*stage.call.pending, return_exceptions=True)
    await asyncio.sleep(0)


async def test_decoded_segments_are_released_and_their_audio_leaves_the_budget() -> None:
    stage = _stage()
    for start, value in ((0, 1.0), (1000, 5.0)):
        await stage.scheduler.submit(_closed(stage, start, value), 0)
    await _settled(stage)
    assert [m.text for m in stage.ports.finals()] == ["words 1", "words 5"]
    assert stage.budget.used == 0 and stage.budget.peak == 2 * 8000 * 4
    assert not stage.call.unresolved and stage.tasks.failures == []


async def test_a_silent_segment_is_skipped() -> None:
    stage = _stage()
    await stage.scheduler.submit(_closed(stage, 0, SILENT), 0)
    await stage.scheduler.submit(_closed(stage, 1000, 1.0), 0)
    await _settled(stage)
    assert [m.text for m in stage.ports.finals()] == ["words 1"] and not stage.call.unresolved
    assert stage.metrics.registry.get_sample_value("callqa_segments_total", {"kind": "silence"}) == 1


async def test_a_failed_segment_is_dead_lettered_and_the_call_goes_on() -> None:
    stage = _stage()
    await stage.scheduler.submit(_closed(stage, 0, FAILS), 0)
    await stage.scheduler.submit(_closed(stage, 1000, 1.0), 0)
    await _settled(stage)
    letters = [m for m in stage.ports.messages if isinstance(m, DeadLetter)]
    assert [m.segment_id for m in letters] == ["c1/agent/000000000"]
    assert [m.text for m in stage.ports.finals()] == ["words 1"] and stage.tasks.failures == []
    assert stage.metrics.registry.get_sample_value("callqa_segment_failures_total") == 1


async def test_a_dead_transcriber_fails_the_call() -> None:
    stage = _stage()
    await stage.scheduler.submit(_closed(stage, 0, DEAD), 0)
    await _settled(stage)
    assert stage.call.failed and stage.budget.used == 0
    assert stage.tasks.failures == ["call c1: segment task failed: TranscriberDeadError: the batcher died"]


async def test_a_segment_waits_for_budget_while_earlier_audio_is_in_flight() -> None:
    stage = _stage(budget_bytes=40_000)  # room for one 32 kB segment
    stage.transcriber.go.clear()
    await stage.scheduler.submit(_closed(stage, 0, 1.0), 0)
    second = asyncio.create_task(stage.scheduler.submit(_closed(stage, 1000, 5.0), 0))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not second.done() and stage.budget.used == 32_000
    stage.transcriber.go.set()
    await second
    await _settled(stage)
    assert [m.text for m in stage.ports.finals()] == ["words 1", "words 5"] and stage.budget.peak == 32_000


async def test_an_open_segment_gets_a_partial_once_it_grew_by_the_interval() -> None:
    stage = _stage(partial_interval_ms=1000)
    leg = stage.call.legs["agent"]
    segmenter = leg.front_end.segmenter
    segmenter.open_segment_start_ms, segmenter.open_audio = 2000, np.full(999 * 16, 7.0, np.float32)
    stage.scheduler.after_audio(stage.call, leg)
    assert not stage.call.pending  # not grown enough yet
    segmenter.open_audio = np.full(1000 * 16, 7.0, np.float32)
    stage.scheduler.after_audio(stage.call, leg)
    await _settled(stage)
    partials = [m for m in stage.ports.messages if isinstance(m, TranscriptSegment) and not m.is_final]
    assert [(m.segment_id, m.text) for m in partials] == [("c1/agent/000002000", "words 7")]


def _partial_outcomes(stage: Stage) -> dict[str, float]:
    return {o: stage.metrics.registry.get_sample_value("callqa_partials_total", {"outcome": o}) or 0
            for o in ("published", "skipped", "dropped", "superseded", "failed")}


async def test_a_partial_never_waits_for_budget_a_final_waits_for() -> None:
    """Under load partials give way: a final waiting for the in-flight budget is not overtaken by a partial
    (which would hold room the final needs); the partial is skipped, counted, and the next one comes later."""
    stage = _stage(budget_bytes=40_000, partial_interval_ms=1000)  # room for one 32 kB segment
    stage.transcriber.go.clear()
    await stage.scheduler.submit(_closed(stage, 0, 1.0), 0)
    waiting = asyncio.create_task(stage.scheduler.submit(_closed(stage, 1000, 5.0), 0))
    for _ in range(10):
        await asyncio.sleep(0)
    leg = stage.call.legs["agent"]
    segmenter = leg.front_end.segmenter
    segmenter.open_segment_start_ms, segmenter.open_audio = 3000, np.full(1000 * 16, 7.0, np.float32)
    stage.scheduler.after_audio(stage.call, leg)  # due, but a final waits for budget: skipped at once
    for _ in range(10):
        await asyncio.sleep(0)
    assert _partial_outcomes(stage)["skipped"] == 1 and not leg.partial_inflight
    stage.transcriber.go.set()
    await waiting
    await _settled(stage)
    assert [m.text for m in stage.ports.finals()] == ["words 1", "words 5"]
    for _ in range(100):  # the finals' audio leaves the budget once their rows are in the sink's buffer
        if stage.budget.used == 0:
            break
        await asyncio.sleep(0)
    segmenter.open_audio = np.full(2000 * 16, 7.0, np.float32)  # grown by another interval, room now
    stage.scheduler.after_audio(stage.call, leg)
    await _settled(stage)
    partials = [m.text for m in stage.ports.messages if isinstance(m, TranscriptSegment) and not m.is_final]
    assert (partials, _partial_outcomes(stage)["published"]) == (["words 7"], 1)


async def test_without_partials_yield_a_partial_waits_for_budget_like_a_final() -> None:
    stage = _stage(budget_bytes=40_000, partial_interval_ms=1000, partials_yield=False)
    stage.transcriber.go.clear()
    await stage.scheduler.submit(_closed(stage, 0, 1.0), 0)
    leg = stage.call.legs["agent"]
    segmenter = leg.front_end.segmenter
    segmenter.open_segment_start_ms, segmenter.open_audio = 3000, np.full(1000 * 16, 7.0, np.float32)
    stage.scheduler.after_audio(stage.call, leg)
    for _ in range(10):
        await asyncio.sleep(0)
    assert leg.partial_inflight and _partial_outcomes(stage)["skipped"] == 0  # waiting for budget
    stage.transcriber.go.set()
    await _settled(stage)
    partials = [m.text for m in stage.ports.messages if isinstance(m, TranscriptSegment) and not m.is_final]
    assert partials == ["words 7"]
