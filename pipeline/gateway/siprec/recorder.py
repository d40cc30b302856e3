"""The recording server's core (RFC 7866 SRS): SIP requests in, responses out, RTP into the gateway's calls.

No sockets here (``transport.py`` is the shell): ``on_message`` takes a parsed message and where it came
from and returns what to send where; ``on_rtp`` takes a datagram that reached a stream's port; ``tick``
runs the timers. Media ports come from a ``MediaPorts`` the shell implements.

A recording session is one SIP dialog (one Call-ID); its Call-ID is the call ID, so an SBC's logs and
callqa's records name the same call. Its streams are the offer's usable audio m= lines, each received on
a port of its own; the agent's stream is the participant whose AOR matches ``siprec_agent_aor``, else
the second stream in SDP order (the callee's on the SBCs we know of: inbound contact centers).

Transactions (RFC 3261 §17.2): a request that repeats a branch already answered gets that answer again,
never a second session. Over UDP an INVITE's 2xx is sent again at 0.5, 1, 2, 4, 4 ... s until its ACK
(Timer G) and given up after 32 s (Timer H): a 2xx never acknowledged ends its session.

A refusal (any answer of 300 or more) is sent once and nothing of it is kept: a forged source address
would otherwise get every resend of it (a reflector) and a flood would hold state for 32 s a request. The
SRC's own INVITE retransmissions (RFC 3261 Timer A) recover a lost refusal: each is judged again. The
source allow-list is checked before any kept answer, so a refused host repeating a known branch gets 403,
never the session's 200 with its SDP. Refusals are counted each and logged at most once per reason per
``REFUSAL_LOG_S``.

The call ID callqa keeps (the Kafka key, the store's rows, the recording's file name) is the Call-ID
scoped by tenant: ``tenant/Call-ID`` with digest users, the Call-ID as written without (one tenant). One
too long to name a file becomes a readable prefix and a hash (:func:`call_id_for`); a Call-ID that is
not printable ASCII, or absurdly long, is refused 400.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pipeline.config import Settings
from pipeline.contracts.messages import Leg
from pipeline.gateway.calls import Attachment, CallInfo, OpenCalls
from pipeline.gateway.limits import TokenBucket
from pipeline.gateway.siprec.body import BodyError, body_parts
from pipeline.gateway.siprec.digest import DigestAuth, parse_users
from pipeline.gateway.siprec.jitter import JitterBuffer, Released
from pipeline.gateway.siprec.message import SipMessage, number, param, response, uri_of, user_of
from pipeline.gateway.siprec.metadata import MetadataError, RecordingMetadata, parse_metadata
from pipeline.gateway.siprec.metrics import SiprecMetrics
from pipeline.gateway.siprec.payloads import ENCODINGS, decoder_for
from pipeline.gateway.siprec.rtp import RtpError, is_rtcp, parse_rtp
from pipeline.gateway.siprec.sdp import (
    Crypto,
    MediaAnswer,
    MediaOffer,
    SdpError,
    SdpOffer,
    build_answer,
    parse_sdp,
)
from pipeline.gateway.siprec.srtp import SrtpError, SrtpReceiver, answer_crypto, choose

log = logging.getLogger("callqa.gateway.siprec")

T1_S, T2_S, TIMER_H_S = 0.5, 4.0, 32.0
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE, INFO"
ACCEPT = "application/sdp, application/rs-metadata+xml, multipart/mixed"
SUPPORTED = ("siprec", "timer", "replaces")
MIN_SESSION_EXPIRES_S = 90  # RFC 4028's Min-SE floor
# A BYE often overtakes the stream's last RTP packets (they wait in the socket or the network): the session
# ends this long after it, so they are still written (the call's end event waits for them anyway).
BYE_LINGER_S = 0.25
LATE_STREAM_S = 2.0  # a stream whose first packet comes later than this after the answer starts where the call is
REFUSAL_LOG_S = 10.0  # a refusal reason is logged at most once this often (with how many went unlogged)
MAX_TRANSACTIONS = 20000  # answered requests kept for their retransmissions; past it only INVITE 2xx are kept
# Re-INVITEs and UPDATEs a session may send: SBCs re-offer on hold, resume, transfer and session refresh,
# a few a minute; more is a loop or an attack, each costing a renegotiation.
REOFFERS_PER_S, REOFFER_BURST = 1.0, 10.0
MAX_SIP_CALL_ID_CHARS = 256  # longer Call-IDs are refused (RFC 3261 sets no bound; SBCs' are under 100)
MAX_CALL_ID_CHARS = 128  # the call ID kept, and ...
MAX_QUOTED_CALL_ID_CHARS = 160  # ... URL-quoted (the recording's file name): well under a file name's 255 bytes
Transport = Literal["udp", "tcp", "tls"]


@dataclass(frozen=True)
class Peer:
    """Where a message came from and its answer goes: the transport, the address, and for TCP/TLS the
    connection (answers go back on it)."""

    transport: Transport
    host: str
    port: int
    connection: int = 0


@dataclass(frozen=True)
class Outgoing:
    data: bytes
    peer: Peer


class MediaPorts(Protocol):
    def open(self, key: tuple[str, int]) -> int:
        """A bound UDP port whose datagrams reach ``RecordingServer.on_rtp(key, ...)``; key = (call ID,
        m= index)."""

    def close(self, key: tuple[str, int]) -> None:
        """Stop receiving on the key's port and free it."""


@dataclass
class MediaStream:
    index: int
    leg: Leg
    port: int
    buffer: JitterBuffer
    offset: int | None = None  # where the stream's sample 0 lies on the call, from the attachment's base
    direction: str = "sendonly"
    srtp: SrtpReceiver | None = None  # the SRC's SDES key, when the stream is RTP/SAVP
    answer_crypto: Crypto | None = None  # ours, for the answer (SDES wants one even from a receiver)
    offered_crypto: Crypto | None = None  # the SRC's a=crypto line srtp is keyed with
    # Symmetric RTP: packets are taken from the host the SDP names, and from the first packet's port on
    # (latched); any other source is dropped and counted (rtp_packets{outcome="wrong_source"}).
    source_host: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    latched: tuple[str, int] | None = None


@dataclass
class Transaction:
    """An answered request, kept to answer its retransmissions (and, for an INVITE over UDP, to send its
    final answer again until the ACK)."""

    answer: bytes
    peer: Peer
    created: float
    invite: bool
    cseq: int
    call_id: str
    acked: bool = False
    next_send: float = 0.0
    interval: float = T1_S


@dataclass
class RecordingSession:
    call_id: str  # the SIP Call-ID: the dialog, and the key of the session and its media ports
    local_tag: str
    remote_tag: str
    remote_uri: str  # the SRC's Contact: where our own requests (BYE) go
    from_value: str  # the SRC's From (our BYE's To)
    to_value: str  # the SRC's To with our tag (our BYE's From)
    peer: Peer
    attachment: Attachment
    tenant: str
    record_id: str  # the call ID callqa keeps: the Call-ID scoped by tenant (call_id_for)
    reoffers: TokenBucket
    streams: dict[int, MediaStream] = field(default_factory=dict)
    metadata: RecordingMetadata | None = None
    answered_at: float = 0.0
    last_media: float = 0.0
    last_sip: float = 0.0
    acked: bool = False
    invite_cseq: int = 0
    sdp_version: int = 1
    session_expires_s: int = 0  # 0: no session timer
    held: bool = False
    held_since: float = 0.0
    local_cseq: int = 0
    dtmf_positions: list[int] = field(default_factory=list)  # samples on the call clock; never the digit
    ending: str = ""  # why it ends, once a BYE came (it ends at end_at)
    end_at: float = 0.0


class RecordingServer:
    def __init__(self, settings: Settings, calls: OpenCalls, ports: MediaPorts, metrics: SiprecMetrics,
                 contact_host: str, contact_port: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.calls = calls
        self.ports = ports
        self.metrics = metrics
        self.clock = clock
        self.contact = (contact_host, contact_port)
        users = settings.siprec_users.get_secret_value()
        self.digest = DigestAuth(parse_users(users)) if users else None
        self.networks = settings.allowed_networks()
        self.agent_aor = re.compile(settings.siprec_agent_aor) if settings.siprec_agent_aor else None
        self.sessions: dict[str, RecordingSession] = {}
        self.transactions: dict[tuple[str, str], Transaction] = {}
        self._invite_rate: dict[str, TokenBucket] = {}
        self.draining = False
        self._by_port: dict[tuple[str, int], MediaStream] = {}
        self._logged: dict[str, tuple[float, int]] = {}  # refusal reason -> (last logged, refusals since)

    # ---- requests -------------------------------------------------------------------------------------------
    def on_message(self, msg: SipMessage, peer: Peer) -> list[Outgoing]:
        """Answer a request (responses to our own BYEs need nothing but a look)."""
        now = self.clock()
        if not msg.is_request:
            return []
        self.metrics.requests.labels(msg.method if msg.method in ALLOW else "other").inc()
        refusal = self._source_refusal(peer)
        if refusal is not None:  # before any kept answer: a known branch must not fetch a session's 200
            if msg.method == "ACK":
                return []
            return self._answer(msg, peer, now, self._refuse(msg, 403, refusal, peer))
        key = (msg.branch, "INVITE" if msg.method == "ACK" else msg.method)
        known = self.transactions.get(key)
        if msg.method == "ACK":
            self._ack(msg, known)
            return []
        if known is not None:  # a retransmission: the same answer, nothing done twice
            self.metrics.retransmissions.inc()
            return [Outgoing(known.answer, peer)]
        handler = {"INVITE": self._invite, "BYE": self._bye, "CANCEL": self._cancel, "OPTIONS": self._options,
                   "UPDATE": self._update, "INFO": self._info}.get(msg.method)
        if handler is None:
            answer = response(msg, 405, headers=[("allow", ALLOW)])
            return self._answer(msg, peer, now, answer)
        return self._answer(msg, peer, now, handler(msg, peer, now))

    def _answer(self, msg: SipMessage, peer: Peer, now: float, answer: SipMessage) -> list[Outgoing]:
        data = answer.to_bytes()
        invite = msg.method == "INVITE"
        # A refusal is sent once and forgotten (see the module's docstring); past MAX_TRANSACTIONS only an
        # INVITE's 2xx, whose resends and ACK a session needs, is kept.
        if answer.status < 300 and (invite or len(self.transactions) < MAX_TRANSACTIONS):
            self.transactions[(msg.branch, msg.method)] = Transaction(
                data, peer, now, invite, msg.cseq[0], msg.call_id,
                acked=not invite or answer.status < 200, next_send=now + T1_S)
        return [Outgoing(data, peer)]

    def _ack(self, msg: SipMessage, known: Transaction | None) -> None:
        if known is not None:  # the ACK of a non-2xx answer shares the INVITE's branch
            known.acked = True
        else:  # a 2xx's ACK has a branch of its own (and some clients give every ACK one)
            for t in self.transactions.values():
                if t.invite and t.call_id == msg.call_id and t.cseq == msg.cseq[0]:
                    t.acked = True
        session = self.sessions.get(msg.call_id)
        if session is not None and msg.cseq[0] == session.invite_cseq:
            session.acked = True
            session.last_sip = self.clock()

    def _source_refusal(self, peer: Peer) -> str | None:
        try:
            address = ipaddress.ip_address(peer.host)
        except ValueError:
            return "source_not_allowed"
        return None if any(address in n for n in self.networks) else "source_not_allowed"

    def _refuse(self, msg: SipMessage, status: int, reason: str, peer: Peer,
                headers: list[tuple[str, str]] | None = None) -> SipMessage:
        self._count_refusal(reason, "SIPREC %s from %s:%d (Call-ID %s) refused %d: %s", msg.method, peer.host,
                            peer.port, msg.call_id[:80], status, reason[:200])
        warning = reason[:200].replace('"', "'")
        return response(msg, status, to_tag=_tag(), headers=[*(headers or []), ("warning", f'399 callqa "{warning}"')])

    def _count_refusal(self, reason: str, message: str, *args: object) -> None:
        """Counted by the reason's token (the part before any ':' detail, so the label set stays small),
        logged at most once per token per REFUSAL_LOG_S with how many were not."""
        token = reason.split(":", 1)[0]
        self.metrics.refusals.labels(token).inc()
        now = self.clock()
        last, unlogged = self._logged.get(token, (-REFUSAL_LOG_S, 0))
        if now - last < REFUSAL_LOG_S:
            self._logged[token] = (last, unlogged + 1)
            return
        self._logged[token] = (now, 0)
        more = f" (and {unlogged} more refused for {token} since the last line)" if unlogged else ""
        log.warning(message + "%s", *args, more)

    # ---- INVITE: a new recording session, or a re-INVITE within one ---------------------------------------
    def _invite(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        to_tag = param(msg.header("to") or "", "tag")
        if to_tag is not None:
            return self._reinvite(msg, peer, now, to_tag)
        if msg.call_id in self.sessions:
            return self._refuse(msg, 482, "call_id_in_use", peer)
        refused = self._admission(msg, peer, now)
        if refused is not None:
            return refused
        tenant = ""
        if self.digest is not None:
            result = self.digest.check("INVITE", msg.header("authorization"), request_uri=msg.uri)
            if result.user is None:
                reason = result.refusal or "unauthenticated"
                if reason == "no_credentials":
                    self.metrics.challenges.inc()
                    return response(msg, 401, to_tag=_tag(),
                                    headers=[("www-authenticate", self.digest.challenge(result.stale))])
                self._count_refusal(reason, "SIPREC INVITE from %s:%d (Call-ID %s) refused 401: %s", peer.host,
                                    peer.port, msg.call_id[:80], reason)
                return response(msg, 401, to_tag=_tag(),
                                headers=[("www-authenticate", self.digest.challenge(result.stale))])
            tenant = result.user
            if self._open_count(lambda s: s.tenant == tenant) >= self.settings.siprec_max_sessions_per_tenant:
                return self._refuse(msg, 503, "tenant_session_limit", peer, [("retry-after", "5")])
        record_id = call_id_for(tenant, msg.call_id)
        if record_id is None:
            return self._refuse(msg, 400, "bad_call_id: not printable ASCII, or longer than "
                                f"{MAX_SIP_CALL_ID_CHARS} characters", peer)
        unsupported = [t for t in msg.all("require") if t.lower() not in SUPPORTED]
        if unsupported:
            return self._refuse(msg, 420, "bad_extension", peer, [("unsupported", ", ".join(unsupported))])
        try:
            offer, metadata = self._offer(msg)
        except _Refusal as r:
            return self._refuse(msg, r.status, r.reason, peer)
        return self._open(msg, peer, now, offer, metadata, tenant, record_id)

    def _open_count(self, which: Callable[[RecordingSession], bool]) -> int:
        return sum(1 for s in self.sessions.values() if which(s))

    def _admission(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage | None:
        if self.draining:
            return self._refuse(msg, 503, "draining", peer, [("retry-after", "30")])
        if len(self.sessions) >= self.settings.siprec_max_sessions:
            return self._refuse(msg, 503, "session_limit", peer, [("retry-after", "5")])
        if self._open_count(lambda s: s.peer.host == peer.host) >= self.settings.siprec_max_sessions_per_source:
            return self._refuse(msg, 503, "source_session_limit", peer, [("retry-after", "5")])
        rate = self.settings.siprec_source_invites_per_s
        if rate > 0:
            bucket = self._invite_rate.setdefault(peer.host, TokenBucket(rate, 2 * rate))
            if not bucket.take(now):
                return self._refuse(msg, 503, "invite_rate", peer, [("retry-after", "1")])
        return None

    def _offer(self, msg: SipMessage) -> tuple[SdpOffer, RecordingMetadata | None]:
        if not msg.body:
            raise _Refusal(488, "no_offer")  # SIPREC's SRC offers in the INVITE (RFC 7866 §7.1.1)
        try:
            parts = body_parts(msg.header("content-type") or "", msg.body)
        except BodyError as exc:
            raise _Refusal(400, f"bad_body: {exc}") from None
        sdp = [p for p in parts if p.content_type == "application/sdp"]
        if not sdp:
            raise _Refusal(415, "no_sdp_part")
        try:
            offer = parse_sdp(sdp[0].body)
        except SdpError as exc:
            raise _Refusal(400, f"bad_sdp: {exc}") from None
        meta = [p for p in parts if p.content_type == "application/rs-metadata+xml"]
        metadata = None
        if meta:
            try:
                metadata = parse_metadata(meta[0].body)
            except MetadataError as exc:
                raise _Refusal(400, f"bad_metadata: {exc}") from None
        if self.settings.siprec_srtp == "required" and not any(m.crypto for m in offer.media if m.port):
            raise _Refusal(488, "srtp_required")
        return offer, metadata

    def _open(self, msg: SipMessage, peer: Peer, now: float, offer: SdpOffer,
              metadata: RecordingMetadata | None, tenant: str, record_id: str) -> SipMessage:
        usable = [m for m in offer.media if _usable(m, self.settings.siprec_srtp == "required")][:2]
        if not usable:
            return self._refuse(msg, 488, "no_usable_audio_stream", peer)
        legs, agent_id = self._legs(usable, metadata)
        local_tag = _tag()
        att = self.calls.attach(record_id, record_id, CallInfo.bounded(tenant, agent_id, ""), legs.values())
        to_value = f"{msg.header('to')};tag={local_tag}"
        session = RecordingSession(
            call_id=msg.call_id, local_tag=local_tag, remote_tag=param(msg.header("from") or "", "tag") or "",
            remote_uri=uri_of(msg.header("contact") or msg.header("from") or ""), from_value=msg.header("from") or "",
            to_value=to_value, peer=peer, attachment=att, tenant=tenant, record_id=record_id,
            reoffers=TokenBucket(REOFFERS_PER_S, REOFFER_BURST), metadata=metadata, answered_at=now,
            last_media=now, last_sip=now, invite_cseq=msg.cseq[0],
            session_expires_s=_session_expires(msg))
        self.sessions[msg.call_id] = session
        for m in usable:
            self._add_stream(session, m, legs[m.index])
        self.metrics.sessions.labels("accepted").inc()
        self.metrics.sessions_active.set(len(self.sessions))
        log.info("SIPREC session %s (call %s) from %s:%d: %s", msg.call_id[:80], record_id, peer.host, peer.port,
                 ", ".join(f"{s.leg} on {s.port}" for s in session.streams.values()))
        return self._ok_with_answer(msg, session, offer)

    def _legs(self, usable: list[MediaOffer], metadata: RecordingMetadata | None) -> tuple[dict[int, Leg], str]:
        """Which usable stream is the agent's, and the agent's ID (its AOR's user part, when known)."""
        aors = {m.index: _aor_of(m, metadata) for m in usable}
        agent = usable[1].index if len(usable) > 1 else None
        if self.agent_aor is not None:
            matched = [i for i, aor in aors.items() if aor and self.agent_aor.search(aor)]
            if matched:
                agent = matched[0]
        legs: dict[int, Leg] = {m.index: ("agent" if m.index == agent else "customer") for m in usable}
        agent_aor = aors.get(agent) if agent is not None else None
        return legs, user_of(agent_aor) if agent_aor else ""

    def _add_stream(self, session: RecordingSession, m: MediaOffer, leg: Leg) -> None:
        decoders = {pt: decoder_for(name) for pt, (name, _) in m.rtpmap.items() if name in ENCODINGS}
        buffer = JitterBuffer(decoders, telephone_event_pt=m.payload_type("telephone-event"),
                              depth=self.settings.siprec_jitter_packets,
                              max_wait_s=self.settings.siprec_jitter_wait_ms / 1000)
        key = (session.call_id, m.index)
        port = self.ports.open(key)
        stream = MediaStream(m.index, leg, port, buffer, direction=m.direction,
                             source_host=_media_host(m, session.peer))
        self._rekey(stream, m)
        session.streams[m.index] = stream
        self._by_port[key] = stream

    def _ok_with_answer(self, msg: SipMessage, session: RecordingSession, offer: SdpOffer) -> SipMessage:
        answers = []
        for m in offer.media:
            stream = session.streams.get(m.index)
            if stream is None:
                answers.append(MediaAnswer(0, m.formats[:1], "inactive"))
                continue
            formats = tuple(pt for pt in m.formats if m.rtpmap.get(pt, ("", 0))[0] in (*ENCODINGS, "telephone-event"))
            direction = "inactive" if m.direction in ("inactive", "recvonly") else "recvonly"
            answers.append(MediaAnswer(stream.port, formats, direction, stream.answer_crypto))
        body = build_answer(offer, answers, self._media_address(), session_id=abs(hash(session.call_id)) % 10**9,
                            version=session.sdp_version).encode()
        headers = [("contact", f"<sip:callqa@{self.contact[0]}:{self.contact[1]};transport={session.peer.transport}>"),
                   ("allow", ALLOW), ("supported", ", ".join(SUPPORTED)), ("content-type", "application/sdp")]
        if session.session_expires_s:
            headers += [("session-expires", f"{session.session_expires_s};refresher=uac"), ("require", "timer")]
        return response(msg, 200, to_tag=session.local_tag, headers=headers, body=body)

    @staticmethod
    def _rekey(stream: MediaStream, m: MediaOffer) -> None:
        """The stream keyed with the offer's chosen a=crypto line when it is not the one it has: SBCs re-key
        on hold, resume and transfer, and every packet after that fails the old key."""
        chosen = choose(m.crypto) if _secure(m) else None
        if chosen is not None and chosen != stream.offered_crypto:
            stream.srtp, stream.answer_crypto = SrtpReceiver(chosen), answer_crypto(chosen)
            stream.offered_crypto = chosen

    def _media_address(self) -> str:
        return self.settings.siprec_media_address or self.contact[0]

    def _reinvite(self, msg: SipMessage, peer: Peer, now: float, to_tag: str) -> SipMessage:
        session = self.sessions.get(msg.call_id)
        if session is None or session.local_tag != to_tag:
            return self._refuse(msg, 481, "no_such_dialog", peer)
        if not session.reoffers.take(now):
            return self._refuse(msg, 503, "reoffer_rate", peer, [("retry-after", "2")])
        session.last_sip = now
        session.invite_cseq = msg.cseq[0]
        session.session_expires_s = _session_expires(msg) or session.session_expires_s
        return self._new_offer(msg, peer, session, now)

    def _new_offer(self, msg: SipMessage, peer: Peer, session: RecordingSession, now: float) -> SipMessage:
        """A re-INVITE's or UPDATE's offer within the session, answered."""
        try:
            offer, metadata = self._offer(msg)
            if metadata is not None and session.metadata is not None:
                metadata = session.metadata.merged(metadata)  # MetadataError past the per-session bounds
        except _Refusal as r:
            return self._refuse(msg, r.status, r.reason, peer)
        except MetadataError as exc:
            return self._refuse(msg, 400, f"metadata_limit: {exc}", peer)
        self._renegotiate(session, offer, metadata, now)
        return self._ok_with_answer(msg, session, offer)

    def _renegotiate(self, session: RecordingSession, offer: SdpOffer, metadata: RecordingMetadata | None,
                     now: float) -> None:
        """A new offer within the session: metadata (already merged) taken, streams removed (port 0), re-keyed
        or added, and the call held while every recorded stream is inactive (RFC 7866 §8.3: hold is a
        direction change)."""
        if metadata is not None:
            session.metadata = metadata
        session.sdp_version += 1
        offered = {m.index: m for m in offer.media}
        for index in [i for i, m in offered.items() if i in session.streams and m.port == 0]:
            self._drop_stream(session, index)
        taken = {s.leg for s in session.streams.values()}
        for m in offer.media:
            if m.index in session.streams:
                stream = session.streams[m.index]
                stream.direction = m.direction
                self._rekey(stream, m)
                host = _media_host(m, session.peer)
                if host != stream.source_host:  # the SRC moved its media: latch again
                    stream.source_host, stream.latched = host, None
            elif _usable(m, self.settings.siprec_srtp == "required") and len(session.streams) < 2:
                free = [leg for leg in session.attachment.legs if leg not in taken]
                if free:
                    self._add_stream(session, m, free[0])
                    taken.add(free[0])
        idle = all(s.direction in ("inactive", "recvonly") for s in session.streams.values())
        if idle and not session.held:
            session.held, session.held_since = True, now
            self.calls.hold(session.attachment)
        elif not idle and session.held:
            session.held = False
            self.calls.unhold(session.attachment)

    def _drop_stream(self, session: RecordingSession, index: int) -> None:
        stream = session.streams.pop(index)
        self._write(session, stream, stream.buffer.flush())
        self._count(stream)
        offset = stream.offset or 0
        session.dtmf_positions += [offset + p for p in stream.buffer.dtmf_positions]
        key = (session.call_id, index)
        self._by_port.pop(key, None)
        self.ports.close(key)

    # ---- the other requests ---------------------------------------------------------------------------------
    def _bye(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        session = self._dialog(msg)
        if session is None:
            return response(msg, 481)
        if not session.ending:
            session.ending, session.end_at = "bye", now + BYE_LINGER_S
        return response(msg, 200)

    def _cancel(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        # The INVITE is answered at once, so a CANCEL always comes after its final answer and changes
        # nothing (RFC 3261 §9.2); the SRC sends BYE. Without that INVITE it matches nothing.
        invite = self.transactions.get((msg.branch, "INVITE"))
        return response(msg, 200 if invite is not None else 481)

    def _options(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        return response(msg, 200, to_tag=_tag(), headers=[("allow", ALLOW), ("accept", ACCEPT),
                                                          ("supported", ", ".join(SUPPORTED))])

    def _update(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        session = self._dialog(msg)
        if session is None:
            return response(msg, 481)
        if not session.reoffers.take(now):
            return self._refuse(msg, 503, "reoffer_rate", peer, [("retry-after", "2")])
        session.last_sip = now
        session.session_expires_s = _session_expires(msg) or session.session_expires_s
        if not msg.body:  # a session refresh only (RFC 4028)
            return response(msg, 200, headers=self._timer_headers(session))
        return self._new_offer(msg, peer, session, now)

    def _info(self, msg: SipMessage, peer: Peer, now: float) -> SipMessage:
        session = self._dialog(msg)
        if session is not None:
            session.last_sip = now
        return response(msg, 200 if session is not None else 481)

    def _timer_headers(self, session: RecordingSession) -> list[tuple[str, str]]:
        if not session.session_expires_s:
            return []
        return [("session-expires", f"{session.session_expires_s};refresher=uac"), ("require", "timer")]

    def _dialog(self, msg: SipMessage) -> RecordingSession | None:
        session = self.sessions.get(msg.call_id)
        to_tag = param(msg.header("to") or "", "tag")
        return session if session is not None and to_tag == session.local_tag else None

    # ---- media ---------------------------------------------------------------------------------------------
    def on_rtp(self, key: tuple[str, int], data: bytes, source: tuple[str, int]) -> None:
        """A datagram from ``source`` (host, port) that reached the port of stream ``key``."""
        stream = self._by_port.get(key)
        session = self.sessions.get(key[0])
        if stream is None or session is None:
            return
        if not _from_stream_source(stream, source):
            self.metrics.rtp_packets.labels("wrong_source").inc()  # injected, or a stray: never audio
            return
        if is_rtcp(data):
            return
        if stream.srtp is not None:
            try:
                data = stream.srtp.unprotect(data)
            except SrtpError as err:  # forged, replayed or keyed otherwise: never audio
                self.metrics.rtp_packets.labels(f"srtp_{err.reason}").inc()
                return
        try:
            packet = parse_rtp(data)
        except RtpError:
            self.metrics.rtp_packets.labels("malformed").inc()
            return
        now = self.clock()
        session.last_media = now
        if stream.latched is None:  # the first packet that is RTP (and authenticates) names the source port
            stream.latched = source
        self._write(session, stream, stream.buffer.push(packet, now))

    def _write(self, session: RecordingSession, stream: MediaStream, released: list[Released]) -> None:
        if not released:
            return
        if stream.offset is None:
            late = self.clock() - session.answered_at > LATE_STREAM_S
            call = self.calls.calls.get(session.record_id)
            stream.offset = max(0, call.position - session.attachment.base) if late and call else 0
        for r in released:
            self.calls.write(session.attachment, stream.leg, stream.offset + r.position, r.ulaw)

    def _count(self, stream: MediaStream) -> None:
        """The stream's packet counts into the metrics, once, when it closes (a counter's lock per packet
        would cost more than the packet)."""
        c = stream.buffer.counts
        for outcome, n in (("audio", c.audio_packets), ("lost", c.lost), ("late", c.late),
                           ("duplicate", c.duplicates), ("dtmf", c.dtmf_events), ("comfort_noise", c.comfort_noise),
                           ("unknown_payload", c.unknown_payload), ("stray", c.strays)):
            if n:
                self.metrics.rtp_packets.labels(outcome).inc(n)

    # ---- timers and endings ----------------------------------------------------------------------------------
    def tick(self) -> list[Outgoing]:
        """Held RTP released, INVITE answers sent again over UDP, old transactions forgotten, and sessions
        ended that lost their media, their session timer or their ACK. Returns what to send."""
        now = self.clock()
        out: list[Outgoing] = []
        for session in list(self.sessions.values()):
            for stream in session.streams.values():
                if stream.buffer.waiting:
                    self._write(session, stream, stream.buffer.expire(now))
            out += self._session_timers(session, now)
        for key, t in list(self.transactions.items()):
            if now - t.created > TIMER_H_S:
                del self.transactions[key]
            elif t.invite and not t.acked and t.peer.transport == "udp" and now >= t.next_send:
                out.append(Outgoing(t.answer, t.peer))
                t.interval = min(2 * t.interval, T2_S)
                t.next_send = now + t.interval
        for source in [s for s, b in self._invite_rate.items() if b.full(now)]:
            del self._invite_rate[source]
        return out

    def _session_timers(self, session: RecordingSession, now: float) -> list[Outgoing]:
        if session.ending:
            if now >= session.end_at:
                self.end(session.call_id, session.ending)
            return []
        why = ""
        if not session.acked and now - session.answered_at > TIMER_H_S:
            why = "no ack"
        elif not session.held and now - max(session.last_media, session.last_sip) > self.settings.siprec_media_timeout_s:
            why = "media timeout"
        elif session.held and now - session.held_since > self.settings.siprec_max_hold_s:
            why = "hold limit"
        elif session.session_expires_s and now - session.last_sip > session.session_expires_s:
            why = "session expired"
        if not why:
            return []
        bye = self._bye_request(session)
        self.end(session.call_id, why)
        return [bye]

    def _bye_request(self, session: RecordingSession) -> Outgoing:
        """Our own BYE (RFC 3261 §15.1.1): the dialog's tags reversed, to the SRC's Contact."""
        session.local_cseq += 1
        host, port = self.contact
        msg = SipMessage(method="BYE", uri=session.remote_uri, headers=[
            ("via", f"SIP/2.0/{session.peer.transport.upper()} {host}:{port};branch=z9hG4bK{secrets.token_hex(8)}"),
            ("max-forwards", "70"), ("from", session.to_value), ("to", session.from_value),
            ("call-id", session.call_id), ("cseq", f"{session.local_cseq} BYE")])
        return Outgoing(msg.to_bytes(), session.peer)

    def end(self, call_id: str, reason: str) -> None:
        """The session is over: held audio written, ports closed, the call's stream detached (the call ends
        after the gateway's end grace, with one end event)."""
        session = self.sessions.pop(call_id, None)
        if session is None:
            return
        for index in list(session.streams):
            self._drop_stream(session, index)
        if session.held:
            self.calls.unhold(session.attachment)
        self.calls.detach(session.record_id, session.record_id, reason)
        self.metrics.sessions_ended.labels(reason).inc()
        self.metrics.sessions_active.set(len(self.sessions))
        # That DTMF was typed, and when (a card number's digits are never kept: see jitter.py).
        dtmf = ", ".join(f"{p / 8000:.1f} s" for p in sorted(session.dtmf_positions))
        log.info("SIPREC session %s ended: %s%s", call_id[:80], reason, f"; DTMF at {dtmf}" if dtmf else "")

    def shutdown(self) -> list[Outgoing]:
        """Every session ended with a BYE to its SRC (the gateway is going away)."""
        self.draining = True
        out = []
        for session in list(self.sessions.values()):
            if not session.ending:
                out.append(self._bye_request(session))
            self.end(session.call_id, session.ending or "gateway shutdown")
        return out


class _Refusal(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _tag() -> str:
    return secrets.token_hex(6)


def _usable(m: MediaOffer, srtp_required: bool) -> bool:
    """An audio stream with a codec we decode, in RTP (unless SRTP is required) or in SRTP with an SDES
    suite and key we take; anything else is refused with port 0 rather than recorded as noise."""
    if m.media != "audio" or m.port == 0:
        return False
    if _secure(m):
        if choose(m.crypto) is None:
            return False
    elif m.proto.upper() != "RTP/AVP" or srtp_required:
        return False
    return any(m.rtpmap.get(pt, ("", 0))[0] in ENCODINGS for pt in m.formats)


def _secure(m: MediaOffer) -> bool:
    return m.proto.upper() == "RTP/SAVP"


def _aor_of(m: MediaOffer, metadata: RecordingMetadata | None) -> str | None:
    if metadata is None or m.label is None:
        return None
    participant = metadata.participant_of_label(m.label)
    return participant.aor if participant else None


def _session_expires(msg: SipMessage) -> int:
    """The session interval the SRC asked for (RFC 4028), at least the Min-SE floor; 0 if none."""
    value = msg.header("session-expires")
    if not value:
        return 0
    seconds = number(value.split(";", 1)[0])
    return max(MIN_SESSION_EXPIRES_S, seconds) if seconds is not None else 0


def call_id_for(tenant: str, sip_call_id: str) -> str | None:
    """The call ID callqa keeps for a session: the SIP Call-ID scoped by tenant (``tenant/Call-ID``, the
    tenant URL-quoted so its own '/' cannot shift the boundary), so one tenant's Call-ID never names
    another's stored call. One longer than the bounds (as it is, or URL-quoted as the recording's file
    name) becomes a readable prefix and a hash of the whole; None for a Call-ID that is not printable
    ASCII or longer than MAX_SIP_CALL_ID_CHARS (refused)."""
    if not sip_call_id or len(sip_call_id) > MAX_SIP_CALL_ID_CHARS or not all(
            "!" <= ch <= "~" for ch in sip_call_id):
        return None
    prefix = urllib.parse.quote(tenant, safe="")[:MAX_CALL_ID_CHARS // 4] + "/" if tenant else ""
    scoped = f"{prefix}{sip_call_id}"
    if len(scoped) <= MAX_CALL_ID_CHARS and len(urllib.parse.quote(scoped, safe="")) <= MAX_QUOTED_CALL_ID_CHARS:
        return scoped
    digest = hashlib.sha256(f"{tenant}\n{sip_call_id}".encode()).hexdigest()[:32]
    readable = re.sub(r"[^A-Za-z0-9._-]", "", sip_call_id)[:24]
    return f"{prefix}{readable}~{digest}"


def _media_host(m: MediaOffer, peer: Peer) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The host a stream's RTP must come from: the SDP's c= address, or the signalling's source when the
    SDP names none we can use (0.0.0.0, a host name); None only when neither is an address."""
    for candidate in (m.connection, peer.host):
        try:
            address = ipaddress.ip_address(candidate or "")
        except ValueError:
            continue
        if not address.is_unspecified:
            return address
    return None


def _from_stream_source(stream: MediaStream, source: tuple[str, int]) -> bool:
    if stream.latched is not None:
        return source == stream.latched
    return _same_host(source[0], stream.source_host)


def _same_host(host: str, expected: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    if expected is None:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address == expected
