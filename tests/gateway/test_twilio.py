"""Twilio Media Streams state machine, without sockets: messages in, call events and frames out."""

from __future__ import annotations

import json

import pytest

from pipeline.gateway.protocol import ProtocolError
from pipeline.gateway.twilio import TwilioStream


@pytest.fixture
def stream(calls, metrics) -> TwilioStream:  # type: ignore[no-untyped-def]
    return TwilioStream(calls, metrics, "stream-1")


def play(stream: TwilioStream, *messages: str) -> None:
    for m in messages:
        stream.on_text(m)


def test_both_tracks_become_the_call_legs_with_the_default_mapping(stream, sink, clock, twilio_messages, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1", tenant="acme", agent_id="agent-7", queue="billing", caller="+15551234567")
    customer, agent = mulaw_audio(1.0, 1), mulaw_audio(0.5, 2)
    play(stream, tw.connected(), tw.start(), *tw.chunks_of({"inbound": customer, "outbound": agent}), tw.stop())
    stream.close("disconnected")
    clock.advance(10)
    stream.calls.tick()
    start, end = sink.starts[0], sink.ends[0]
    assert (start.call_id, start.tenant, start.agent_id, start.queue) == ("CA1", "acme", "agent-7", "billing")
    assert b"".join(f.payload for f in sink.leg_frames("customer")) == customer
    assert b"".join(f.payload for f in sink.leg_frames("agent")) == agent
    assert end.frame_counts == {"customer": 50, "agent": 25}
    assert end.reason == "stop"
    # the caller's number in a custom parameter goes nowhere
    assert "5551234567" not in json.dumps([e.to_record() for e in sink.starts + sink.ends])


def test_inbound_leg_parameter_maps_inbound_to_the_agent(stream, sink, twilio_messages, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1", callqa_inbound_leg="agent")
    play(stream, tw.start(), tw.media("inbound", 0, mulaw_audio(0.02)))
    assert [f.leg for f in sink.frames] == ["agent"]


def test_audio_is_placed_by_timestamp_and_gaps_are_silence(stream, sink, twilio_messages, metrics, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1")
    chunk = mulaw_audio(0.02)
    play(stream, tw.start(("inbound",)), tw.media("inbound", 0, chunk), tw.media("inbound", 100, chunk))
    assert [f.seq for f in sink.frames] == [0, 1, 2, 3, 4, 5]
    assert sink.frames[1].payload == b"\xff" * 160
    assert metrics.value("callqa_gateway_audio_adjusted_seconds_total", kind="silence") == pytest.approx(0.08)


@pytest.mark.parametrize(("make", "code", "kind"), [
    (lambda tw: "{not json", 1007, "malformed"),
    (lambda tw: tw.media("inbound", 0, b"\x01" * 160), 1008, "media_before_start"),
    (lambda tw: json.dumps({"event": "media", "media": {"payload": "AAAA"}}), 1008, "media_before_start"),
    (lambda tw: json.dumps({"event": "start", "start": {"tracks": ["inbound"]}}), 1007, "malformed"),
])
def test_bad_first_messages_close_with_a_clear_code(stream, twilio_messages, metrics, make, code, kind) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as err:
        stream.on_text(make(twilio_messages("CA1")))
    assert err.value.code == code
    assert metrics.value("callqa_gateway_protocol_errors_total", protocol="twilio", kind=kind) == 1


def test_bad_media_after_start(stream, twilio_messages, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1")
    stream.on_text(tw.start())
    with pytest.raises(ProtocolError) as too_long:
        stream.on_text(tw.media("inbound", 0, mulaw_audio(1.5)))
    assert too_long.value.code == 1009
    bad = json.loads(tw.media("inbound", 20, b"\x01"))
    bad["media"]["payload"] = "%%%"
    with pytest.raises(ProtocolError) as not_base64:
        stream.on_text(json.dumps(bad))
    assert not_base64.value.code == 1007
    with pytest.raises(ProtocolError) as binary:
        stream.on_binary(b"\x00\x01")
    assert binary.value.code == 1003


def test_sequence_numbers_must_increase(stream, twilio_messages) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1")
    stream.on_text(tw.start())
    stream.on_text(tw.media("inbound", 0, b"\x01" * 160))
    tw.seq -= 1
    with pytest.raises(ProtocolError) as err:
        stream.on_text(tw.media("inbound", 20, b"\x01" * 160))
    assert err.value.kind == "sequence"


def test_unknown_and_bidirectional_events_are_counted_not_fatal(stream, twilio_messages, metrics) -> None:  # type: ignore[no-untyped-def]
    tw = twilio_messages("CA1")
    stream.on_text(tw.start())
    stream.on_text(json.dumps({"event": "mark", "mark": {"name": "x"}}))
    stream.on_text(json.dumps({"event": "brand-new"}))
    assert metrics.value("callqa_gateway_messages_ignored_total", protocol="twilio", kind="unknown") == 1
    assert metrics.value("callqa_gateway_messages_ignored_total", protocol="twilio", kind="mark") == 1


def test_an_unsupported_media_format_or_leg_name_is_refused(stream, twilio_messages) -> None:  # type: ignore[no-untyped-def]
    start = json.loads(twilio_messages("CA1").start())
    start["start"]["mediaFormat"]["sampleRate"] = 16000
    with pytest.raises(ProtocolError) as err:
        stream.on_text(json.dumps(start))
    assert err.value.code == 1003
    with pytest.raises(ProtocolError):
        TwilioStream(stream.calls, stream.metrics, "s2").on_text(
            twilio_messages("CA2", callqa_inbound_leg="supervisor").start())
