"""ReleaseGate (pipeline/worker/release.py): decoded segments go out in time order across both legs,
whatever order their decodes finish in. Fake segmenters set what each leg's VAD has heard; in-memory
ports; no Kafka."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pipeline.config import Settings
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.ports import Transcription
from pipeline.worker.release import ReleaseGate
from pipeline.worker.reorder import FrameReorderBuffer
from pipeline.worker.segmentation import ClosedSegment, announce
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks

SETTINGS = Settings()


@dataclass
class HeardSegmenter:
    """What a leg's VAD has heard (ms) and the start of its open segment (None: between segments)."""

    heard_ms: int = 0
    open_segment_start_ms: int | None = None

    @property
    def samples_received(self) -> int:
        return self.heard_ms * 16


@dataclass
class FakeFrontEnd:
    segmenter: HeardSegmenter


@dataclass
class FakeSpeech:
    start_ms: int


def _call() -> CallState:
    call = CallState("c1", analyzer=CallAnalyzer("c1", QaConfig.from_settings(SETTINGS)))
    for name in ("agent", "customer"):
        call.legs[name] = LegState("c1", name, FakeFrontEnd(HeardSegmenter(60_000)),  # type: ignore[arg-type]
                                   20, FrameReorderBuffer(4), 100)
    return call


def _gate() -> tuple[ReleaseGate, MemoryPorts, CallTasks]:
    ports, metrics = MemoryPorts(), WorkerMetrics()
    tasks = CallTasks(metrics)
    return ReleaseGate(SETTINGS, CallOutputs(SETTINGS, ports, ports, metrics), tasks), ports, tasks


def _announce(call: CallState, leg: str, start_ms: int) -> str:
    closed = ClosedSegment(call, call.legs[leg], FakeSpeech(start_ms))  # type: ignore[arg-type]
    announce([closed])
    return closed.segment_id


async def _complete(gate: ReleaseGate, call: CallState, seg_id: str, text: str) -> None:
    leg, start = seg_id.split("/")[1], int(seg_id.split("/")[2])
    result = Transcription(text, -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)
    await gate.complete(call, seg_id, (call.legs[leg], start, start + 800, result, 0, 0), text)


def _texts(ports: MemoryPorts) -> list[str]:
    return [m.text for m in ports.finals()]


async def test_a_segment_decoded_first_waits_for_an_earlier_one_of_the_other_leg() -> None:
    gate, ports, _ = _gate()
    call = _call()
    agent, customer = _announce(call, "agent", 1000), _announce(call, "customer", 2000)
    await _complete(gate, call, customer, "two")
    assert _texts(ports) == [] and customer in call.decoded
    await _complete(gate, call, agent, "one")
    assert _texts(ports) == ["one", "two"] and not call.decoded and not call.unresolved


async def test_a_skipped_segment_stops_holding_later_ones() -> None:
    gate, ports, _ = _gate()
    call = _call()
    silence, speech = _announce(call, "agent", 1000), _announce(call, "customer", 2000)
    await _complete(gate, call, speech, "two")
    await gate.skip(call, silence)
    assert _texts(ports) == ["two"] and not call.unresolved


async def test_a_segment_held_for_the_other_legs_vad_goes_out_once_that_leg_moved_on() -> None:
    gate, ports, _ = _gate()
    call = _call()
    customer_vad = call.legs["customer"].front_end.segmenter
    customer_vad.open_segment_start_ms = 500  # the customer is speaking since 0.5 s: may come before it
    await _complete(gate, call, _announce(call, "agent", 1000), "one")
    assert _texts(ports) == []
    customer_vad.open_segment_start_ms = None  # that speech turned out to be noise: nothing comes before
    gate.release_moved_on(call)
    await asyncio.gather(*call.pending)
    assert _texts(ports) == ["one"]


async def test_at_the_end_flush_emits_what_is_still_held() -> None:
    gate, ports, _ = _gate()
    call = _call()
    never_decoded, held = _announce(call, "agent", 1000), _announce(call, "customer", 2000)
    await _complete(gate, call, held, "two")
    assert _texts(ports) == [] and never_decoded in call.unresolved
    await gate.flush(call)
    assert _texts(ports) == ["two"]


async def test_nothing_is_released_by_moving_on_once_the_call_is_finishing() -> None:
    gate, _, _ = _gate()
    call = _call()
    call.legs["customer"].front_end.segmenter.open_segment_start_ms = 500
    await _complete(gate, call, _announce(call, "agent", 1000), "one")
    call.finishing = True
    gate.release_moved_on(call)
    assert not call.pending  # completing the call flushes it instead
