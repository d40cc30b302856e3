"""The live summary stage (pipeline/worker/live_summary.py): what a call in progress puts on the live-calls topic,
and when. No broker: the in-memory ports. Expected figures are worked out by hand from the segments given."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.config import Settings
from pipeline.contracts.messages import CallEvent, LiveCall
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.worker import live_summary
from pipeline.worker.legs import LegState
from pipeline.worker.live_summary import LiveSummaries
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.reorder import FrameReorderBuffer
from pipeline.worker.state import CallState

SETTINGS = Settings(topic_live_calls="live", live_summary_interval_s=0.5, default_tenant="house")
QA = QaConfig.from_settings(SETTINGS)


class Clock:
    def __init__(self, at_ms: int) -> None:
        self.at_ms = at_ms

    def __call__(self) -> int:
        return self.at_ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    at = Clock(1_000_000)
    monkeypatch.setattr(live_summary, "now_ms", at)
    return at


def a_call(tenant: str = "acme", audio_ms: int = 6_000) -> CallState:
    call = CallState("c1", start=CallEvent("c1", "start", tenant=tenant, agent_id="a7", queue="billing",
                                           at_ms=900_000))
    call.analyzer = CallAnalyzer("c1", QA)
    for leg in ("agent", "customer"):
        state = call.legs[leg] = LegState("c1", leg, None, 20, FrameReorderBuffer(4), 100)  # type: ignore[arg-type]
        state.frames_released = audio_ms // 20
    return call


async def summaries(stage: LiveSummaries, ports: MemoryPorts) -> list[LiveCall]:
    """What the stage sent, once its sends are done (each goes on a task of its own)."""
    await stage.settled()
    return [m for m in ports.messages if isinstance(m, LiveCall)]


async def test_a_calls_start_is_sent_at_once_with_who_and_where(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    stage.changed(a_call())
    [summary] = await summaries(stage, ports)
    assert (summary.call_id, summary.tenant, summary.agent_id, summary.queue) == ("c1", "acme", "a7", "billing")
    assert (summary.started_at_ms, summary.updated_at_ms, summary.call_ms) == (900_000, 1_000_000, 6_000)
    assert (summary.turns, summary.alerts, summary.last_alert_ms, summary.on_hold) == (0, 0, -1, False)
    assert summary.silence_ms == 6_000  # nobody spoke yet


async def test_a_call_whose_producer_named_no_tenant_is_the_default_tenants(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    stage.changed(a_call(tenant=""))
    assert (await summaries(stage, ports))[0].tenant == "house"


async def test_a_call_without_its_start_event_is_not_shown_until_it_comes(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    call = a_call()
    call.start = None
    stage.changed(call)
    assert await summaries(stage, ports) == []


async def test_changes_inside_the_interval_wait_for_a_tick_after_it(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    call = a_call()
    stage.changed(call)
    clock.at_ms += 200
    call.analyzer.process(Segment("c1", "agent", "c1/agent/0", 0, 2_000, "thank you for calling"))  # type: ignore[union-attr]
    stage.changed(call)
    stage.changed(call)
    assert len(await summaries(stage, ports)) == 1  # 200 ms after the last: held back
    clock.at_ms += 200
    stage.send_due({"c1": call})
    assert len(await summaries(stage, ports)) == 1  # 400 ms: still inside the interval
    clock.at_ms += 100
    stage.send_due({"c1": call})
    stage.send_due({"c1": call})  # nothing new since: nothing more
    first, second = await summaries(stage, ports)
    assert (first.turns, second.turns, second.updated_at_ms) == (0, 1, 1_000_500)


async def test_talk_silence_holds_sentiment_and_alerts_so_far(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    call = a_call(audio_ms=8_000)
    analyzer = call.analyzer
    assert analyzer is not None
    analyzer.process(Segment("c1", "agent", "c1/agent/0", 0, 2_000, "thank you for calling how can I help"))
    analyzer.process(Segment("c1", "customer", "c1/customer/2500", 2_500, 4_000,
                             "this is terrible and I am furious I want to speak to a manager"))
    call.holds_ms.append((5_000, 6_000))  # a hold of a second, over
    call.held_from_ms = 7_000  # and held again now
    stage.changed(call)
    [summary] = await summaries(stage, ports)
    assert (summary.agent_talk_ms, summary.customer_talk_ms, summary.turns) == (2_000, 1_500, 2)
    # 8 s of call: 3.5 s spoken, 1 s held, 1 s held since 7 s; silent 0.5 s between the turns and 4-5 s, 6-7 s.
    assert summary.silence_ms == 2_500
    assert summary.on_hold is True
    assert summary.customer_sentiment < 0 and len(summary.customer_scores) == 1 and summary.customer_scores[0] < 0
    assert (summary.alerts, summary.last_alert_rule) == (1, "escalation_request")
    assert 2_500 <= summary.last_alert_ms <= 4_000  # where in the customer's turn the phrase was


async def test_the_trend_line_keeps_the_customers_last_twelve_turns_oldest_first(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    call = a_call(audio_ms=60_000)
    for i in range(14):
        text = "thank you that is wonderful" if i >= 9 else "okay"  # the last five pleased
        call.analyzer.process(Segment("c1", "customer", f"c1/customer/{i}", i * 3_000, i * 3_000 + 1_000, text))  # type: ignore[union-attr]
    stage.changed(call)
    [summary] = await summaries(stage, ports)
    assert len(summary.customer_scores) == 12
    # Turns 2-13: seven neutral, then five pleased; the first third (five turns) neutral, the last pleased.
    assert summary.customer_scores[:7] == [0.0] * 7 and all(s > 1 for s in summary.customer_scores[7:])
    assert summary.customer_trend == "improving" and summary.customer_sentiment > 1


async def test_a_calls_end_is_a_tombstone_and_nothing_after_it(clock: Clock) -> None:
    ports = MemoryPorts()
    stage = LiveSummaries(SETTINGS, ports)
    call = a_call()
    stage.changed(call)
    clock.at_ms += 100
    stage.changed(call)  # held back by the interval
    stage.ended(call)
    call.finishing = True
    clock.at_ms += 1_000
    stage.send_due({"c1": call})
    stage.changed(call)
    assert len(await summaries(stage, ports)) == 1 and ports.tombstones == [("live", "c1")]


class BrokenPorts(MemoryPorts):
    """A partition that moved away, a broker restarting: every publish fails."""

    async def publish(self, topic: str, key: str, message: Any, partition: int = 0) -> Any:
        raise RuntimeError("input partition 3 is not owned here")


async def test_a_summary_that_cannot_be_published_fails_nothing_of_the_call(clock: Clock) -> None:
    stage = LiveSummaries(SETTINGS, BrokenPorts())
    call = a_call()
    stage.changed(call)  # returns: the send is beside the call, not in its way
    stage.ended(call)
    await stage.settled()
    assert stage.failures == 2
