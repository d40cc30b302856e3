"""CallLifecycle and secure pauses: a pause or unpause event neither ends nor restarts the call, a paused call
is not closed for inactivity, a call that ended while paused closes at its end event without waiting for the
frames the gateway dropped, and the call's QA metrics and calls row carry the paused span (apart from holds:
what the call page's timeline draws). Fakes, no Kafka."""

from __future__ import annotations

from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint, CallEvent, CallHold, CallQA
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.worker.checkpoints import call_checkpoint, restore_call
from pipeline.worker.clock import close_reason
from pipeline.worker.intake import LegAudio
from pipeline.worker.legs import LegState
from pipeline.worker.state import CallState
from tests.worker.test_stage_lifecycle import EVENTS, SETTINGS, Stage

SILENCE = b"\xff" * 160  # 20 ms of μ-law silence


def event(kind: str, offset_ms: int, **fields: object) -> CallEvent:
    return CallEvent("c1", kind, offset_ms=offset_ms, **fields)  # type: ignore[arg-type]


async def test_pause_and_unpause_neither_end_nor_restart_the_call_and_repeats_change_nothing() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start", at_ms=5_000, tenant="acme"))
    for offset, (kind, at) in enumerate([("unpause", 1_000), ("pause", 3_000), ("pause", 3_500),
                                         ("unpause", 7_500), ("unpause", 9_000)], start=1):
        await stage.lifecycle.on_event(EVENTS, offset, event(kind, at, at_ms=10_000 + at))
    call = stage.registry.calls["c1"]
    assert call.end is None and not call.finishing and stage.call_rows() == []
    assert call.started_at_ms == 5_000
    assert (call.pauses_ms, call.paused_from_ms) == ([(3_000, 7_500)], None)
    assert (call.holds_ms, call.held_from_ms) == ([], None)  # a pause is not a hold
    assert call.resumed_at_ms == 19_000  # inactivity counts again from the last unpause


def test_a_paused_call_is_not_closed_for_inactivity() -> None:
    t0 = 1_000_000
    call = CallState("c1", last_frame_produced_ms=t0, last_activity_ms=t0, opened_at_ms=t0, paused_from_ms=0)
    assert close_reason(call, 5, t0 + 60_000, t0 + 60_000, 30_000.0, 2_000) is None
    call.paused_from_ms = None
    assert close_reason(call, 5, t0 + 60_000, t0 + 60_000, 30_000.0, 2_000) == "timeout"


async def test_a_call_ended_while_paused_closes_at_its_end_and_keeps_the_paused_span() -> None:
    stage = Stage()
    await stage.lifecycle.on_event(EVENTS, 0, CallEvent("c1", "start"))
    call = stage.registry.calls["c1"]
    leg = call.legs["agent"] = LegState.open("c1", "agent", stage.front_end(8000, "mulaw"), 20,
                                             SETTINGS.max_segment_ms, SETTINGS.reorder_window_ms)
    for seq in range(25):  # 0.5 s of audio, then the pause
        samples = leg.release(seq, SILENCE, seq * 20)
        stage.segmentation.segment([LegAudio(call, leg, [] if samples is None else [samples])])
    await stage.lifecycle.on_event(EVENTS, 1, event("pause", 500))
    # The gateway ends the pause with the call at 2 s, and its end event counts the 75 frames it dropped.
    await stage.lifecycle.on_event(EVENTS, 2, event("unpause", 2_000, reason="call ended"))
    await stage.lifecycle.on_event(EVENTS, 3, CallEvent("c1", "end", frame_counts={"agent": 100}))
    assert call.finishing  # nothing missing: the frames from 0.5 s to 2 s lie in the pause
    await stage.completed()
    [qa] = [m for m in stage.ports.messages if isinstance(m, CallQA)]
    assert (qa.paused_ms, qa.pauses, qa.hold_ms, qa.holds) == (1_500, [CallHold(500, 2_000)], 0, [])
    assert (qa.metrics["paused_ms"], qa.metrics["pauses"], qa.metrics["duration_ms"]) == (1_500, 1, 2_000)
    [row] = [row for table, row in stage.ports.rows if table == "calls"]
    assert (row["end_reason"], row["paused_ms"], row["pauses"], row["holds"]) == ("end", 1_500, [(500, 2_000)], [])
    assert stage.lifecycle.outputs.metrics.calls_closed_incomplete.labels("end")._value.get() == 0


async def test_a_resumed_call_keeps_its_pauses_through_the_checkpoint_topics_encoding() -> None:
    settings = Settings()
    paused = CallState("c1")
    paused.analyzer = CallAnalyzer("c1", QaConfig.from_settings(settings))
    paused.pauses_ms, paused.paused_from_ms = [(10_000, 40_000)], 70_000
    serde = Serde.from_settings()
    record = serde.decode(serde.encode(call_checkpoint(paused, "open")), CallCheckpoint)
    call = restore_call(record, QaConfig.from_settings(settings), Stage.front_end, settings.max_segment_ms,
                        settings.reorder_window_ms)
    assert (call.pauses_ms, call.paused_from_ms) == ([(10_000, 40_000)], 70_000)
    assert call.pause_intervals(90_000) == [(10_000, 40_000), (70_000, 90_000)] and call.hold_intervals(90_000) == []
