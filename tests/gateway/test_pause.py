"""Secure pause in the gateway's core (pipeline/gateway/pause.py, calls.py): audio that comes while a call is
paused is never built into a frame, the legs' clocks go on, the call's events say when; refusals change
nothing. No sockets, no Kafka: a recording sink (and the real outbox where the order of events matters)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.gateway.calls import CallInfo, OpenCalls
from pipeline.gateway.outbox import Outbox
from pipeline.gateway.pause import Refusal, SecurePause

TOKEN = "operator-token-for-the-core-tests"
FRAME = 160  # 20 ms at 8 kHz (the core's default message span)


def secure(calls: OpenCalls, metrics: Any, token: str = TOKEN) -> SecurePause:
    return SecurePause(calls, metrics, token)


def test_audio_while_paused_is_dropped_and_later_audio_keeps_its_place(calls, sink, metrics, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    control = secure(calls, metrics)
    att = calls.attach("s1", "CA1", CallInfo("acme"), ["customer"])
    before, during, after = mulaw_audio(1.0, seed=1), mulaw_audio(1.0, seed=2), mulaw_audio(1.0, seed=3)
    calls.write(att, "customer", 0, before)  # 0-1 s
    assert control.pause("CA1") == {"call_id": "CA1", "paused": True, "paused_at_ms": 1_000}
    calls.write(att, "customer", 8_000, during)  # 1-2 s: paused
    assert control.resume("CA1") == {"call_id": "CA1", "paused": False, "resumed_at_ms": 2_000, "paused_ms": 1_000}
    calls.write(att, "customer", 16_000, after)  # 2-3 s
    calls.end("CA1")
    # Frames 0-49 (0-1 s) and 100-149 (2-3 s); none for 1-2 s, and nothing of its audio anywhere.
    assert [f.seq for f in sink.frames] == [*range(50), *range(100, 150)]
    assert b"".join(f.payload for f in sink.frames) == before + after
    assert sink.pauses == [("CA1", "paused", 1_000, None), ("CA1", "unpaused", 2_000, None)]
    assert sink.ends[0].frame_counts == {"customer": 150}
    assert metrics.value("callqa_gateway_secure_pause_dropped_seconds_total") == 1.0
    assert metrics.value("callqa_gateway_secure_pause_seconds_total") == 1.0


def test_a_frame_begun_before_the_pause_leaves_with_silence_after_its_audio(calls, sink, metrics, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    control = secure(calls, metrics)
    att = calls.attach("s1", "CA1", CallInfo(), ["agent", "customer"])
    first = mulaw_audio(100 / 8000, seed=4)  # 100 samples: most of one frame
    calls.write(att, "agent", 0, first)
    control.pause("CA1")
    calls.write(att, "agent", 100, mulaw_audio(0.5, seed=5))  # both legs, 0.5 s each, while paused
    calls.write(att, "customer", 0, mulaw_audio(0.6, seed=6))
    assert [(f.leg, f.seq, f.payload) for f in sink.frames] == [("agent", 0, first + b"\xff" * (FRAME - 100))]
    # Per leg: 0.5 s of the agent and 0.6 s of the customer.
    assert metrics.value("callqa_gateway_secure_pause_dropped_seconds_total") == pytest.approx(1.1)


def test_bad_requests_are_refused_and_change_nothing(calls, sink, metrics) -> None:  # type: ignore[no-untyped-def]
    control = secure(calls, metrics)
    calls.attach("s1", "CA1", CallInfo(), ["customer"])
    with pytest.raises(Refusal) as unknown:
        control.pause("CA-nope")
    assert (unknown.value.status, unknown.value.message) == (404, "no open call CA-nope on this gateway")
    with pytest.raises(Refusal) as not_paused:
        control.resume("CA1")
    assert (not_paused.value.status, not_paused.value.message) == (409, "call CA1 is not paused")
    control.pause("CA1")
    with pytest.raises(Refusal) as twice:
        control.pause("CA1")
    assert twice.value.status == 409 and "already paused" in twice.value.message
    assert sink.pauses == [("CA1", "paused", 0, None)]  # the one pause that was asked and taken


def test_the_operator_token_is_checked(calls, metrics) -> None:  # type: ignore[no-untyped-def]
    control = secure(calls, metrics)
    for header, why in [(None, "missing bearer token"), ("Basic abc", "missing bearer token"),
                        ("Bearer wrong-token-of-some-length", "wrong operator token")]:
        with pytest.raises(Refusal) as refused:
            control.check_token(header)
        assert refused.value.status == 401 and refused.value.message.startswith(why)
    control.check_token(f"Bearer {TOKEN}")
    with pytest.raises(Refusal) as off:
        secure(calls, metrics, token="").check_token(f"Bearer {TOKEN}")
    assert off.value.status == 503


def test_a_pause_never_resumed_ends_with_the_call_before_its_end_event(metrics, clock, mulaw_audio) -> None:  # type: ignore[no-untyped-def]
    outbox = Outbox(metrics, leg_buffer_s=30.0, message_ms=20)
    calls = OpenCalls(outbox, metrics, end_grace_s=5.0, clock=clock)
    control = secure(calls, metrics)
    att = calls.attach("s1", "CA1", CallInfo("acme", "agent-7"), ["customer"])
    calls.write(att, "customer", 0, mulaw_audio(0.5, seed=7))
    control.pause("CA1")
    calls.write(att, "customer", 4_000, mulaw_audio(1.5, seed=8))  # 0.5-2 s, dropped
    calls.detach("s1", "CA1", "stop")
    clock.advance(5.0)
    assert calls.tick() == ["CA1"]
    batch = outbox.take(1000, wait_s=0)
    assert [(e.event_type, e.offset_ms, e.reason) for e in batch.starts] == [
        ("start", -1, None), ("pause", 500, None), ("unpause", 2_000, "call ended")]
    assert all((e.tenant, e.agent_id) == ("acme", "agent-7") for e in batch.starts)
    assert [f.seq for f in batch.frames] == list(range(25))  # the 0.5 s before the pause only
    assert batch.ends == []  # the end goes once Kafka took the call's frames (Outbox._take_ends)
    outbox.acknowledged(batch)
    assert [(e.event_type, e.frame_counts) for e in outbox.take(1000, wait_s=0).ends] == [("end", {"customer": 100})]
    assert "CA1" not in calls.calls


def test_the_operator_token_is_the_api_token_else_the_local_token_file_on_loopback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pydantic import SecretStr

    from pipeline.config import Settings
    from pipeline.gateway.pause import client_token, control_urls, operator_token

    local = Settings(state_dir=tmp_path, api_token=SecretStr(""))
    assert operator_token(local, loopback=False) == "" and not (tmp_path / "api-token").exists()
    made = operator_token(local, loopback=True)  # as a local worker makes it: the command line reads it too
    assert len(made) >= 16 and (tmp_path / "api-token").stat().st_mode & 0o777 == 0o600
    assert client_token(local) == made
    configured = Settings(state_dir=tmp_path, api_token=SecretStr("x" * 20))
    assert operator_token(configured, loopback=False) == "x" * 20 == client_token(configured)
    assert operator_token(Settings(state_dir=tmp_path, api_token=SecretStr("short")), loopback=True) == ""

    assert control_urls(Settings(gateway_metrics_host="0.0.0.0", gateway_metrics_port=9465)) == [
        "http://127.0.0.1:9465"]
    assert control_urls(Settings(gateway_control_urls=" http://gw-a:9465/, http://gw-b:9465")) == [
        "http://gw-a:9465", "http://gw-b:9465"]
