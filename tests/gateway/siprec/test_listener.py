"""Hostile input through the real listener (SipListener and its RTP ports on 127.0.0.1), without Kafka: the
calls go to a recording sink. The server's clock is a manual one, so its timers run only as far as a test
moves it; the listener's 20 ms tick runs them as it does in the gateway.

127.0.0.0/8 is all loopback on Linux, so a socket bound to 127.0.0.2 is a second host."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.gateway.calls import OpenCalls
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.siprec.client import RecordingClient, SrcOptions
from pipeline.gateway.siprec.message import SipMessage, StreamFramer, parse
from pipeline.gateway.siprec.metrics import SiprecMetrics
from pipeline.gateway.siprec.recorder import RecordingServer
from pipeline.gateway.siprec.rtp_send import packetize
from pipeline.gateway.siprec.sdp import parse_sdp
from pipeline.gateway.siprec.transport import SipListener, UdpMediaPorts
from tests.gateway.conftest import ManualClock, RecordingSink


class Gateway:
    def __init__(self, listener: SipListener, port: int, clock: ManualClock, sink: RecordingSink,
                 metrics: GatewayMetrics) -> None:
        self.listener, self.port, self.clock, self.sink, self.metrics = listener, port, clock, sink, metrics

    @property
    def server(self) -> RecordingServer:
        return self.listener.server

    def value(self, name: str, **labels: str) -> float:
        return float(self.metrics.value(name, **labels))


@pytest.fixture
async def listen() -> AsyncIterator[Callable[..., Any]]:
    started: list[SipListener] = []

    async def start(**settings: Any) -> Gateway:
        clock, sink, metrics = ManualClock(), RecordingSink(), GatewayMetrics()
        calls = OpenCalls(sink, metrics, end_grace_s=0.0, clock=clock, message_ms=200)
        media = UdpMediaPorts("127.0.0.1")
        server = RecordingServer(Settings(**settings), calls, media, SiprecMetrics(metrics.registry), "127.0.0.1",
                                 0, clock=clock)
        listener = SipListener(server, media)
        port, _ = await listener.start("127.0.0.1", 0)
        server.contact = ("127.0.0.1", port)
        started.append(listener)
        return Gateway(listener, port, clock, sink, metrics)

    yield start
    for listener in started:
        await listener.shutdown()


def udp(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(5)
    return s


async def receive(s: socket.socket) -> SipMessage:
    return parse(await asyncio.to_thread(s.recv, 65536))


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 10 s) for what the listener does with datagrams already sent."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the listener never got there")


def invite_bytes(client: RecordingClient) -> bytes:
    content_type, body = client.offer()
    return client._request("INVITE", body, content_type, [("require", "siprec")]).to_bytes()


def options_bytes(branch: str, cseq: str = "1 OPTIONS", length: str = "0", transport: str = "UDP") -> bytes:
    return (f"OPTIONS sip:srs@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/{transport} 127.0.0.1:5999;branch=z9hG4bK{branch}\r\n"
            f"From: <sip:src@127.0.0.1>;tag=1\r\nTo: <sip:srs@127.0.0.1>\r\nCall-ID: {branch}@test\r\n"
            f"CSeq: {cseq}\r\nMax-Forwards: 70\r\nContent-Length: {length}\r\n\r\n").encode()


async def test_a_spoofed_invite_gets_one_403_and_the_timers_never_send_it_again(listen) -> None:  # type: ignore[no-untyped-def]
    """One INVITE from a source not allowed: one 403, nothing kept. The clock then runs past Timer H with
    the listener ticking: the next datagram that source gets is the answer to its next request, not the
    INVITE's 403 sent again (a reflector sent it eleven times)."""
    gw = await listen(siprec_allow="10.0.0.0/8")
    client, s = RecordingClient(SrcOptions(port=gw.port)), udp()
    s.sendto(invite_bytes(client), ("127.0.0.1", gw.port))
    first = await receive(s)
    assert first.status == 403 and first.cseq[1] == "INVITE"
    assert gw.server.transactions == {}
    for _ in range(40):  # Timer G would fire at 0.5, 1, 2, 4, 4, ... s on this clock
        gw.clock.advance(1.0)
        await asyncio.sleep(0.03)  # a tick of the listener's
    s.sendto(options_bytes("after"), ("127.0.0.1", gw.port))
    after = await receive(s)
    assert after.status == 403 and after.cseq[1] == "OPTIONS"
    assert gw.value("callqa_siprec_refusals_total", reason="source_not_allowed") == 2
    s.close()
    client.close()


async def test_a_refused_host_repeating_a_known_branch_gets_403_not_the_200_with_sdp(listen) -> None:  # type: ignore[no-untyped-def]
    gw = await listen(siprec_allow="127.0.0.1/32")
    client, allowed, stranger = RecordingClient(SrcOptions(port=gw.port)), udp("127.0.0.1"), udp("127.0.0.2")
    data = invite_bytes(client)
    allowed.sendto(data, ("127.0.0.1", gw.port))
    ok = await receive(allowed)
    assert ok.status == 200 and b"m=audio" in ok.body
    stranger.sendto(data, ("127.0.0.1", gw.port))
    refused = await receive(stranger)
    assert refused.status == 403 and refused.body == b""
    for s in (allowed, stranger):
        s.close()
    client.close()


@pytest.mark.parametrize("cseq, length", [
    ("\u00b2 OPTIONS", "0"),  # a superscript two: str.isdigit() says yes, int() says no
    ("1" * 5000 + " OPTIONS", "0"),  # past int()'s 4300 digits
    ("1 OPTIONS", "0" * 5000),
    ("1 OPTIONS", "\u0665"),  # an Arabic-Indic five
])
async def test_hostile_numbers_over_udp_are_answered_400_and_the_server_goes_on(listen, cseq: str,  # type: ignore[no-untyped-def]
                                                                               length: str) -> None:
    gw, s = await listen(), udp()
    s.sendto(options_bytes("bad", cseq, length), ("127.0.0.1", gw.port))
    bad = await receive(s)
    assert bad.status == 400 and (bad.header("warning") or "").startswith("399 callqa")
    s.sendto(options_bytes("good"), ("127.0.0.1", gw.port))
    assert (await receive(s)).status == 200
    assert gw.value("callqa_siprec_malformed_total", outcome="answered") == 1
    s.close()


async def tcp_answers(reader: asyncio.StreamReader, framer: StreamFramer, count: int) -> list[SipMessage]:
    messages: list[bytes] = []
    while len(messages) < count:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, "the connection was closed"
        messages += framer.feed(data)
    return [parse(m, stream=True) for m in messages]


async def test_hostile_numbers_over_tcp_are_answered_400_and_the_connection_goes_on(listen) -> None:  # type: ignore[no-untyped-def]
    gw = await listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(options_bytes("t1", "\u00b2 OPTIONS", transport="TCP") + options_bytes("t2", "1" * 5000 + " OPTIONS",
                 transport="TCP") + options_bytes("t3", transport="TCP"))
    answers = await tcp_answers(reader, StreamFramer(), 3)
    assert [a.status for a in answers] == [400, 400, 200]
    writer.close()


async def test_a_content_length_thousands_of_digits_long_closes_the_tcp_connection_cleanly(listen) -> None:  # type: ignore[no-untyped-def]
    """A byte stream with an unreadable length has no next message boundary: the connection is closed and
    counted (not a task dying on a ValueError), and the server takes the next connection."""
    gw = await listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(options_bytes("t4", length="9" * 5000, transport="TCP"))
    assert await asyncio.wait_for(reader.read(65536), 10) == b""
    writer.close()
    assert gw.value("callqa_siprec_malformed_total", outcome="connection_closed") == 1
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(options_bytes("t5", transport="TCP"))
    assert [a.status for a in await tcp_answers(reader, StreamFramer(), 1)] == [200]
    writer.close()


async def test_rtp_from_another_source_is_dropped_and_counted_while_the_latched_one_is_recorded(listen) -> None:  # type: ignore[no-untyped-def]
    """A session whose SDP names 127.0.0.1: RTP from 127.0.0.2 to the stream's port is dropped before any
    packet came (the host is not the SDP's), and after the SRC's first packet latched its port, so is RTP
    from another port of the SRC's own host. The SRC's 50 packets are the leg's audio, nothing else."""
    gw = await listen()
    client, sip = RecordingClient(SrcOptions(port=gw.port)), udp()
    sip.sendto(invite_bytes(client), ("127.0.0.1", gw.port))
    ok = await receive(sip)
    assert ok.status == 200
    port = parse_sdp(ok.body).media[0].port
    tone = (np.sin(np.arange(8000) / 3) * 8000).astype(np.int16)
    packets = packetize(tone, "pcmu", 0, ssrc=11)
    noise = packetize((np.ones(8000) * 9000).astype(np.int16), "pcmu", 0, ssrc=11)
    src, other_host, other_port = udp(), udp("127.0.0.2"), udp()
    other_host.sendto(noise[0], ("127.0.0.1", port))
    await until(lambda: gw.value("callqa_siprec_rtp_packets_total", outcome="wrong_source") == 1)
    for p in packets[:25]:
        src.sendto(p, ("127.0.0.1", port))
    await until(lambda: gw.server.sessions[client.call_id].streams[0].latched is not None)
    for p in noise[25:]:
        other_port.sendto(p, ("127.0.0.1", port))
        other_host.sendto(p, ("127.0.0.1", port))
    for p in packets[25:]:
        src.sendto(p, ("127.0.0.1", port))
    await until(lambda: gw.value("callqa_siprec_rtp_packets_total", outcome="wrong_source") == 51)
    await until(lambda: gw.server.sessions[client.call_id].streams[0].buffer.counts.audio_packets == 50)
    gw.server.end(client.call_id, "bye")
    gw.server.calls.tick()
    sent = b"".join(f.payload for f in sorted(gw.sink.leg_frames("customer"), key=lambda f: f.seq))
    assert sent == b"".join(p[12:] for p in packets)  # PCMU is the leg's μ-law as sent
    for s in (sip, src, other_host, other_port):
        s.close()
    client.close()
