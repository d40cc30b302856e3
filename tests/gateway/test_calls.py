"""Calls outlive their streams by the end grace: one start, one end with frames per leg, whatever the
streams do."""

from __future__ import annotations

from pipeline.gateway.calls import CallInfo


def audio(n: int, value: int = 7) -> bytes:
    return bytes([value]) * n


def test_a_call_starts_once_and_ends_once_after_the_grace(calls, sink, clock, metrics) -> None:  # type: ignore[no-untyped-def]
    att = calls.attach("s1", "CA1", CallInfo("acme", "agent-7", "billing"), ["customer", "agent"])
    calls.write(att, "customer", 0, audio(1600))
    calls.write(att, "agent", 0, audio(1650))
    calls.detach("s1", "CA1", "stop")
    clock.advance(4.9)
    assert calls.tick() == []
    clock.advance(0.2)
    assert calls.tick() == ["CA1"]
    assert len(sink.starts) == 1 and len(sink.ends) == 1
    start, end = sink.starts[0], sink.ends[0]
    assert (start.tenant, start.agent_id, start.queue, start.legs) == ("acme", "agent-7", "billing", ["agent", "customer"])
    assert end.frame_counts == {"customer": 10, "agent": 11}  # the agent's last frame is short (50 samples)
    assert end.reason == "stop"
    assert [f.seq for f in sink.leg_frames("agent")] == list(range(11))
    assert metrics.value("callqa_gateway_calls_ended_total", reason="stop") == 1
    assert calls.calls == {}


def test_a_stream_within_the_grace_continues_the_call_on_its_clock(calls, sink, clock) -> None:  # type: ignore[no-untyped-def]
    first = calls.attach("s1", "CA1", CallInfo(), ["customer"])
    calls.write(first, "customer", 0, audio(800))  # 100 ms
    calls.detach("s1", "CA1", "stop")
    clock.advance(2.0)  # a transfer: 2 s with no stream
    second = calls.attach("s2", "CA1", CallInfo(), ["customer"])
    assert second.continued and second.base == 800 + 16000
    calls.write(second, "customer", 0, audio(160, 9))
    calls.detach("s2", "CA1", "disconnected")
    clock.advance(5.0)
    calls.tick()
    assert len(sink.starts) == 1 and len(sink.ends) == 1
    seqs = [f.seq for f in sink.leg_frames("customer")]
    assert seqs[:5] == [0, 1, 2, 3, 4] and seqs[-1] == 105  # the gap is silence, the clock kept going
    assert sink.ends[0].frame_counts == {"customer": 106}
    assert sink.ends[0].reason == "disconnected"


def test_a_stream_after_the_grace_is_a_new_call(calls, sink, clock) -> None:  # type: ignore[no-untyped-def]
    calls.attach("s1", "CA1", CallInfo(), ["customer"])
    calls.detach("s1", "CA1", "stop")
    clock.advance(6)
    calls.tick()
    calls.attach("s2", "CA1", CallInfo(), ["customer"])
    assert [e.event_type for e in sink.starts + sink.ends] == ["start", "start", "end"]


def test_concurrent_streams_of_a_call_share_its_clock_and_one_writer_per_leg(calls, sink, clock) -> None:  # type: ignore[no-untyped-def]
    inbound = calls.attach("s1", "CA1", CallInfo(), ["customer"])
    calls.write(inbound, "customer", 0, audio(1600))
    outbound = calls.attach("s2", "CA1", CallInfo(), ["agent", "customer"])
    assert outbound.base == inbound.base and outbound.legs == frozenset({"agent"})
    assert calls.write(outbound, "customer", 0, audio(160)) is False
    assert calls.write(outbound, "agent", 0, audio(160))
    calls.detach("s1", "CA1", "stop")
    clock.advance(10)
    assert calls.tick() == []  # s2 is still open
    calls.detach("s2", "CA1", "stop")
    clock.advance(10)
    assert calls.tick() == ["CA1"]
    assert sink.starts[0].legs == ["customer"] and sink.ends[0].legs == ["customer", "agent"]


def test_a_hold_reports_its_length_in_call_time(calls, sink) -> None:  # type: ignore[no-untyped-def]
    att = calls.attach("s1", "CA1", CallInfo(), ["customer", "agent"])
    calls.write(att, "customer", 0, audio(8000))
    calls.hold(att)
    calls.skip(att, 16000)
    calls.unhold(att)
    assert sink.holds == [("CA1", "held", 1000), ("CA1", "resumed", 2000)]


def test_shutdown_ends_every_call_at_once(calls, sink) -> None:  # type: ignore[no-untyped-def]
    att = calls.attach("s1", "CA1", CallInfo(), ["customer"])
    calls.write(att, "customer", 0, audio(320))
    calls.attach("s2", "CA2", CallInfo(), ["customer"])
    calls.detach("s2", "CA2", "stop")
    calls.end_all("gateway shutdown")
    assert {e.call_id: e.reason for e in sink.ends} == {"CA1": "gateway shutdown", "CA2": "stop"}
    assert {e.call_id: e.frame_counts for e in sink.ends} == {"CA1": {"customer": 2}, "CA2": {}}


def test_messages_of_100_ms_carry_the_call_time_and_a_continued_stream_starts_on_a_message(
        sink, metrics, clock) -> None:  # type: ignore[no-untyped-def]
    from pipeline.gateway.calls import OpenCalls

    calls = OpenCalls(sink, metrics, end_grace_s=5.0, clock=clock, message_ms=100)  # CALLQA_AUDIO_MESSAGE_MS
    first = calls.attach("s1", "CA1", CallInfo(), ["customer"])
    calls.write(first, "customer", 0, audio(1000))  # 125 ms: one message, a quarter of the next
    calls.detach("s1", "CA1", "stop")
    clock.advance(0.5)
    second = calls.attach("s2", "CA1", CallInfo(), ["customer"])
    assert second.base == 7 * 800  # 1000 samples and 0.5 s of no stream, up to the next message
    calls.write(second, "customer", 0, audio(900, 9))
    calls.detach("s2", "CA1", "stop")
    clock.advance(5.1)
    calls.tick()
    frames = sink.leg_frames("customer")
    # Messages 1-6 are the gap (silence), 7 and 8 the second stream's audio, 8 short at the end.
    assert [(f.seq, f.start_ms, len(f.payload)) for f in frames] == [*[(k, 100 * k, 800) for k in range(8)], (8, 800, 100)]
    assert frames[7].payload == audio(800, 9) and frames[8].payload == audio(100, 9)
    assert sink.ends[0].frame_counts == {"customer": 9}
