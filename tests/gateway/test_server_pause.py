"""Secure pause against the real gateway and the real broker: a live Twilio call paused and resumed over
HTTP with the operator's token (and with `callqa pause` / `callqa resume` across two gateways); what reaches
the topics is read back. Audio sent during the pause is on no topic, the call's events say when, the audio
after the resume is back at its place; bad requests are refused and change nothing."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from pipeline.contracts import AudioFrame, CallEvent
from tests.gateway.conftest import OPERATOR_TOKEN, TwilioMessages

pytestmark = pytest.mark.broker

CHUNK_MS = 20


def control_url(gw: Any) -> str:
    return f"http://127.0.0.1:{gw.server.metrics_port}"


async def post(url: str, token: str | None = OPERATOR_TOKEN) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session, session.post(url, headers=headers) as response:
        return response.status, await response.json()


def media(tw: TwilioMessages, start_ms: int, audio: dict[str, bytes]) -> list[str]:
    """Both tracks' media messages for ``audio`` starting at ``start_ms`` of the stream, 20 ms each."""
    step = CHUNK_MS * 8
    return [tw.media(track, start_ms + at // 8, pcm[at:at + step])
            for at in range(0, max(len(a) for a in audio.values()), step) for track, pcm in audio.items()]


async def taken_up_to(gw: Any, call_id: str, samples: int) -> None:
    """Until every leg of the call has been placed up to ``samples`` (the gateway read what was sent)."""
    for _ in range(500):
        call = gw.server.calls.calls.get(call_id)
        if call is not None and call.timelines and all(t.position >= samples for t in call.timelines.values()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the gateway did not take {call_id}'s audio up to sample {samples}")


def leg_frames(frames: list[AudioFrame], call_id: str, leg: str) -> list[AudioFrame]:
    return sorted((f for f in frames if f.call_id == call_id and f.leg == leg), key=lambda f: f.seq)


def of_call(events: list[CallEvent], call_id: str) -> list[tuple[str, int, str | None]]:
    return [(e.event_type, e.offset_ms, e.reason) for e in events if e.call_id == call_id]


async def test_audio_sent_while_paused_reaches_no_topic_and_the_events_say_when(
        start_gateway, twilio_messages, mulaw_audio, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    url = f"{control_url(gw)}/calls/CA-paused"
    before = {t: mulaw_audio(1.0, seed=s) for t, s in (("inbound", 1), ("outbound", 2))}
    during = {t: mulaw_audio(1.0, seed=s) for t, s in (("inbound", 3), ("outbound", 4))}
    after = {t: mulaw_audio(1.0, seed=s) for t, s in (("inbound", 5), ("outbound", 6))}
    tw = twilio_messages("CA-paused")
    async with connect(gw.ws("/twilio")) as ws:
        for message in [tw.start(), *media(tw, 0, before)]:
            await ws.send(message)
        await taken_up_to(gw, "CA-paused", 8_000)
        assert await post(f"{url}/pause") == (200, {"call_id": "CA-paused", "paused": True, "paused_at_ms": 1_000})
        for message in media(tw, 1_000, during):
            await ws.send(message)
        await taken_up_to(gw, "CA-paused", 16_000)
        assert await post(f"{url}/resume") == (200, {"call_id": "CA-paused", "paused": False,
                                                     "resumed_at_ms": 2_000, "paused_ms": 1_000})
        for message in [*media(tw, 2_000, after), tw.stop()]:
            await ws.send(message)
    frames, events = await read_calls(gw.settings, frames=200, events=4)
    # inbound is the customer, outbound the agent (Twilio's default): 0-1 s is frames 0-49, 2-3 s is 100-149.
    for leg, track in (("customer", "inbound"), ("agent", "outbound")):
        got = leg_frames(frames, "CA-paused", leg)
        assert [f.seq for f in got] == [*range(50), *range(100, 150)]
        assert b"".join(f.payload for f in got) == before[track] + after[track]
    assert of_call(events, "CA-paused") == [("start", -1, None), ("pause", 1_000, None), ("unpause", 2_000, None),
                                           ("end", -1, "stop")]
    end = events[-1]
    assert end.frame_counts == {"agent": 150, "customer": 150}
    metrics = gw.server.metrics
    assert metrics.value("callqa_gateway_secure_pause_dropped_seconds_total") == pytest.approx(2.0)  # 1 s a leg
    assert metrics.value("callqa_gateway_secure_pauses_total", action="pause", outcome="done") == 1
    assert metrics.value("callqa_gateway_secure_pauses_total", action="resume", outcome="done") == 1


async def test_a_pause_never_resumed_ends_with_the_call(start_gateway, twilio_messages, mulaw_audio,
                                                        read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    tw = twilio_messages("CA-never-resumed")
    async with connect(gw.ws("/twilio")) as ws:
        for message in [tw.start(("inbound",)), *media(tw, 0, {"inbound": mulaw_audio(0.5, seed=1)})]:
            await ws.send(message)
        await taken_up_to(gw, "CA-never-resumed", 4_000)
        status, _ = await post(f"{control_url(gw)}/calls/CA-never-resumed/pause")
        assert status == 200
        for message in [*media(tw, 500, {"inbound": mulaw_audio(0.5, seed=2)}), tw.stop()]:
            await ws.send(message)
    frames, events = await read_calls(gw.settings, frames=25, events=4)
    assert [f.seq for f in leg_frames(frames, "CA-never-resumed", "customer")] == list(range(25))
    assert of_call(events, "CA-never-resumed") == [("start", -1, None), ("pause", 500, None),
                                                   ("unpause", 1_000, "call ended"), ("end", -1, "stop")]
    assert events[-1].frame_counts == {"customer": 50}


async def test_bad_requests_are_refused_with_a_reason_and_change_nothing(start_gateway, twilio_messages, mulaw_audio,
                                                                         read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    base = f"{control_url(gw)}/calls"
    tw = twilio_messages("CA-refusals")
    audio = mulaw_audio(1.0, seed=1)
    async with connect(gw.ws("/twilio")) as ws:
        for message in [tw.start(("inbound",)), *media(tw, 0, {"inbound": audio[:4_000]})]:
            await ws.send(message)
        await taken_up_to(gw, "CA-refusals", 4_000)
        assert await post(f"{base}/CA-refusals/pause", token="not-the-operator-token") == (
            401, {"error": "wrong operator token"})
        assert (await post(f"{base}/CA-refusals/pause", token=None))[0] == 401
        assert await post(f"{base}/CA-unknown/pause") == (404, {"error": "no open call CA-unknown on this gateway"})
        # A SIP Call-ID may hold "@" or "/": sent percent-encoded, it arrives whole.
        assert await post(f"{base}/a%2Fb%40sbc.example/pause") == (
            404, {"error": "no open call a/b@sbc.example on this gateway"})
        assert await post(f"{base}/CA-refusals/resume") == (409, {"error": "call CA-refusals is not paused"})
        for message in [*media(tw, 500, {"inbound": audio[4_000:]}), tw.stop()]:
            await ws.send(message)
    frames, events = await read_calls(gw.settings, frames=50, events=2)
    assert b"".join(f.payload for f in leg_frames(frames, "CA-refusals", "customer")) == audio  # nothing dropped
    assert [e.event_type for e in events] == ["start", "end"]
    metrics = gw.server.metrics
    assert metrics.value("callqa_gateway_secure_pause_dropped_seconds_total") == 0
    assert metrics.value("callqa_gateway_secure_pauses_total", action="pause", outcome="unauthorized") == 2
    assert metrics.value("callqa_gateway_secure_pauses_total", action="pause", outcome="unknown_call") == 2
    assert metrics.value("callqa_gateway_secure_pauses_total", action="resume", outcome="conflict") == 1


async def callqa(*args: str, token: str = OPERATOR_TOKEN, urls: list[str]) -> tuple[int, str, str]:
    """`callqa ARGS` as a process (the gateways run on this test's event loop, so it must not block)."""
    env = {**os.environ, "CALLQA_API_TOKEN": token, "CALLQA_GATEWAY_CONTROL_URLS": ",".join(urls)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pipeline.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_callqa_pause_finds_the_gateway_holding_the_call_and_says_one_line_otherwise(
        start_gateway, twilio_messages, mulaw_audio, read_calls) -> None:  # type: ignore[no-untyped-def]
    other, holder = await start_gateway(), await start_gateway()
    urls = [control_url(other), control_url(holder)]
    tw = twilio_messages("CA-cli")
    async with connect(holder.ws("/twilio")) as ws:
        for message in [tw.start(("inbound",)), *media(tw, 0, {"inbound": mulaw_audio(0.5, seed=1)})]:
            await ws.send(message)
        await taken_up_to(holder, "CA-cli", 4_000)

        code, out, err = await callqa("pause", "CA-cli", urls=urls)
        assert (code, err) == (0, "") and f"call CA-cli paused at 0.5 s of the call by {urls[1]}" in out
        code, _, err = await callqa("pause", "CA-cli", urls=urls)  # again: refused by the one holding it
        assert code == 1 and err.count("\n") == 1
        assert err.startswith(f"error: {urls[1]} refused to pause call CA-cli: call CA-cli is already paused")
        code, _, err = await callqa("resume", "CA-cli", urls=urls, token="not-the-operator-token")
        assert code == 1 and err.startswith(f"error: {urls[0]} refused to resume call CA-cli: wrong operator token")
        code, out, err = await callqa("resume", "CA-cli", urls=urls)
        assert code == 0 and "call CA-cli resumed at 0.5 s of the call" in out and "after 0.0 s paused" in out

        code, out, err = await callqa("pause", "CA-nowhere", urls=[*urls, "http://127.0.0.1:9"])
        assert (code, out) == (1, "") and err.count("\n") == 1
        assert err.startswith(f"error: no gateway holds call CA-nowhere (asked {urls[0]}, {urls[1]}; not "
                              "reachable: http://127.0.0.1:9 (")
        assert "--verbose" in err  # details behind it, as every command's
        await ws.send(tw.stop())
    _, events = await read_calls(holder.settings, frames=25, events=4)
    assert [e.event_type for e in events] == ["start", "pause", "unpause", "end"]
    # The other gateway was asked first every time: CA-cli's two pauses and CA-nowhere's, CA-cli's resumes.
    counted = {(action, outcome): other.server.metrics.value("callqa_gateway_secure_pauses_total", action=action,
                                                             outcome=outcome)
               for action in ("pause", "resume") for outcome in ("done", "unknown_call", "unauthorized")}
    assert counted == {("pause", "done"): 0, ("pause", "unknown_call"): 3, ("pause", "unauthorized"): 0,
                       ("resume", "done"): 0, ("resume", "unknown_call"): 1, ("resume", "unauthorized"): 1}
    assert other.server.calls.calls == {}
