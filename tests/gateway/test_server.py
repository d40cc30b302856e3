"""The gateway in-process with real websocket clients and the real broker: what reaches the topics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import AudioFrame, CallEvent

pytestmark = pytest.mark.broker


def leg_audio(frames: list[AudioFrame], leg: str) -> bytes:
    return b"".join(f.payload for f in sorted(frames, key=lambda f: f.seq) if f.leg == leg)


def only(events: list[CallEvent], kind: str) -> CallEvent:
    matching = [e for e in events if e.event_type == kind]
    assert len(matching) == 1, f"{len(matching)} {kind} events: {events}"
    return matching[0]


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def recv_json(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


# ---- Twilio ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("message_ms", [20, Settings().audio_message_ms])
async def test_a_twilio_call_reaches_the_topics_as_sent(start_gateway, credentials, twilio_messages, twilio_headers,
                                                        recording_mulaw, read_calls, message_ms: int) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials, audio_message_ms=message_ms)
    customer, agent = recording_mulaw[:16000], recording_mulaw[8000:20000]  # 2 s and 1.5 s
    tw = twilio_messages("CA-live-1", tenant="acme", agent_id="agent-7", queue="billing", caller="+15551234567")
    url = gw.ws("/twilio/CA-live-1")  # a per-call path, as a load balancer routes on (the same endpoint)
    async with await connect(url, additional_headers=twilio_headers(url)) as ws:
        for message in [tw.connected(), tw.start(), *tw.chunks_of({"inbound": customer, "outbound": agent}),
                        tw.stop()]:
            await ws.send(message)
    counts = {"customer": -(-2000 // message_ms), "agent": -(-1500 // message_ms)}
    frames, events = await read_calls(gw.settings, frames=sum(counts.values()), events=2)
    assert leg_audio(frames, "customer") == customer and leg_audio(frames, "agent") == agent
    for leg, n in counts.items():
        assert sorted(f.seq for f in frames if f.leg == leg) == list(range(n))
        assert all(f.start_ms == f.seq * message_ms and f.call_id == "CA-live-1" for f in frames if f.leg == leg)
    start, end = only(events, "start"), only(events, "end")
    assert (start.tenant, start.agent_id, start.queue, start.legs) == ("acme", "agent-7", "billing",
                                                                       ["agent", "customer"])
    assert end.frame_counts == counts and end.reason == "stop"
    assert "5551234567" not in json.dumps([e.to_record() for e in events])


async def test_a_dropped_socket_ends_the_call_once(start_gateway, twilio_messages, recording_mulaw,
                                                   read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    tw = twilio_messages("CA-dropped")
    ws = await connect(gw.ws("/twilio"))
    for message in [tw.start(("inbound",)), *tw.chunks_of({"inbound": recording_mulaw[:4000]})]:
        await ws.send(message)
    await asyncio.sleep(0.2)
    assert ws.transport is not None
    ws.transport.abort()  # no stop, no close frame: the network went away
    frames, events = await read_calls(gw.settings, frames=25, events=2)
    assert only(events, "end").frame_counts == {"customer": 25}
    assert only(events, "end").reason == "disconnected"


async def test_an_idle_stream_is_closed_and_its_call_ended(start_gateway, twilio_messages, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_idle_timeout_s=0.5)
    tw = twilio_messages("CA-idle")
    async with connect(gw.ws("/twilio")) as ws:
        await ws.send(tw.start(("inbound",)))
        await ws.send(tw.media("inbound", 0, b"\x11" * 160))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
    _, events = await read_calls(gw.settings, events=2)
    assert only(events, "end").reason == "idle timeout"
    assert gw.server.metrics.value("callqa_gateway_protocol_errors_total", protocol="twilio", kind="idle") == 1


async def test_a_second_stream_within_the_grace_continues_the_call(start_gateway, twilio_messages,
                                                                   recording_mulaw, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_end_grace_s=3.0)
    first, second = twilio_messages("CA-transfer"), twilio_messages("CA-transfer")
    async with connect(gw.ws("/twilio")) as ws:
        for message in [first.start(("inbound",)), *first.chunks_of({"inbound": recording_mulaw[:8000]}),
                        first.stop()]:
            await ws.send(message)
    await until(lambda: not gw.server.sessions)  # the first stream is over (a transfer takes seconds)
    async with connect(gw.ws("/twilio")) as ws:
        for message in [second.start(("inbound",)), *second.chunks_of({"inbound": recording_mulaw[8000:16000]}),
                        second.stop()]:
            await ws.send(message)
    frames, events = await read_calls(gw.settings, events=2, idle_s=4.0)
    start, end = only(events, "start"), only(events, "end")
    seqs = sorted(f.seq for f in frames)
    assert seqs[:50] == list(range(50))  # the first stream's second
    assert len(seqs) >= 100 and seqs[-1] + 1 == end.frame_counts["customer"]  # the second stream after it
    real = b"".join(f.payload for f in sorted(frames, key=lambda f: f.seq) if f.payload != b"\xff" * 160)
    assert real == recording_mulaw[:16000]  # both streams' audio, in order, on one call
    assert start.call_id == end.call_id == "CA-transfer"


async def test_bad_input_ends_only_its_own_session(start_gateway, twilio_messages, recording_mulaw,
                                                   read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    good, bad = twilio_messages("CA-good"), twilio_messages("CA-bad")
    async with connect(gw.ws("/twilio")) as good_ws, connect(gw.ws("/twilio")) as bad_ws:
        await good_ws.send(good.start(("inbound",)))
        await bad_ws.send(bad.start(("inbound",)))
        await bad_ws.send("{this is not json")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(bad_ws.recv(), 10)
        for message in [*good.chunks_of({"inbound": recording_mulaw[:8000]}), good.stop()]:
            await good_ws.send(message)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    frames, events = await read_calls(gw.settings, frames=50, events=4)
    ends = {e.call_id: e for e in events if e.event_type == "end"}
    assert ends["CA-good"].frame_counts == {"customer": 50} and ends["CA-bad"].reason == "protocol error"
    assert leg_audio([f for f in frames if f.call_id == "CA-good"], "customer") == recording_mulaw[:8000]
    assert gw.server.metrics.value("callqa_gateway_protocol_errors_total", protocol="twilio", kind="malformed") == 1


# ---- AudioHook ---------------------------------------------------------------------------------------------
async def test_an_audiohook_session_reaches_the_topics_and_closes_after_flushing(
        start_gateway, credentials, audiohook_client, audiohook_headers, interleave, recording_mulaw,
        read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    client = audiohook_client(organization_id="acme")
    customer, agent = recording_mulaw[:16000], recording_mulaw[16000:32000]
    stereo = interleave(customer, agent)  # external, internal
    async with connect(gw.ws("/audiohook"), additional_headers=audiohook_headers(gw.ws("/audiohook"), client)) as ws:
        await ws.send(client.open(tenant="acme"))
        opened = client.saw(await recv_json(ws))
        assert opened["type"] == "opened"
        for at in range(0, len(stereo), 3200):  # 200 ms messages
            await ws.send(stereo[at:at + 3200])
        await ws.send(client.message("ping"))
        assert client.saw(await recv_json(ws))["type"] == "pong"
        await ws.send(client.message("close", {"reason": "end"}))
        closed = await recv_json(ws)
        assert closed["type"] == "closed"
        # closed came once the session's audio was acknowledged by Kafka
        assert gw.server.metrics.value("callqa_gateway_frames_acknowledged_total") == 200
    frames, events = await read_calls(gw.settings, frames=200, events=2)
    assert leg_audio(frames, "customer") == customer and leg_audio(frames, "agent") == agent
    end = only(events, "end")
    assert end.call_id == client.conversation_id and end.frame_counts == {"customer": 100, "agent": 100}
    assert only(events, "start").tenant == "acme"
    assert "5551234567" not in json.dumps([e.to_record() for e in events])


async def test_a_probe_produces_nothing(start_gateway, audiohook_client, interleave, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    client = audiohook_client(conversation_id="00000000-0000-0000-0000-000000000000")
    async with connect(gw.ws("/audiohook"), additional_headers=client.headers()) as ws:
        await ws.send(client.open())
        assert client.saw(await recv_json(ws))["type"] == "opened"
        await ws.send(interleave(b"\x01" * 1600, b"\x02" * 1600))
        await ws.send(client.message("close", {"reason": "end"}))
        assert (await recv_json(ws))["type"] == "closed"
    await asyncio.sleep(0.5)  # past the end grace
    assert await read_calls(gw.settings, idle_s=1.0) == ([], [])


async def test_a_pci_pause_mid_call_skips_its_time(start_gateway, audiohook_client, interleave, recording_mulaw,
                                                   read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    client = audiohook_client()
    before, after = recording_mulaw[:8000], recording_mulaw[8000:16000]
    async with connect(gw.ws("/audiohook"), additional_headers=client.headers()) as ws:
        await ws.send(client.open(channels=("external",)))
        client.saw(await recv_json(ws))
        await ws.send(before)
        await ws.send(client.message("paused"))
        await ws.send(client.message("resumed", {"start": "PT1S", "discarded": "PT30S"}))
        await ws.send(after)
        await ws.send(client.message("close", {"reason": "end"}))
        assert (await recv_json(ws))["type"] == "closed"
    frames, events = await read_calls(gw.settings, frames=100, events=4)
    assert sorted(f.seq for f in frames) == list(range(50)) + list(range(1550, 1600))
    assert only(events, "end").frame_counts == {"customer": 1600}
    assert [(e.event_type, e.offset_ms) for e in events] == [("start", -1), ("hold", 1000), ("resume", 31000),
                                                              ("end", -1)]
    assert gw.server.metrics.value("callqa_gateway_hold_seconds_total") == 30


async def test_an_audiohook_client_that_never_closes_after_an_error_is_closed_with_its_code(
        start_gateway, audiohook_client, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway()
    client = audiohook_client()
    async with connect(gw.ws("/audiohook"), additional_headers=client.headers()) as ws:
        await ws.send(client.open(channels=("external",)))
        client.saw(await recv_json(ws))
        client.seq += 5  # a sequence gap: a protocol error
        await ws.send(client.message("ping"))
        reply = client.saw(await recv_json(ws))
        assert reply["type"] == "disconnect" and reply["parameters"]["reason"] == "error"
        with pytest.raises(ConnectionClosed) as closed:  # we never send close: the gateway closes after ~2 s
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    _, events = await read_calls(gw.settings, events=2)
    assert only(events, "end").reason == "protocol error"


async def test_a_customconfig_tenant_cannot_move_a_signed_organizations_call_to_another_tenant(
        start_gateway, credentials, audiohook_client, audiohook_headers, interleave, recording_mulaw,
        read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    url = gw.ws("/audiohook")
    intruder = audiohook_client(organization_id="org-a")
    async with connect(url, additional_headers=audiohook_headers(url, intruder)) as ws:
        await ws.send(intruder.open(tenant="org-b", agent_id="a1"))
        disconnect = await recv_json(ws)
        assert (disconnect["type"], disconnect["parameters"]["reason"]) == ("disconnect", "unauthorized")
        assert "customConfig.tenant" in disconnect["parameters"]["info"]
        await ws.send(interleave(recording_mulaw[:1600], recording_mulaw[:1600]))  # audio after it goes nowhere
    honest = audiohook_client(organization_id="org-a")
    async with connect(url, additional_headers=audiohook_headers(url, honest)) as ws:
        await ws.send(honest.open(agent_id="a2"))
        assert honest.saw(await recv_json(ws))["type"] == "opened"
        await ws.send(interleave(recording_mulaw[:1600], recording_mulaw[:1600]))
        await ws.send(honest.message("close", {"reason": "end"}))
        assert (await recv_json(ws))["type"] == "closed"
    frames, events = await read_calls(gw.settings, frames=20, events=2)
    assert {f.call_id for f in frames} == {honest.conversation_id}
    assert [(e.call_id, e.event_type, e.tenant) for e in events] == [
        (honest.conversation_id, "start", "org-a"), (honest.conversation_id, "end", "org-a")]
    assert gw.server.metrics.value("callqa_gateway_auth_failures_total", protocol="audiohook", reason="tenant") == 1


# ---- refusals at the handshake ---------------------------------------------------------------------------
async def test_bad_credentials_are_refused_before_the_upgrade(start_gateway, credentials, twilio_headers,
                                                              audiohook_client, audiohook_headers) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    url = gw.ws("/twilio/CA-refused")
    for headers in ({}, twilio_headers(url, token="not-the-token"), twilio_headers(url + "?x=1")):
        with pytest.raises(InvalidStatus) as refused:
            await connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 403
    bare = gw.ws("/twilio")  # rightly signed, but a signature without the call could start any call
    with pytest.raises(InvalidStatus) as refused:
        await connect(bare, additional_headers=twilio_headers(bare))
    assert refused.value.response.status_code == 403
    client = audiohook_client()
    url = gw.ws("/audiohook")
    nonce = "a-nonce-of-thirty-two-characters"
    async with connect(url, additional_headers=audiohook_headers(url, client, nonce=nonce)):
        pass
    for headers in (audiohook_headers(url, client, nonce=nonce),  # replayed
                    audiohook_headers(url, client, key="wrong-key"),
                    audiohook_headers(url, client, secret="d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldC0zMmJ5dGU=")):
        with pytest.raises(InvalidStatus) as refused:
            await connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 401
    metrics = gw.server.metrics
    assert metrics.value("callqa_gateway_auth_failures_total", protocol="twilio", reason="missing_signature") == 1
    assert metrics.value("callqa_gateway_auth_failures_total", protocol="twilio", reason="bad_signature") == 2
    assert metrics.value("callqa_gateway_auth_failures_total", protocol="twilio", reason="call_sid_not_in_path") == 1
    for reason in ("replayed_nonce", "bad_api_key", "bad_signature"):
        assert metrics.value("callqa_gateway_auth_failures_total", protocol="audiohook", reason=reason) == 1


async def test_without_credentials_even_a_loopback_gateway_refuses_every_stream(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Loopback is no proof of trust (a TLS proxy on the same host forwards the internet): only the
    explicit CALLQA_GATEWAY_AUTH=off takes streams without credentials."""
    gw = await start_gateway(gateway_auth="on")
    for path, status in (("/twilio/CA-1", 403), ("/audiohook", 401)):
        with pytest.raises(InvalidStatus) as refused:
            await connect(gw.ws(path), additional_headers={"audiohook-organization-id": "o", "audiohook-session-id": "s"})
        assert refused.value.response.status_code == status
    metrics = gw.server.metrics
    assert metrics.value("callqa_gateway_auth_failures_total", protocol="twilio", reason="no_auth_token_configured") == 1
    assert metrics.value("callqa_gateway_auth_failures_total", protocol="audiohook", reason="no_api_key_configured") == 1
    async with connect((await start_gateway(gateway_auth="off")).ws("/twilio")):  # the opt-out, on loopback
        pass


async def test_auth_off_is_refused_on_any_host_but_loopback(kafka_settings) -> None:  # type: ignore[no-untyped-def]
    from pipeline.gateway.server import GatewayConfigError, GatewayServer

    server = GatewayServer(kafka_settings.model_copy(update={"gateway_auth": "off"}), producer=None)  # type: ignore[arg-type]
    with pytest.raises(GatewayConfigError, match="CALLQA_GATEWAY_AUTH=off is only allowed with a loopback host"):
        await server.start("0.0.0.0", 0)  # noqa: S104 - refused before it binds


async def test_a_signed_twilio_url_opens_only_its_own_call(start_gateway, credentials, twilio_messages,
                                                          twilio_headers, recording_mulaw, read_calls) -> None:  # type: ignore[no-untyped-def]
    """Twilio's signature covers the URL, not the messages: a handshake signed for /twilio/CA-mine whose
    start names another call (a captured signature replayed) is closed before it touches any call."""
    gw = await start_gateway(**credentials)
    url = gw.ws("/twilio/CA-mine")
    async with connect(url, additional_headers=twilio_headers(url)) as ws:
        await ws.send(twilio_messages("CA-someone-else").start(("inbound",)))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert gw.server.metrics.value("callqa_gateway_protocol_errors_total", protocol="twilio", kind="call_mismatch") == 1
    mine = twilio_messages("CA-mine")
    async with connect(url, additional_headers=twilio_headers(url)) as ws:
        for message in [mine.start(("inbound",)), *mine.chunks_of({"inbound": recording_mulaw[:1600]}), mine.stop()]:
            await ws.send(message)
    _, events = await read_calls(gw.settings, events=2)
    assert {e.call_id for e in events} == {"CA-mine"}  # nothing of the other call reached the topics


async def refused_code(url: str) -> int | None:
    """The close code of a session the gateway refuses after the upgrade (None: it stayed open)."""
    async with connect(url) as ws:
        try:
            await asyncio.wait_for(ws.recv(), 2)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None
        except TimeoutError:
            return None
    return None


async def test_a_source_over_its_session_or_handshake_limit_is_closed_1013_before_a_message_is_read(
        start_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_source_max_sessions=2, gateway_source_handshakes_per_s=1000)
    async with connect(gw.ws("/twilio")), connect(gw.ws("/twilio")):
        assert await refused_code(gw.ws("/twilio")) == 1013  # a third from the same address
    assert await refused_code(gw.ws("/twilio")) is None  # room again once they closed
    assert gw.server.metrics.value("callqa_gateway_limit_refusals_total", protocol="twilio",
                                   limit="source_sessions") == 1
    # Handshakes a second: a burst of four seconds' worth (2 at 0.5/s), then refused until it refills.
    flood = await start_gateway(gateway_source_handshakes_per_s=0.5)
    sockets = [await connect(flood.ws("/twilio")) for _ in range(4)]  # within milliseconds
    metrics = flood.server.metrics
    try:
        codes = []
        for ws in sockets[2:]:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            codes.append(closed.value.rcvd.code if closed.value.rcvd else None)
        assert codes == [1013, 1013]
        assert metrics.value("callqa_gateway_limit_refusals_total", protocol="twilio", limit="source_handshake_rate") == 2
        assert metrics.value("callqa_gateway_sessions_active", protocol="twilio") == 2  # the first two go on
    finally:
        for ws in sockets:
            await ws.close()


async def test_a_session_sending_faster_than_its_message_limit_is_closed_1008(start_gateway, twilio_messages,
                                                                           recording_mulaw) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_session_messages_per_s=50)
    call = twilio_messages("CA-flood")
    async with connect(gw.ws("/twilio")) as ws:
        await ws.send(call.start(("inbound",)))
        with pytest.raises(ConnectionClosed) as closed:
            for message in call.chunks_of({"inbound": recording_mulaw[:160 * 400]}):  # 400 messages at once
                await ws.send(message)
            # The close comes at once, but its handshake waits behind the flood's queued messages,
            # which nothing reads any more: up to the close timeout (10 s) before the socket goes.
            await asyncio.wait_for(ws.recv(), 40)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "messages a second" in closed.value.rcvd.reason
    assert gw.server.metrics.value("callqa_gateway_limit_refusals_total", protocol="twilio",
                                   limit="session_message_rate") == 1


async def test_sessions_over_the_limit_get_503(start_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_max_sessions=2)
    async with connect(gw.ws("/twilio")), connect(gw.ws("/twilio")):
        with pytest.raises(InvalidStatus) as refused:
            await connect(gw.ws("/twilio"))
        assert refused.value.response.status_code == 503
    await asyncio.sleep(0.1)
    async with connect(gw.ws("/twilio")):  # room again once they closed
        pass


async def test_healthz_is_plain_http_and_metrics_only_on_the_operators_listener(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """The public port faces the internet: it answers /healthz (for a load balancer) but not /metrics,
    which is on a listener of its own, on loopback unless CALLQA_GATEWAY_METRICS_HOST says otherwise."""
    gw = await start_gateway()
    public = gw.url.replace("ws://", "http://")
    operators = f"http://127.0.0.1:{gw.server.metrics_port}"

    def get(url: str) -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.headers["Content-Type"], r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers["Content-Type"], e.read().decode()

    status, _, body = await asyncio.to_thread(get, public + "/healthz")
    assert (status, body) == (200, "ok\n")
    status, _, body = await asyncio.to_thread(get, public + "/metrics")
    assert status == 404 and "callqa_gateway" not in body
    assert (await asyncio.to_thread(get, public + "/elsewhere"))[0] == 404
    assert gw.server.metrics_port not in (0, int(public.rsplit(":", 1)[1]))
    status, content_type, body = await asyncio.to_thread(get, operators + "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert "callqa_gateway_sessions_active" in body
    assert (await asyncio.to_thread(get, operators + "/healthz"))[:3:2] == (200, "ok\n")
    assert Settings.model_fields["gateway_metrics_host"].default == "127.0.0.1"


class BrokenProducer(ContractProducer):
    """A producer with a bug: its send raises (a fault injected)."""

    def send(self, topic: str, key: str, message: Any, on_failure: Any = None) -> None:
        raise RuntimeError("injected sender fault")


async def test_a_gateway_whose_kafka_sender_died_fails_its_healthz(start_gateway, kafka_settings,
                                                                  twilio_messages) -> None:  # type: ignore[no-untyped-def]
    """The sender thread ended unseen on an exception while the sockets went on filling its buffers; now
    /healthz answers 503 with the reason, for a supervisor or load balancer to act on."""
    from pipeline.contracts import Serde

    gw = await start_gateway(producer=BrokenProducer.from_settings(kafka_settings, Serde.from_settings("")))
    async with connect(gw.ws("/twilio")) as ws:
        await ws.send(twilio_messages("CA-1").start(("inbound",)))
        await until(lambda: gw.server.sender.failure is not None)
    url = gw.url.replace("ws://", "http://") + "/healthz"

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert await asyncio.to_thread(get) == (503, "Kafka sender stopped: RuntimeError: injected sender fault\n")


# ---- back-pressure -----------------------------------------------------------------------------------------
class SlowProducer(ContractProducer):
    """Kafka as a slow cluster looks from here: each frame takes ``delay_s`` to hand over."""

    delay_s = 0.01

    def send(self, topic: str, key: str, message: Any, on_failure: Any = None) -> None:
        if isinstance(message, AudioFrame):
            time.sleep(self.delay_s)
        super().send(topic, key, message, on_failure)


def slow_producer(settings: Any) -> SlowProducer:
    from pipeline.contracts import Serde

    return SlowProducer.from_settings(settings, Serde.from_settings(""))  # type: ignore[return-value]


async def test_a_slow_kafka_pauses_audiohook_and_resumes_it(start_gateway, kafka_settings, audiohook_client,
                                                            interleave, recording_mulaw, read_calls,
                                                            audio_offsets) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(producer=slow_producer(kafka_settings), gateway_leg_buffer_s=0.4)
    client = audiohook_client()
    stereo = interleave(recording_mulaw[:16000], recording_mulaw[16000:32000])
    seen: list[str] = []
    async with connect(gw.ws("/audiohook"), additional_headers=client.headers()) as ws:
        await ws.send(client.open())
        client.saw(await recv_json(ws))
        at = 0
        while at < len(stereo) and "pause" not in seen:  # as fast as it can, until asked to pause
            await ws.send(stereo[at:at + 1600])  # 100 ms
            at += 1600
            try:
                reply = await recv_json(ws, timeout=0.02)
            except TimeoutError:
                continue
            seen.append(client.saw(reply)["type"])
        assert seen == ["pause"], "Kafka at 50 frames/s should have filled a 0.4 s buffer"
        await ws.send(client.message("paused"))
        seen.append(client.saw(await recv_json(ws))["type"])  # it drains, then resume comes
        await ws.send(client.message("resumed", {"start": f"PT{at / 16000}S", "discarded": "PT1S"}))
        await ws.send(stereo[at:at + 3200])  # 200 ms more: within the buffer, so no second pause
        await ws.send(client.message("close", {"reason": "end"}))
        seen.append((await recv_json(ws, timeout=15))["type"])
    assert seen == ["pause", "resume", "closed"]
    sent_frames = (at + 3200) // 2 // 160
    frames, events = await read_calls(gw.settings, frames=2 * sent_frames, events=2)
    assert gw.server.metrics.value("callqa_gateway_frames_dropped_total") == 0
    assert gw.server.metrics.value("callqa_gateway_delivery_failures_total") == 0
    for leg in ("customer", "agent"):
        seqs = sorted(f.seq for f in frames if f.leg == leg)
        # 1 s skipped, nothing lost. (Once in ~5 runs on 2 busy cores the customer's seq 0 and 1 were missing
        # with nothing dropped; the Twilio test below once missed its first 4 frames taken. audio_offsets
        # says whether Kafka holds them.)
        assert len(seqs) == sent_frames and seqs[-1] == sent_frames + 50 - 1, (
            leg, seqs, sent_frames, [(e.event_type, e.offset_ms, e.frame_counts) for e in events],
            len([f for f in frames if f.leg != leg]), audio_offsets(gw))
    assert only(events, "end").frame_counts == {"customer": sent_frames + 50, "agent": sent_frames + 50}


async def test_a_slow_kafka_drops_twilio_audio_oldest_first(start_gateway, kafka_settings, twilio_messages,
                                                            recording_mulaw, read_calls,
                                                            audio_offsets) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(producer=slow_producer(kafka_settings), gateway_leg_buffer_s=0.2)
    tw = twilio_messages("CA-slow")
    async with connect(gw.ws("/twilio")) as ws:
        for message in [tw.start(("inbound",)), *tw.chunks_of({"inbound": recording_mulaw[:16000]}), tw.stop()]:
            await ws.send(message)
    _, events = await read_calls(gw.settings, events=2, idle_s=1.0)
    dropped = gw.server.metrics.value("callqa_gateway_frames_dropped_total")
    assert dropped > 0
    frames, _ = await read_calls(gw.settings, frames=int(100 - dropped))
    seqs = sorted(f.seq for f in frames)
    # The newest audio is what was kept. (Once on a fresh-clone CI run 94..99 of 90..99 were read, with 90
    # dropped and no delivery failure: audio_offsets says whether Kafka holds the other 4.)
    assert len(seqs) == 100 - dropped and seqs[-1] == 99, (seqs, audio_offsets(gw))
    assert only(events, "end").frame_counts == {"customer": 100}  # the gap is the worker's to fill


# ---- shutdown ---------------------------------------------------------------------------------------------
async def test_shutdown_closes_open_streams_and_ends_their_calls(start_gateway, twilio_messages, recording_mulaw,
                                                                 read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(gateway_end_grace_s=60)
    tw = twilio_messages("CA-open-at-shutdown")
    async with connect(gw.ws("/twilio")) as ws:
        for message in [tw.start(("inbound",)), *tw.chunks_of({"inbound": recording_mulaw[:4000]})]:
            await ws.send(message)
        await asyncio.sleep(0.2)
        await gw.server.shutdown()
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    frames, events = await read_calls(gw.settings, frames=25, events=2)
    assert only(events, "end").reason == "gateway shutdown"
    assert only(events, "end").frame_counts == {"customer": 25} and len(frames) == 25


# ---- TLS -------------------------------------------------------------------------------------------------
async def test_tls_settings_serve_wss(start_gateway, tls_files, twilio_messages, read_calls) -> None:  # type: ignore[no-untyped-def]
    import ssl

    cert_file, key_file = tls_files
    gw = await start_gateway(gateway_tls_cert=cert_file, gateway_tls_key=key_file)
    client_tls = ssl.create_default_context(cafile=str(cert_file))
    tw = twilio_messages("CA-tls")
    async with connect(gw.ws("/twilio").replace("ws://", "wss://"), ssl=client_tls) as ws:
        for message in [tw.start(("inbound",)), tw.media("inbound", 0, b"\x11" * 160), tw.stop()]:
            await ws.send(message)
    frames, events = await read_calls(gw.settings, frames=1, events=2)
    assert [f.payload for f in frames] == [b"\x11" * 160] and only(events, "end").reason == "stop"
