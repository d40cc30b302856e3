"""CallLifecycle and holds: a hold or resume event is not the call's end, a held call is not closed for
inactivity, and the call's QA metrics and the worker's counters carry its hold time. Fakes, no Kafka."""

from __future__ import annotations

from pipeline.contracts.messages import CallEvent, CallQA
from pipeline.worker.clock import close_reason
from pipeline.worker.state import CallState
from tests.worker.test_stage_lifecycle import AUDIO, EVENTS, SETTINGS, Stage

TIMEOUT_MS = SETTINGS.call_inactivity_timeout_s * 1000


def hold(kind: str, offset_ms: int, at_ms: int = 0) -> CallEvent:
    return CallEvent("c1", kind, offset_ms=offset_ms, at_ms=at_ms)  # type: ignore[arg-type]


async def test_hold_and_resume_neither_end_nor_restart_the_call() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start", at_ms=5_000, tenant="acme"))
    await stage.lifecycle.on_event(EVENTS, 1, hold("hold", 3_000, at_ms=8_000))
    await stage.lifecycle.on_event(EVENTS, 2, hold("resume", 7_500, at_ms=12_500))
    call = stage.registry.calls["c1"]
    assert call.end is None and not call.finishing and stage.call_rows() == []
    assert call.start is not None and call.started_at_ms == 5_000  # the start is the first event's
    assert call.holds_ms == [(3_000, 7_500)] and call.held_from_ms is None


async def test_the_calls_qa_metrics_and_the_counters_carry_its_holds() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start"))
    for offset, (kind, at) in enumerate([("hold", 1_000), ("hold", 1_500), ("resume", 4_000),  # a repeated hold
                                         ("resume", 4_100), ("hold", 9_000), ("resume", 9_800)], start=1):
        await stage.lifecycle.on_event(EVENTS, offset, hold(kind, at))
    await stage.lifecycle.on_event(EVENTS, 9, CallEvent("c1", "end", frame_counts={}))
    await stage.completed()
    assert stage.call_rows() == [("c1", "end")]
    [qa] = [m for m in stage.ports.messages if isinstance(m, CallQA)]
    assert (qa.metrics["hold_ms"], qa.metrics["holds"]) == (3_000 + 800, 2)
    metrics = stage.lifecycle.outputs.metrics
    assert metrics.holds._value.get() == 2 and metrics.hold_seconds._value.get() == 3.8


async def test_a_hold_still_open_at_the_end_lasts_until_the_calls_audio_ends() -> None:
    call = CallState("c1")
    call.holds_ms, call.held_from_ms = [(0, 100)], 2_000
    assert call.hold_intervals(5_000) == [(0, 100), (2_000, 5_000)]
    assert call.hold_intervals(1_000) == [(0, 100), (2_000, 2_000)]  # a hold after the last frame is empty


async def test_a_held_call_is_not_closed_for_inactivity_and_times_out_counting_from_the_resume() -> None:
    stage = Stage()
    stage.lifecycle.lag = lambda tp: 50  # behind: stream time is the partition's newest producer time
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start"))
    call = stage.registry.calls["c1"]
    call.last_frame_produced_ms = 1_000
    await stage.lifecycle.on_event(EVENTS, 1, hold("hold", 900, at_ms=1_000))
    stage.clock.advance(AUDIO, 1_000 + int(TIMEOUT_MS) * 2)  # other calls' audio: twice the timeout on
    await stage.lifecycle.close_due()
    assert "c1" in stage.registry.calls and not call.finishing
    resumed_at = 1_000 + int(TIMEOUT_MS) * 2
    await stage.lifecycle.on_event(EVENTS, 2, hold("resume", 900 + int(TIMEOUT_MS) * 2, at_ms=resumed_at))
    stage.clock.advance(AUDIO, resumed_at + int(TIMEOUT_MS) - 1)
    await stage.lifecycle.close_due()
    assert not call.finishing
    stage.clock.advance(AUDIO, resumed_at + int(TIMEOUT_MS))
    await stage.lifecycle.close_due()
    await stage.completed()
    assert stage.call_rows() == [("c1", "timeout")]


def test_close_reason_suspends_the_inactivity_timeout_while_held_but_keeps_the_last_resort() -> None:
    t0 = 1_000_000
    call = CallState("c1", last_frame_produced_ms=t0, last_activity_ms=t0, opened_at_ms=t0, held_from_ms=0)
    assert close_reason(call, 5, t0 + 60_000, t0 + 60_000, 30_000.0, 2_000) is None
    assert close_reason(call, -1, 0, t0 + 10 * 30_000, 30_000.0, 2_000) == "timeout"
