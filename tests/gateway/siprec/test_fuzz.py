"""Property-based fuzzing of what the SIPREC server takes from the network: SIP messages (mutated real ones
and arbitrary bytes) through the parser and the recording server's core, and RTP datagrams to a stream.

Each property: nothing raised but the parser's own ``SipError``; every request the core takes is answered
with one status line; no session is left open by a message that was refused; no frame or call event
comes from a refused INVITE. The core runs on the gateway's Kafka-free OpenCalls over a recording sink,
with port numbers handed out instead of sockets (the sockets are tests/gateway/siprec/test_sipp.py's).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import Settings
from pipeline.gateway.calls import OpenCalls
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.siprec.client import RecordingClient, SrcOptions
from pipeline.gateway.siprec.message import SipError, StreamFramer, parse
from pipeline.gateway.siprec.metrics import SiprecMetrics
from pipeline.gateway.siprec.recorder import Peer, RecordingServer
from tests.gateway.conftest import RecordingSink

PEER = Peer("udp", "127.0.0.1", 5070)


class CountedPorts:
    """MediaPorts without sockets: a number per stream, and which are open."""

    def __init__(self) -> None:
        self.open_keys: dict[tuple[str, int], int] = {}
        self.next = 20000

    def open(self, key: tuple[str, int]) -> int:
        self.next += 2
        self.open_keys[key] = self.next
        return self.next

    def close(self, key: tuple[str, int]) -> None:
        self.open_keys.pop(key, None)


def core() -> tuple[RecordingServer, RecordingSink, CountedPorts]:
    sink, metrics, ports = RecordingSink(), GatewayMetrics(), CountedPorts()
    calls = OpenCalls(sink, metrics, end_grace_s=0.0, message_ms=200)
    server = RecordingServer(Settings(), calls, ports, SiprecMetrics(metrics.registry), "127.0.0.1", 5060)
    return server, sink, ports


def real_invite() -> bytes:
    client = RecordingClient(SrcOptions(port=5060))
    try:
        content_type, body = client.offer()
        return client._request("INVITE", body, content_type, [("require", "siprec")]).to_bytes()
    finally:
        client.close()


INVITE = real_invite()


@st.composite
def mutated(draw: st.DrawFn, base: bytes = INVITE) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "dup_line", "drop_line"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 200))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=40))
        else:
            lines = bytes(data).split(b"\r\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [lines[i], lines[i]] if kind == "dup_line" else []
            data = bytearray(b"\r\n".join(lines))
    return bytes(data)


@given(st.binary(max_size=2000) | mutated())
def test_the_parser_raises_only_its_own_error(data: bytes) -> None:
    try:
        msg = parse(data)
    except SipError as err:
        assert err.status in (400, 513)
        return
    assert msg.is_request or msg.status


@given(mutated())
def test_the_core_answers_every_request_once_and_a_refusal_leaves_nothing(data: bytes) -> None:
    server, sink, ports = core()
    try:
        msg = parse(data)
    except SipError:
        return
    out = server.on_message(msg, PEER)
    if not msg.is_request or msg.method == "ACK":
        assert out == []
        return
    assert len(out) == 1 and out[0].data.startswith(b"SIP/2.0 ")
    status = int(out[0].data.split(b" ", 2)[1])
    if status >= 300:
        assert server.sessions == {} and ports.open_keys == {}
        assert sink.starts == [] and sink.frames == []
    elif msg.method == "INVITE" and server.sessions:
        (session,) = server.sessions.values()
        server.end(session.call_id, "bye")
        assert ports.open_keys == {}


@given(st.lists(st.binary(max_size=300), max_size=40))
def test_any_datagram_on_a_stream_port_is_taken_or_dropped(datagrams: list[bytes]) -> None:
    server, sink, _ = core()
    (answer,) = server.on_message(parse(INVITE), PEER)
    assert answer.data.startswith(b"SIP/2.0 200")
    call_id = next(iter(server.sessions))
    for data in datagrams:
        server.on_rtp((call_id, 0), data, ("127.0.0.1", 40000))
    server.tick()
    server.end(call_id, "bye")
    assert server.sessions == {}


def _numbers() -> st.SearchStrategy[str]:
    """What a CSeq number or a Content-Length may be made of on the wire: any Unicode digits (Nd, and those
    str.isdigit takes that int refuses, like superscripts), runs far past int()'s 4300 digits, and noise."""
    digits = st.characters(categories=["Nd", "No"])
    return (st.text(digits, min_size=1, max_size=30) | st.integers(1, 7000).map(lambda n: "7" * n)
            | st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20))


@given(_numbers(), _numbers(), st.booleans())
def test_hostile_cseq_and_content_length_are_a_400_never_another_error(cseq: str, length: str, stream: bool) -> None:
    """A request naming what a reply needs, with a hostile CSeq number or Content-Length: parsed, or refused
    with SipError 400 carrying the partial message (so the listener answers 400), never another exception;
    the framer of a byte stream refuses its length with SipError too."""
    data = (f"OPTIONS sip:srs@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bKf\r\n"
            f"From: <sip:a@b>;tag=1\r\nTo: <sip:srs@c>\r\nCall-ID: fuzz@test\r\nCSeq: {cseq} OPTIONS\r\n"
            f"Content-Length: {length}\r\n\r\n").encode("utf-8", "surrogatepass")
    try:
        msg = parse(data, stream=stream)
    except SipError as err:
        assert err.status == 400 and err.partial is not None
    else:
        assert msg.cseq[0] < 2**31 and msg.body == b""
    try:
        StreamFramer().feed(data)
    except SipError as err:
        assert err.status in (400, 513)
