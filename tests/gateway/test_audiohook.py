"""Genesys AudioHook v2 session state machine, without sockets: messages in, replies, frames and call
events out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.gateway.audiohook import PROBE_CONVERSATION, AudioHookSession, State


@pytest.fixture
def client(audiohook_client):  # type: ignore[no-untyped-def]
    return audiohook_client()


@pytest.fixture
def session(calls, metrics, client) -> AudioHookSession:  # type: ignore[no-untyped-def]
    return AudioHookSession(calls, metrics, "stream-1", session_id=client.session_id,
                            organization_id=client.organization_id)


def send(session: AudioHookSession, client: Any, text: str) -> list[dict[str, Any]]:
    replies = session.on_text(text)
    for r in replies:
        client.saw(r)
    return replies


def test_open_is_answered_opened_with_the_chosen_media(session, client) -> None:  # type: ignore[no-untyped-def]
    [opened] = send(session, client, client.open(agent_id="agent-7", queue="billing"))
    assert opened["type"] == "opened" and opened["seq"] == 1 and opened["clientseq"] == 1
    assert opened["id"] == client.session_id
    assert opened["parameters"]["media"] == [{"type": "audio", "format": "PCMU", "channels": ["external", "internal"],
                                               "rate": 8000}]
    start = session.calls.sink.starts[0]
    assert (start.call_id, start.tenant, start.agent_id, start.queue) == (client.conversation_id, client.organization_id,
                                                                           "agent-7", "billing")
    [pong] = send(session, client, client.message("ping", {"rtt": "PT0.05S"}))
    assert (pong["type"], pong["seq"], pong["clientseq"]) == ("pong", 2, 2)
    [updated] = send(session, client, client.message("update", {"language": "es-ES"}))
    assert updated["type"] == "updated"


def test_stereo_audio_is_split_by_the_chosen_channel_order(session, client, sink, clock, mulaw_audio, interleave) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open(channels=("internal", "external")))
    agent, customer = mulaw_audio(0.5, 1), mulaw_audio(0.5, 2)
    stereo = interleave(agent, customer)
    for at in range(0, len(stereo), 1600):  # 100 ms messages
        assert session.on_binary(stereo[at:at + 1600]) == []
    assert b"".join(f.payload for f in sink.leg_frames("agent")) == agent
    assert b"".join(f.payload for f in sink.leg_frames("customer")) == customer
    assert send(session, client, client.message("close", {"reason": "end"})) == []
    assert session.state is State.CLOSING
    [closed] = session.closed_message()
    assert closed["type"] == "closed"
    session.socket_closed("disconnected")
    clock.advance(10)
    session.calls.tick()
    assert sink.ends[0].frame_counts == {"agent": 25, "customer": 25}
    assert sink.ends[0].reason == "close (end)"


def test_a_probe_is_answered_and_produces_nothing(calls, metrics, sink, audiohook_client, mulaw_audio, interleave) -> None:  # type: ignore[no-untyped-def]
    client = audiohook_client(conversation_id=PROBE_CONVERSATION)
    session = AudioHookSession(calls, metrics, "probe")
    assert send(session, client, client.open())[0]["type"] == "opened"
    session.on_binary(interleave(mulaw_audio(0.1), mulaw_audio(0.1)))
    send(session, client, client.message("close", {"reason": "end"}))
    assert session.closed_message()[0]["type"] == "closed"
    session.socket_closed("disconnected")
    assert (sink.starts, sink.frames, sink.ends, calls.calls) == ([], [], [], {})


def test_a_pci_pause_sends_no_frames_and_moves_the_clocks_on(session, client, sink, mulaw_audio, interleave) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open())
    session.on_binary(interleave(mulaw_audio(1.0, 1), mulaw_audio(1.0, 2)))
    send(session, client, client.message("paused"))
    assert session.on_binary(interleave(mulaw_audio(0.1), mulaw_audio(0.1))) == []  # in flight: dropped
    send(session, client, client.message("resumed", {"start": "PT1S", "discarded": "PT12.5S"}))
    session.on_binary(interleave(mulaw_audio(0.04, 3), mulaw_audio(0.04, 4)))
    seqs = [f.seq for f in sink.leg_frames("customer")]
    assert seqs == list(range(50)) + [675, 676]  # 12.5 s = 625 frames with none sent
    assert sink.holds == [(session.call_id, "held", 1000), (session.call_id, "resumed", 12500)]
    assert session.metrics.value("callqa_gateway_pauses_total", reason="pci") == 1


def test_discarded_audio_moves_the_clocks_on_without_a_hold(session, client, sink, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open(channels=("external",)))
    session.on_binary(mulaw_audio(0.02))
    send(session, client, client.message("discarded", {"start": "PT0.02S", "discarded": "PT0.2S"}))
    session.on_binary(mulaw_audio(0.02))
    assert [f.seq for f in sink.frames] == [0, 11]
    assert sink.holds == []


def test_backpressure_pauses_the_client_and_resumes_it_once_drained(session, client, sink, mulaw_audio, interleave) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open())
    sink.fullness = 0.8
    [pause] = session.on_binary(interleave(mulaw_audio(0.02), mulaw_audio(0.02)))
    assert pause["type"] == "pause"
    assert session.check_flow() == []  # asked once
    send(session, client, client.message("paused"))
    sink.fullness = 0.1
    [resume] = session.check_flow()
    assert resume["type"] == "resume"
    send(session, client, client.message("resumed", {"start": "PT0.02S", "discarded": "PT0.5S"}))
    assert sink.holds == []  # the gateway's own pause is no hold
    assert session.metrics.value("callqa_gateway_pauses_total", reason="backpressure") == 1


@pytest.mark.parametrize(("break_it", "kind"), [
    (lambda c: "{nope", "malformed"),
    (lambda c: json.dumps({**json.loads(c.message("ping")), "seq": 7}), "sequence"),
    (lambda c: json.dumps({**json.loads(c.message("ping")), "id": "someone-else"}), "session_id"),
    (lambda c: c.message("dance"), "unknown_type"),
])
def test_bad_messages_get_a_disconnect_with_reason_error(session, client, metrics, break_it, kind) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open())
    [disconnect] = send(session, client, break_it(client))
    assert disconnect["type"] == "disconnect" and disconnect["parameters"]["reason"] == "error"
    assert session.state is State.ERROR and session.error is not None
    assert metrics.value("callqa_gateway_protocol_errors_total", protocol="audiohook", kind=kind) == 1
    client.seq = session.clientseq  # whatever it sent, the client then closes
    assert [r["type"] for r in send(session, client, client.message("close", {"reason": "error"}))] == ["closed"]


@pytest.mark.parametrize(("audio", "kind", "code"), [
    (b"\x01\x02\x03", "partial_samples", 1007),
    (b"\x01" * 2 * 8001, "too_long", 1009),
])
def test_bad_audio_gets_a_disconnect(session, client, audio, kind, code) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open())
    [disconnect] = session.on_binary(audio)
    assert disconnect["type"] == "disconnect"
    assert (session.error.kind, session.error.code) == (kind, code)


def test_audio_before_open_is_an_error(session, client) -> None:  # type: ignore[no-untyped-def]
    [disconnect] = session.on_binary(b"\x01\x02")
    assert disconnect["type"] == "disconnect" and session.error.kind == "media_before_start"


def test_open_for_another_organization_is_unauthorized(calls, metrics, sink, client) -> None:  # type: ignore[no-untyped-def]
    session = AudioHookSession(calls, metrics, "s", organization_id="the-signed-one")
    [disconnect] = send(session, client, client.open())
    assert disconnect["parameters"]["reason"] == "unauthorized"
    assert sink.starts == []


def test_no_supported_media_is_an_error(session, client) -> None:  # type: ignore[no-untyped-def]
    opened = json.loads(client.open())
    opened["parameters"]["media"] = [{"type": "audio", "format": "L16", "channels": ["external"], "rate": 16000}]
    [disconnect] = send(session, client, json.dumps(opened))
    assert disconnect["type"] == "disconnect" and session.error.kind == "media_format"


def test_phone_numbers_of_the_participant_go_nowhere(session, client, sink, mulaw_audio, interleave) -> None:  # type: ignore[no-untyped-def]
    send(session, client, client.open())
    session.on_binary(interleave(mulaw_audio(0.1), mulaw_audio(0.1)))
    session.calls.end(session.call_id)
    text = json.dumps([e.to_record() for e in sink.starts + sink.ends])
    assert "5551234567" not in text and "7654321" not in text and "Jane" not in text
