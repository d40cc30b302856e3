"""CallOutputs (pipeline/worker/call_outputs.py): what a call publishes and writes, and when. In-memory
ports that note each message's topic; no Kafka."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import numpy as np

from pipeline.config import Settings
from pipeline.contracts.messages import (
    CallEvent,
    CallQA,
    DeadLetter,
    LatencyMetric,
    Message,
    QaAlert,
    TranscriptSegment,
)
from pipeline.qa.call import AnalyzedSegment
from pipeline.qa.redaction import RedactedText
from pipeline.qa.rules import QaEvent
from pipeline.qa.scorecard import CallQaResult, ScoreItem
from pipeline.qa.segment import Segment
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.ports import Transcription
from pipeline.worker.reorder import FrameReorderBuffer
from pipeline.worker.state import CallState

SETTINGS = Settings(topic_transcripts="tr", topic_latency="lat", topic_qa="qa", topic_dead_letters="dlq",
                    topic_audio="audio")
EVENT = QaEvent("greeting", "compliance", "agent", "missing", 0, "no greeting", "high")
RESULT = Transcription("hello there", -0.1, 0.0, 0.9, "fake", 1, 3, 5.0, 20.0)


class TopicPorts(MemoryPorts):
    """The in-memory ports, with the topic of each message."""

    def __init__(self) -> None:
        super().__init__()
        self.topics: list[str] = []

    async def publish(self, topic: str, key: str, message: Message | None, partition: int = 0) -> Awaitable[Any]:
        self.topics.append(topic)
        return await super().publish(topic, key, message)


def _stage() -> tuple[CallOutputs, TopicPorts, WorkerMetrics]:
    ports, metrics = TopicPorts(), WorkerMetrics()
    return CallOutputs(SETTINGS, ports, ports, metrics), ports, metrics


def _leg() -> LegState:
    leg = LegState("c1", "agent", None, 20, FrameReorderBuffer(4), 100)  # type: ignore[arg-type]
    leg.produced_at_ms = {0: 10_000, 49: 10_980}  # frames 0 and 49: the segment's first and last
    return leg


async def test_a_released_segment_is_published_with_its_latency_and_alerts_then_stored() -> None:
    stage, ports, metrics = _stage()
    call = CallState("c1", unresolved={"c1/agent/000000000"})
    segment = Segment("c1", "agent", "c1/agent/000000000", 0, 1000, "hello there")
    analyzed = AnalyzedSegment(RedactedText(segment, {"card": 1}), [EVENT])
    await stage.segment(call, (_leg(), 0, 1000, RESULT, 11_000, 11_500), analyzed)
    assert ports.topics == ["tr", "lat", "qa"]
    transcript, latency, alert = ports.messages
    assert isinstance(transcript, TranscriptSegment) and isinstance(latency, LatencyMetric)
    assert isinstance(alert, QaAlert) and alert.rule == "greeting"
    assert (transcript.text, transcript.is_final, transcript.redactions) == ("hello there", True, 1)
    assert transcript.first_frame_produced_at_ms == 10_000 and latency.frame_to_consume_ms == 20.0
    assert [t for t, _ in ports.rows] == ["segments", "latency"]
    # Done: counted, no longer holding a checkpoint back, its deliveries awaited before release.
    assert call.segments_done == 1 and not call.unresolved and len(call.deliveries) == 3
    assert metrics.registry.get_sample_value("callqa_qa_alerts_total", {"rule": "greeting"}) == 1


async def test_a_failed_segment_is_dead_lettered_without_its_audio() -> None:
    stage, ports, metrics = _stage()
    call = CallState("c1", audio_tp=("audio", 2))
    seg = SpeechSegment(0, 16_000, 32_000, np.ones(16_000, np.float32), 900, "endpoint")
    await stage.segment_failed(call, _leg(), seg, "c1/agent/000001000", RuntimeError("batch failed"))
    [letter] = ports.messages
    assert ports.topics == ["dlq"] and isinstance(letter, DeadLetter)
    assert (letter.original_topic, letter.original_partition, letter.segment_id) == ("audio", 2, "c1/agent/000001000")
    assert letter.raw is None and "batch failed" in letter.reason
    assert metrics.registry.get_sample_value("callqa_dead_letters_total", {"reason": "RuntimeError"}) == 1


async def test_a_calls_result_is_its_qa_message_and_rows() -> None:
    stage, ports, metrics = _stage()
    call = CallState("c1", start=CallEvent("c1", "start", tenant="acme"), segments_done=2)
    result = CallQaResult("c1", 80.0, False, [ScoreItem("Greets?", 10, True, "said hello")], {"talk_pct": 55},
                          [EVENT], "default")
    await stage.call_result(call, result, "end", 42_000)
    await stage.live.settled()
    [qa] = ports.messages
    assert ports.topics == ["qa", SETTINGS.topic_live_calls] and isinstance(qa, CallQA) and qa.tenant == "acme"
    assert ports.tombstones == [(SETTINGS.topic_live_calls, "c1")]  # the call leaves the live desk
    assert [t for t, _ in ports.rows] == ["calls", "call_qa", "qa_events"]
    assert ports.rows[0][1]["audio_ms"] == 42_000 and ports.rows[0][1]["end_reason"] == "end"
    assert metrics.registry.get_sample_value("callqa_calls_finished_total", {"how": "end"}) == 1


async def test_a_call_whose_start_names_no_tenant_is_stored_in_the_default_tenant() -> None:
    stage, ports, _ = _stage()
    call = CallState("c1", start=CallEvent("c1", "start"), segments_done=1)
    await stage.call_result(call, CallQaResult("c1", 80.0, False, [], {}, [], "default"), "end", 1_000)
    [qa] = ports.messages
    assert isinstance(qa, CallQA) and qa.tenant == SETTINGS.default_tenant == "default"
    assert ports.rows[0][1]["tenant"] == "default" and ports.rows[1][1]["tenant"] == "default"
