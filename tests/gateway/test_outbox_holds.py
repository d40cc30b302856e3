"""The outbox turns a PCI pause into hold and resume call events that repeat the call's start fields."""

from __future__ import annotations

from pipeline.contracts.messages import CallEvent
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.outbox import Outbox


def test_hold_and_resume_follow_the_start_with_its_fields_and_their_call_time() -> None:
    outbox = Outbox(GatewayMetrics(), leg_buffer_s=1.0)
    outbox.call_started(CallEvent("c1", "start", tenant="acme", agent_id="a7", queue="cards", legs=["agent"]))
    outbox.call_held("c1", 4_000)
    outbox.call_resumed("c1", 9_020, 5_020)
    batch = outbox.take(100, wait_s=0)
    assert [(e.event_type, e.offset_ms) for e in batch.starts] == [("start", -1), ("hold", 4_000), ("resume", 9_020)]
    assert {(e.tenant, e.agent_id, e.queue, tuple(e.legs)) for e in batch.starts} == {("acme", "a7", "cards", ("agent",))}
