"""The SRC side of SIPREC, for `callqa gateway simulate --protocol siprec`, the tests and the benchmark: one
recording session sent as an SBC sends it (INVITE with SDP + metadata, the digest challenge answered,
ACK, the two legs' RTP, BYE).

Blocking and one session a call (a thread each where there are several): it exists to drive the server,
and SIPp (Debian's sip-tester) is the independent client the tests hold the signalling against.
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Literal

from pipeline.audio import codecs
from pipeline.gateway.siprec.body import BodyPart, multipart
from pipeline.gateway.siprec.digest import authorization
from pipeline.gateway.siprec.message import SipMessage, StreamFramer, parse
from pipeline.gateway.siprec.metadata import build_metadata
from pipeline.gateway.siprec.rtp_send import RtpSender, impair, packetize
from pipeline.gateway.siprec.sdp import build_offer, parse_sdp

STATIC_PT = {"pcmu": 0, "pcma": 8, "g722": 9}
TELEPHONE_EVENT_PT = 101


class ClientError(RuntimeError):
    """The server did not answer, or answered with a refusal: ``status`` is its status (0: no answer)."""

    def __init__(self, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True)
class SrcOptions:
    host: str = "127.0.0.1"
    port: int = 5060
    transport: Literal["udp", "tcp"] = "udp"
    user: str = ""  # digest credentials, when the server asks
    password: str = ""
    encoding: Literal["pcmu", "pcma", "g722"] = "pcmu"
    loss: float = 0.0  # fraction of RTP packets never sent
    reorder: float = 0.0  # fraction sent out of order
    speed: float = 1.0  # 1: real time; 0: as fast as the socket takes them
    seed: int = 0
    caller_aor: str = "sip:+15551234567@carrier.example.com"  # the customer (first stream)
    callee_aor: str = "sip:agent1001@pbx.example.com"  # the agent (second stream)
    session_expires_s: int = 0
    timeout_s: float = 5.0


@dataclass
class SessionReport:
    call_id: str
    status: int = 0
    ports: list[int] = field(default_factory=list)
    packets_sent: int = 0
    bye_status: int = 0


class SipChannel:
    """Requests out, their answers back, over UDP (sent again on T1 while unanswered) or one TCP connection."""

    def __init__(self, options: SrcOptions) -> None:
        self.options = options
        kind = socket.SOCK_DGRAM if options.transport == "udp" else socket.SOCK_STREAM
        self.sock = socket.socket(socket.AF_INET, kind)
        if options.transport == "tcp":
            self.sock.connect((options.host, options.port))
        else:
            self.sock.bind(("127.0.0.1", 0))
        self.local = self.sock.getsockname()
        self.framer = StreamFramer()
        self._pending: list[bytes] = []

    def via(self) -> str:
        return f"SIP/2.0/{self.options.transport.upper()} {self.local[0]}:{self.local[1]};branch=z9hG4bK{secrets.token_hex(8)};rport"

    def send(self, msg: SipMessage) -> None:
        data = msg.to_bytes()
        if self.options.transport == "udp":
            self.sock.sendto(data, (self.options.host, self.options.port))
        else:
            self.sock.sendall(data)

    def request(self, msg: SipMessage) -> SipMessage:
        """Send and wait for the final answer (provisional ones skipped)."""
        deadline = time.monotonic() + self.options.timeout_s
        interval = 0.5
        self.send(msg)
        resend = time.monotonic() + interval
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, min(resend, deadline) - time.monotonic()))
            try:
                answer = self._receive()
            except TimeoutError:
                if self.options.transport == "udp" and time.monotonic() >= resend:
                    self.send(msg)
                    interval = min(2 * interval, 4.0)
                    resend = time.monotonic() + interval
                continue
            if answer.is_request or answer.cseq != msg.cseq or answer.status < 200:
                continue  # a request of the server's (BYE) or a provisional answer
            return answer
        raise ClientError(f"no answer to {msg.method} from {self.options.host}:{self.options.port} "
                          f"within {self.options.timeout_s:g} s")

    def _receive(self) -> SipMessage:
        if self.options.transport == "udp":
            return parse(self.sock.recv(65536))
        while not self._pending:
            data = self.sock.recv(65536)
            if not data:
                raise ClientError("the server closed the connection")
            self._pending += self.framer.feed(data)
        return parse(self._pending.pop(0), stream=True)

    def close(self) -> None:
        self.sock.close()


class RecordingClient:
    """One recording session: ``invite`` → RTP → ``bye``."""

    def __init__(self, options: SrcOptions, call_id: str | None = None) -> None:
        self.options = options
        self.call_id = call_id or f"{secrets.token_hex(8)}@src.callqa.test"
        self.channel = SipChannel(options)
        self.from_tag = secrets.token_hex(4)
        self.to_value = ""
        self.cseq = 0
        self.report = SessionReport(self.call_id)
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind(("127.0.0.1", 0))

    @property
    def uri(self) -> str:
        return f"sip:srs@{self.options.host}:{self.options.port}"

    def _request(self, method: str, body: bytes = b"", content_type: str = "",
                 extra: list[tuple[str, str]] | None = None) -> SipMessage:
        self.cseq += 1
        to = self.to_value or f"<{self.uri}>"
        headers = [("via", self.channel.via()), ("max-forwards", "70"),
                   ("from", f"<sip:src@{self.channel.local[0]}>;tag={self.from_tag}"), ("to", to),
                   ("call-id", self.call_id), ("cseq", f"{self.cseq} {method}"),
                   ("contact", f"<sip:src@{self.channel.local[0]}:{self.channel.local[1]}>;+sip.src")]
        if content_type:
            headers.append(("content-type", content_type))
        return SipMessage(method=method, uri=self.uri, headers=[*headers, *(extra or [])], body=body)

    def offer(self, direction: str = "sendonly") -> tuple[str, bytes]:
        """The INVITE's multipart body: SDP with the customer's then the agent's stream, and metadata."""
        pt = STATIC_PT[self.options.encoding]
        rtpmap = {pt: (self.options.encoding, 8000), TELEPHONE_EVENT_PT: ("telephone-event", 8000)}
        port = self.rtp.getsockname()[1]
        sdp = build_offer("127.0.0.1", [(port, "1", (pt, TELEPHONE_EVENT_PT), rtpmap, direction),
                                        (port + 2, "2", (pt, TELEPHONE_EVENT_PT), rtpmap, direction)])
        metadata = build_metadata(self.call_id, [("p1", self.options.caller_aor, "s1", "1"),
                                                 ("p2", self.options.callee_aor, "s2", "2")])
        return multipart([BodyPart("application/sdp", "session", sdp.encode()),
                          BodyPart("application/rs-metadata+xml", "recording-session", metadata)],
                         boundary=f"callqa{secrets.token_hex(6)}")

    def invite(self, direction: str = "sendonly") -> SipMessage:
        """The INVITE (the digest challenge answered once) and its ACK; raises ClientError on a refusal."""
        content_type, body = self.offer(direction)
        extra = [("require", "siprec"), ("supported", "timer")]
        if self.options.session_expires_s:
            extra.append(("session-expires", str(self.options.session_expires_s)))
        msg = self._request("INVITE", body, content_type, extra)
        answer = self.channel.request(msg)
        if answer.status in (401, 407) and self.options.user:
            self._ack(msg, answer)
            challenge = answer.header("www-authenticate") or answer.header("proxy-authenticate") or ""
            auth = authorization("INVITE", self.uri, self.options.user, self.options.password, challenge)
            msg = self._request("INVITE", body, content_type, [*extra, ("authorization", auth)])
            answer = self.channel.request(msg)
        self.report.status = answer.status
        if answer.status >= 300:
            self._ack(msg, answer)
            raise ClientError(f"INVITE answered {answer.status} {answer.reason}", answer.status)
        self.to_value = answer.header("to") or ""
        self._ack(msg, answer)
        answered = parse_sdp(answer.body)
        self.report.ports = [m.port for m in answered.media]
        return answer

    def _ack(self, invite: SipMessage, answer: SipMessage) -> None:
        """ACK: for a refusal on the INVITE's own branch (hop by hop), for a 2xx a new transaction."""
        via = invite.header("via") or "" if answer.status >= 300 else self.channel.via()
        ack = SipMessage(method="ACK", uri=self.uri, headers=[
            ("via", via), ("max-forwards", "70"), ("from", invite.header("from") or ""),
            ("to", answer.header("to") or ""), ("call-id", self.call_id), ("cseq", f"{invite.cseq[0]} ACK")])
        self.channel.send(ack)

    def send_audio(self, customer: bytes, agent: bytes) -> int:
        """Both legs (8 kHz μ-law, as a recording's legs are kept) as RTP to the answered ports, in the
        options' encoding, impaired and paced as they say."""
        pt = STATIC_PT[self.options.encoding]
        streams = []
        for i, (leg, port) in enumerate(zip((customer, agent), self.report.ports, strict=False)):
            samples = codecs.float_to_pcm16(codecs.decode(leg, "mulaw"))
            if port == 0:
                continue
            packets = packetize(samples, self.options.encoding, pt, ssrc=0x1000 + i + int(secrets.randbits(20)),
                                first_sequence=int(secrets.randbits(16)), first_timestamp=int(secrets.randbits(32)))
            packets = impair(packets, self.options.loss, self.options.reorder, self.options.seed + i)
            streams.append(((self.options.host, port), packets))
        sender = RtpSender(self.rtp, speed=self.options.speed)
        sent = sender.send(streams)
        self.report.packets_sent = sent
        return sent

    def reinvite(self, direction: str) -> SipMessage:
        content_type, body = self.offer(direction)
        msg = self._request("INVITE", body, content_type, [("require", "siprec")])
        answer = self.channel.request(msg)
        self._ack(msg, answer)
        return answer

    def bye(self) -> int:
        answer = self.channel.request(self._request("BYE"))
        self.report.bye_status = answer.status
        return answer.status

    def close(self) -> None:
        self.channel.close()
        self.rtp.close()


def record(options: SrcOptions, customer: bytes, agent: bytes, call_id: str | None = None) -> SessionReport:
    """One whole session: INVITE, both legs' RTP, BYE."""
    client = RecordingClient(options, call_id)
    try:
        client.invite()
        client.send_audio(customer, agent)
        client.bye()
        return client.report
    finally:
        client.close()

