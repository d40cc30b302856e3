"""The SRC side of SIPREC, for `callqa gateway simulate --protocol siprec`, the tests and the benchmark: one
recording session sent as an SBC sends it (INVITE with SDP + metadata, the digest challenge answered,
ACK, the two legs' RTP, BYE).

``RecordingClient`` is blocking and one session a call (a thread each where there are several): it exists
to drive the server, and SIPp (Debian's sip-tester) is the independent client the tests hold the signalling
against. ``RecordingLoad`` carries hundreds of sessions from one asyncio loop, for `callqa bench gateway`:
a thread per session cannot keep 20 ms time on one core (its messages come from ``Dialog`` and
``recording_offer``).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from array import array
from dataclasses import dataclass, field
from typing import Literal

from pipeline.audio import codecs
from pipeline.gateway.siprec.body import BodyPart, multipart
from pipeline.gateway.siprec.digest import authorization
from pipeline.gateway.siprec.message import SipError, SipMessage, StreamFramer, parse, response
from pipeline.gateway.siprec.metadata import build_metadata
from pipeline.gateway.siprec.rtp_send import RtpSender, impair, packetize
from pipeline.gateway.siprec.sdp import Crypto, build_offer, parse_sdp
from pipeline.gateway.siprec.srtp import SrtpSender, new_crypto

STATIC_PT = {"pcmu": 0, "pcma": 8, "g722": 9}
TELEPHONE_EVENT_PT = 101
T1_S, T2_S = 0.5, 4.0  # RFC 3261's retransmission timers: a request over UDP is sent again at T1, 2 T1, ... T2
PACKET_S = 0.02  # RecordingLoad's packets: 20 ms each, as SBCs send PCMU
SLOTS = 4  # RecordingLoad sends a quarter of its sessions every 5 ms: spread as many callers' packets are


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
    srtp: bool = False  # offer RTP/SAVP with an SDES key per stream, and send SRTP


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
        # SDES (RFC 4568): a key of our own per stream, offered in its a=crypto line, its packets protected with it
        self.keys: list[Crypto | None] = [new_crypto() if options.srtp else None for _ in range(2)]

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
        sdp = build_offer("127.0.0.1", [(port, "1", (pt, TELEPHONE_EVENT_PT), rtpmap, direction, self.keys[0]),
                                        (port + 2, "2", (pt, TELEPHONE_EVENT_PT), rtpmap, direction, self.keys[1])])
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
            key = self.keys[i]
            if key is not None:
                protect = SrtpSender(key).protect
                packets = [protect(p) for p in packets]
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


# ---- many sessions from one event loop (the benchmark) ----------------------------------------------------
def local_address_for(host: str) -> str:
    """The local address packets to ``host`` leave from (what the SDP offer and Contact must name): a
    connected UDP socket sends nothing, it only picks the route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def via(transport: str, local: tuple[str, int]) -> str:
    """A new Via (a new transaction's branch)."""
    return f"SIP/2.0/{transport.upper()} {local[0]}:{local[1]};branch=z9hG4bK{secrets.token_hex(8)};rport"


@dataclass
class Dialog:
    """One session's SIP dialog as its SRC keeps it: what each of its requests carries."""

    call_id: str
    host: str  # the SRS
    port: int
    local: tuple[str, int]  # our SIP socket's address (Via, From, Contact)
    transport: str = "udp"
    from_tag: str = field(default_factory=lambda: secrets.token_hex(4))
    to_value: str = ""  # the SRS's To, with its tag, once it answered
    cseq: int = 0

    @property
    def uri(self) -> str:
        return f"sip:srs@{self.host}:{self.port}"

    def request(self, method: str, body: bytes = b"", content_type: str = "",
                extra: list[tuple[str, str]] | None = None) -> SipMessage:
        self.cseq += 1
        headers = [("via", via(self.transport, self.local)), ("max-forwards", "70"),
                   ("from", f"<sip:src@{self.local[0]}>;tag={self.from_tag}"), ("to", self.to_value or f"<{self.uri}>"),
                   ("call-id", self.call_id), ("cseq", f"{self.cseq} {method}"),
                   ("contact", f"<sip:src@{self.local[0]}:{self.local[1]}>;+sip.src")]
        if content_type:
            headers.append(("content-type", content_type))
        return SipMessage(method=method, uri=self.uri, headers=[*headers, *(extra or [])], body=body)

    def ack(self, invite: SipMessage, answer: SipMessage) -> SipMessage:
        """ACK: for a refusal on the INVITE's own branch (hop by hop), for a 2xx a new transaction."""
        branch = invite.header("via") or "" if answer.status >= 300 else via(self.transport, self.local)
        return SipMessage(method="ACK", uri=self.uri, headers=[
            ("via", branch), ("max-forwards", "70"), ("from", invite.header("from") or ""),
            ("to", answer.header("to") or ""), ("call-id", self.call_id), ("cseq", f"{invite.cseq[0]} ACK")])


def recording_offer(call_id: str, address: str, port: int, options: SrcOptions,
                    direction: str = "sendonly") -> tuple[str, bytes]:
    """An INVITE's multipart body: SDP with the customer's then the agent's stream (on ``port`` and
    ``port`` + 2), and the metadata naming their participants."""
    pt = STATIC_PT[options.encoding]
    rtpmap = {pt: (options.encoding, 8000), TELEPHONE_EVENT_PT: ("telephone-event", 8000)}
    sdp = build_offer(address, [(port, "1", (pt, TELEPHONE_EVENT_PT), rtpmap, direction),
                                (port + 2, "2", (pt, TELEPHONE_EVENT_PT), rtpmap, direction)])
    metadata = build_metadata(call_id, [("p1", options.caller_aor, "s1", "1"), ("p2", options.callee_aor, "s2", "2")])
    return multipart([BodyPart("application/sdp", "session", sdp.encode()),
                      BodyPart("application/rs-metadata+xml", "recording-session", metadata)],
                     boundary=f"callqa{secrets.token_hex(6)}")


def new_call_id() -> str:
    return f"{secrets.token_hex(8)}@src.callqa.test"


@dataclass
class LoadReport:
    """What a ``RecordingLoad`` did: the sessions opened, how late its packets went, why sessions failed."""

    call_ids: list[str] = field(default_factory=list)
    packets_sent: int = 0  # RTP packets, each 20 ms of one stream
    late_s: array[float] = field(default_factory=lambda: array("d"))  # per session per 20 ms: how late it sent
    failures: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


@dataclass
class _LoadSession:
    dialog: Dialog
    targets: list[tuple[tuple[str, int], list[bytes]]]  # (the SRS's port, the stream's packets)
    next_tick: int  # the tick its next packet is due at
    length: int  # packets of its longest stream
    sent: int = 0


class _SipAnswers(asyncio.DatagramProtocol):
    """The SIP socket of a ``RecordingLoad``: final answers to the futures waiting for them, the SRS's own
    requests (a BYE when it ended a session) answered 200."""

    def __init__(self, load: RecordingLoad) -> None:
        self.load = load

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            msg = parse(data)
        except SipError:
            return
        if msg.is_request:
            if msg.method != "ACK" and self.load.sip is not None:
                self.load.sip.sendto(response(msg, 200).to_bytes(), addr)
            return
        key = (msg.call_id, msg.cseq[0])
        waiting = self.load.waiting.get(key)
        if waiting is not None and not waiting.done() and msg.status >= 200:
            waiting.set_result(msg)
        elif msg.status < 300 and key in self.load.acks and self.load.sip is not None:
            self.load.sip.sendto(self.load.acks[key], addr)  # its 2xx again: our ACK was lost


class RecordingLoad:
    """Many recording sessions over UDP from one event loop: each INVITE'd (started ``spread_s`` / n apart)
    and ACK'd over one SIP socket, both legs' RTP from one other socket by a single task that wakes every
    5 ms and sends the next packet of each session whose turn it is (a session's packets go every 20 ms from
    its answer on, so the sessions' packets are spread over the 20 ms), BYE after its last packet. Every
    session sends the same ``customer`` and ``agent`` packets (pre-packetized: a session costs no encoding
    and no copy), each stream to the port the SRS answered for it."""

    def __init__(self, options: SrcOptions, customer: list[bytes], agent: list[bytes]) -> None:
        self.options = options
        self.streams = (customer, agent)
        self.sip: asyncio.DatagramTransport | None = None
        self.waiting: dict[tuple[str, int], asyncio.Future[SipMessage]] = {}  # (Call-ID, CSeq) -> final answer
        self.acks: dict[tuple[str, int], bytes] = {}
        self.slots: list[list[_LoadSession]] = [[] for _ in range(SLOTS)]
        self.report = LoadReport()
        self._open = 0  # sessions INVITE'd and not yet over
        self._byes: list[asyncio.Task[None]] = []

    async def run(self, sessions: int, spread_s: float = 2.0) -> LoadReport:
        loop = asyncio.get_running_loop()
        local = local_address_for(self.options.host)
        self.sip, _ = await loop.create_datagram_endpoint(lambda: _SipAnswers(self), local_addr=(local, 0))
        self.local = self.sip.get_extra_info("sockname")[:2]
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind((local, 0))
        self.rtp.setblocking(False)
        self.began = time.monotonic()
        self._open = sessions
        try:
            sender = asyncio.create_task(self._send_media())
            await asyncio.gather(*(self._start(i * spread_s / max(1, sessions)) for i in range(sessions)))
            await sender
            await asyncio.gather(*self._byes)
        finally:
            self.sip.close()
            self.rtp.close()
        self.report.elapsed_s = time.monotonic() - self.began
        return self.report

    async def exchange(self, msg: SipMessage) -> SipMessage:
        """Send a request and wait for its final answer, sent again at T1, 2 T1, ... T2 while unanswered."""
        assert self.sip is not None
        key = (msg.call_id, msg.cseq[0])
        answer: asyncio.Future[SipMessage] = asyncio.get_running_loop().create_future()
        self.waiting[key] = answer
        data, interval = msg.to_bytes(), T1_S
        deadline = time.monotonic() + self.options.timeout_s
        try:
            while True:
                self.sip.sendto(data, (self.options.host, self.options.port))
                try:
                    return await asyncio.wait_for(asyncio.shield(answer), min(interval, deadline - time.monotonic()))
                except TimeoutError:
                    if time.monotonic() >= deadline - 0.001:
                        raise ClientError(f"no answer to {msg.method} from {self.options.host}:"
                                          f"{self.options.port} within {self.options.timeout_s:g} s") from None
                    interval = min(2 * interval, T2_S)
        finally:
            del self.waiting[key]

    async def _start(self, delay: float) -> None:
        await asyncio.sleep(delay)
        assert self.sip is not None
        dialog = Dialog(new_call_id(), self.options.host, self.options.port, self.local)
        content_type, body = recording_offer(dialog.call_id, self.local[0], self.rtp.getsockname()[1], self.options)
        invite = dialog.request("INVITE", body, content_type, [("require", "siprec")])
        try:
            answer = await self.exchange(invite)
            if answer.status >= 300:
                self.sip.sendto(dialog.ack(invite, answer).to_bytes(), (self.options.host, self.options.port))
                raise ClientError(f"INVITE answered {answer.status} {answer.reason}", answer.status)
            ports = [m.port for m in parse_sdp(answer.body).media]
            if not any(ports):
                raise ClientError("the answer took no stream")
        except (ClientError, ValueError) as exc:  # ValueError: an answer's SDP that does not parse
            self.report.failures.append(f"{dialog.call_id}: {exc}")
            self._open -= 1
            return
        dialog.to_value = answer.header("to") or ""
        ack = dialog.ack(invite, answer).to_bytes()
        self.acks[(dialog.call_id, invite.cseq[0])] = ack
        self.sip.sendto(ack, (self.options.host, self.options.port))
        # Its first packet is due 20 ms after the next 5 ms tick: its slot is that tick's.
        tick = int((time.monotonic() - self.began) / (PACKET_S / SLOTS)) + 1
        targets = [((self.options.host, port), packets) for port, packets in zip(ports, self.streams, strict=False)
                   if port]
        length = max(len(packets) for _, packets in targets)
        self.slots[tick % SLOTS].append(_LoadSession(dialog, targets, tick + SLOTS, length))
        self.report.call_ids.append(dialog.call_id)

    async def _send_media(self) -> None:
        tick_s = PACKET_S / SLOTS
        tick = 0
        late, sendto = self.report.late_s, self.rtp.sendto
        while self._open:
            tick += 1
            due = self.began + tick * tick_s
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            slot = self.slots[tick % SLOTS]
            keep = []
            for session in slot:
                if session.next_tick > tick:  # its answer came after this slot's last turn
                    keep.append(session)
                    continue
                k = session.sent
                for address, packets in session.targets:
                    if k < len(packets):
                        try:
                            sendto(packets[k], address)
                            self.report.packets_sent += 1
                        except BlockingIOError:  # our send buffer is full: that packet is lost, as on a network
                            pass
                late.append(max(0.0, time.monotonic() - due))
                session.sent += 1
                session.next_tick += SLOTS
                if session.sent < session.length:
                    keep.append(session)
                else:
                    self._byes.append(asyncio.create_task(self._bye(session.dialog)))
            slot[:] = keep

    async def _bye(self, dialog: Dialog) -> None:
        try:
            answer = await self.exchange(dialog.request("BYE"))
            if answer.status >= 300:
                self.report.failures.append(f"{dialog.call_id}: BYE answered {answer.status} {answer.reason}")
        except ClientError as exc:
            self.report.failures.append(f"{dialog.call_id}: {exc}")
        finally:
            self._open -= 1
