"""The recording server's core under abuse and churn, on a manual clock: refusals that leave nothing and are
never resent, the hold limit, the caps per source and per tenant, re-keying, call ids scoped by tenant and
bounded, metadata and re-offers bounded per session, symmetric RTP, and digest bound to the request URI.
The same faults driven through real sockets: test_listener.py."""

from __future__ import annotations

import logging
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr

from pipeline.gateway.siprec.body import BodyPart, body_parts, multipart
from pipeline.gateway.siprec.client import RecordingClient, SrcOptions
from pipeline.gateway.siprec.digest import authorization
from pipeline.gateway.siprec.message import SipMessage
from pipeline.gateway.siprec.metadata import build_metadata
from pipeline.gateway.siprec.recorder import MAX_CALL_ID_CHARS, REOFFER_BURST, Peer, call_id_for
from pipeline.gateway.siprec.rtp_send import packetize
from pipeline.gateway.siprec.srtp import SrtpSender, new_crypto
from tests.gateway.siprec.test_recorder import RTP_SOURCE, UDP, Core, ack_for, invite

TONE = (np.sin(np.arange(8000) / 3) * 8000).astype(np.int16)  # 1 s: 50 packets, 5 frame messages


def opened(core: Core, client: RecordingClient, peer: Peer = UDP,
           extra: list[tuple[str, str]] | None = None) -> SipMessage:
    request = invite(client, extra)
    (ok,) = core.send(request, peer)
    assert ok.status == 200, ok.header("warning")
    core.send(ack_for(client, request, ok), peer)
    return ok


def reinvite(client: RecordingClient, direction: str = "sendonly", metadata: bytes | None = None) -> SipMessage:
    content_type, body = client.offer(direction)
    if metadata is not None:
        sdp = next(p for p in body_parts(content_type, body) if p.content_type == "application/sdp")
        content_type, body = multipart([sdp, BodyPart("application/rs-metadata+xml", "recording-session", metadata)],
                                       boundary="callqatest")
    return client._request("INVITE", body, content_type, [("require", "siprec")])


def test_a_refused_invite_is_answered_once_and_leaves_no_transaction(caplog: pytest.LogCaptureFixture) -> None:
    """From a source not allowed: one 403 per INVITE, nothing kept, nothing resent by the timers however
    long they run, and a flood logged in one line (counted in full)."""
    core = Core(siprec_allow="10.0.0.0/8")
    clients = [RecordingClient(SrcOptions()) for _ in range(30)]
    with caplog.at_level(logging.WARNING, logger="callqa.gateway.siprec"):
        for client in clients:
            (refused,) = core.send(invite(client))
            assert refused.status == 403
    assert core.server.transactions == {}
    assert [m for _ in range(20) for m in core.tick(2.0)] == []  # past Timer H: no 403 sent again
    assert core.value("callqa_siprec_refusals_total", reason="source_not_allowed") == 30
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    core.clock.advance(60.0)
    with caplog.at_level(logging.WARNING, logger="callqa.gateway.siprec"):
        core.send(invite(clients[0]))
    assert "29 more refused for source_not_allowed" in caplog.records[-1].getMessage()
    for client in clients:
        client.close()


def test_a_refusal_from_an_allowed_source_is_not_resent_either() -> None:
    core, client = Core(), RecordingClient(SrcOptions())
    content_type, body = client.offer()
    (refused,) = core.send(client._request("INVITE", body, content_type, [("require", "siprec, foo")]))
    assert refused.status == 420 and core.server.transactions == {}
    assert core.tick(0.5) == [] and core.tick(1.0) == []
    client.close()


def test_a_refused_host_repeating_a_known_branch_gets_403_not_the_cached_200() -> None:
    core, client = Core(siprec_allow="127.0.0.1/32"), RecordingClient(SrcOptions())
    request = invite(client)
    (ok,) = core.send(request)
    assert ok.status == 200 and b"m=audio" in ok.body
    (stranger,) = core.send(request, Peer("udp", "127.0.0.2", 5070))
    assert stranger.status == 403 and stranger.body == b""
    assert core.value("callqa_siprec_retransmissions_total") == 0
    client.close()


def test_a_session_held_past_the_hold_limit_ends_with_a_bye() -> None:
    core, client = Core(siprec_media_timeout_s=10.0, siprec_max_hold_s=100.0), RecordingClient(SrcOptions())
    opened(core, client)
    request = reinvite(client, "inactive")
    (held,) = core.send(request)
    assert held.status == 200 and core.server.sessions[client.call_id].held
    core.send(ack_for(client, request, held))
    assert [m for _ in range(9) for m in core.tick(10.0)] == []  # 90 s held: past the media timeout, kept
    (bye,) = [m for _ in range(2) for m in core.tick(10.0)]
    assert bye.method == "BYE" and core.server.sessions == {}
    assert [e.reason for e in core.sink.ends] == ["hold limit"]
    client.close()


def test_one_source_cannot_take_every_slot() -> None:
    core = Core(siprec_max_sessions=10, siprec_max_sessions_per_source=2)
    clients = [RecordingClient(SrcOptions()) for _ in range(4)]
    one, other = UDP, Peer("udp", "127.0.0.2", 5070)
    assert [core.send(invite(c), one)[0].status for c in clients[:3]] == [200, 200, 503]
    assert core.value("callqa_siprec_refusals_total", reason="source_session_limit") == 1
    assert core.send(invite(clients[3]), other)[0].status == 200
    for c in clients:
        c.close()


def authorized_invite(core: Core, client: RecordingClient, user: str, password: str,
                      uri: str | None = None) -> SipMessage:
    request = invite(client)
    (challenge,) = core.send(request)
    assert challenge.status == 401
    auth = authorization("INVITE", uri or client.uri, user, password, challenge.header("www-authenticate") or "")
    return invite(client, [("authorization", auth)])


def test_one_tenant_cannot_take_every_slot() -> None:
    core = Core(siprec_users=SecretStr("a:pa,b:pb"), siprec_max_sessions=10, siprec_max_sessions_per_tenant=1,
                siprec_source_invites_per_s=0)
    first, second, third = (RecordingClient(SrcOptions()) for _ in range(3))
    assert core.send(authorized_invite(core, first, "a", "pa"))[0].status == 200
    assert core.send(authorized_invite(core, second, "a", "pa"))[0].status == 503
    assert core.value("callqa_siprec_refusals_total", reason="tenant_session_limit") == 1
    assert core.send(authorized_invite(core, third, "b", "pb"))[0].status == 200
    for c in (first, second, third):
        c.close()


def test_digest_credentials_for_another_request_uri_are_refused() -> None:
    core, client = Core(siprec_users=SecretStr("a:pa")), RecordingClient(SrcOptions())
    (refused,) = core.send(authorized_invite(core, client, "a", "pa", uri="sip:srs@elsewhere.example"))
    assert refused.status == 401 and core.server.sessions == {}
    assert core.value("callqa_siprec_refusals_total", reason="bad_uri") == 1
    client.close()


def test_a_replayed_authorized_invite_opens_nothing() -> None:
    """A captured INVITE with its Authorization, replayed under a new Call-ID (a new session): refused."""
    core, client = Core(siprec_users=SecretStr("a:pa")), RecordingClient(SrcOptions())
    request = authorized_invite(core, client, "a", "pa")
    assert core.send(request)[0].status == 200
    replay = SipMessage(method="INVITE", uri=request.uri, body=request.body, headers=[
        (n, "replayed@evil" if n == "call-id" else v.replace("branch=", "branch=z9hG4bKreplay")
         if n == "via" else v) for n, v in request.headers])
    (refused,) = core.send(replay)
    assert refused.status == 401 and list(core.server.sessions) == [client.call_id]
    client.close()


def test_new_sdes_keys_in_a_reinvite_and_an_update_are_taken() -> None:
    """The SBC re-keys (hold, resume, transfer): packets under the new key authenticate and are recorded,
    by re-INVITE and by UPDATE."""
    core, client = Core(), RecordingClient(SrcOptions(srtp=True))
    opened(core, client)
    packets = packetize(TONE, "pcmu", 0, ssrc=7)  # 50 packets, sequence and timestamps running on
    key = client.keys[0]
    assert key is not None
    for p in packets[:10]:
        core.server.on_rtp((client.call_id, 0), SrtpSender(key).protect(p), RTP_SOURCE)
    client.keys = [new_crypto(), new_crypto()]
    assert core.send(reinvite(client))[0].status == 200
    key = client.keys[0]
    assert key is not None
    sender = SrtpSender(key)
    for p in packets[10:30]:
        core.server.on_rtp((client.call_id, 0), sender.protect(p), RTP_SOURCE)
    client.keys = [new_crypto(), new_crypto()]
    content_type, body = client.offer()
    assert core.send(client._request("UPDATE", body, content_type))[0].status == 200
    key = client.keys[0]
    assert key is not None
    sender = SrtpSender(key)
    for p in packets[30:]:
        core.server.on_rtp((client.call_id, 0), sender.protect(p), RTP_SOURCE)
    core.server.end(client.call_id, "bye")
    core.calls.tick()
    assert core.value("callqa_siprec_rtp_packets_total", outcome="srtp_auth") == 0
    assert core.value("callqa_siprec_rtp_packets_total", outcome="audio") == 50
    assert core.sink.ends[0].frame_counts == {"customer": 5}
    client.close()


def test_the_same_call_id_from_two_tenants_names_two_calls() -> None:
    core = Core(siprec_users=SecretStr("a:pa,b:pb"))
    first, second = RecordingClient(SrcOptions(), "shared-1@sbc"), RecordingClient(SrcOptions(), "shared-1@sbc")
    request = authorized_invite(core, first, "a", "pa")
    (ok,) = core.send(request)
    core.send(ack_for(first, request, ok))
    assert core.send(first._request("BYE"))[0].status == 200
    core.tick(1.0)
    assert core.send(authorized_invite(core, second, "b", "pb"))[0].status == 200
    assert [(e.tenant, e.call_id) for e in core.sink.starts] == [("a", "a/shared-1@sbc"), ("b", "b/shared-1@sbc")]
    first.close()
    second.close()


def test_a_long_call_id_with_semicolons_and_ats_is_bounded_and_names_a_file(tmp_path: Path) -> None:
    from pipeline.recordings.storage import RecordingStore

    sip_id = "x;y@" * 60  # 240 characters, 720 URL-quoted: past a file name's 255 bytes
    core, client = Core(), RecordingClient(SrcOptions(), sip_id)
    opened(core, client)
    (start,) = core.sink.starts
    assert len(start.call_id) <= MAX_CALL_ID_CHARS and start.call_id != sip_id
    assert RecordingStore(str(tmp_path)).put(start.call_id, b"audio")
    assert call_id_for("", sip_id) == start.call_id != call_id_for("", sip_id[:-1])  # stable, and distinct
    assert call_id_for("", "a84b4c76e66710@pc33.example.com") == "a84b4c76e66710@pc33.example.com"
    assert len(urllib.parse.quote(call_id_for("t" * 300, sip_id) or "", safe="")) < 200
    client.close()


@pytest.mark.parametrize("sip_id", ["caf\u00e9@sbc", "x" * 300])
def test_a_call_id_that_cannot_be_made_safe_is_refused_400(sip_id: str) -> None:
    core, client = Core(), RecordingClient(SrcOptions(), sip_id)
    (refused,) = core.send(invite(client))
    assert refused.status == 400 and "bad_call_id" in (refused.header("warning") or "")
    assert core.server.sessions == {} and core.sink.starts == []
    client.close()


def test_participants_from_reinvite_metadata_are_bounded_per_session() -> None:
    core, client = Core(), RecordingClient(SrcOptions())
    opened(core, client)

    def partial(first: int) -> bytes:
        people = [(f"p{i}", f"sip:{i}@pbx", f"s{i}", str(i)) for i in range(first, first + 40)]
        return build_metadata(client.call_id, people).replace(b">complete<", b">partial<")

    assert core.send(reinvite(client, metadata=partial(100)))[0].status == 200
    (refused,) = core.send(reinvite(client, metadata=partial(200)))
    assert refused.status == 400 and "metadata_limit" in (refused.header("warning") or "")
    metadata = core.server.sessions[client.call_id].metadata
    assert metadata is not None and len(metadata.participants) == 42
    client.close()


def test_reoffers_are_rate_limited_per_session() -> None:
    core, client = Core(), RecordingClient(SrcOptions())
    opened(core, client)
    statuses = [core.send(client._request("UPDATE"))[0].status for _ in range(int(REOFFER_BURST) + 1)]
    assert statuses == [200] * int(REOFFER_BURST) + [503]
    assert core.value("callqa_siprec_refusals_total", reason="reoffer_rate") == 1
    core.clock.advance(5.0)
    assert core.send(reinvite(client))[0].status == 200
    client.close()


def test_rtp_is_latched_to_the_source_the_sdp_and_first_packet_name() -> None:
    """The SDP says 127.0.0.1: a packet from elsewhere before or after is dropped and counted; the first
    from 127.0.0.1 latches its port, and another port of the same host is dropped after it."""
    core, client = Core(), RecordingClient(SrcOptions())
    opened(core, client)
    packets = packetize(TONE, "pcmu", 0, ssrc=9)
    key = (client.call_id, 0)
    core.server.on_rtp(key, packets[0], ("127.0.0.2", 4000))  # not the host the SDP names
    for p in packets[:25]:
        core.server.on_rtp(key, p, RTP_SOURCE)
    injected = packetize((np.ones(8000) * 9000).astype(np.int16), "pcmu", 0, ssrc=9)
    for p in injected[25:]:
        core.server.on_rtp(key, p, ("127.0.0.1", RTP_SOURCE[1] + 1))
    for p in packets[25:]:
        core.server.on_rtp(key, p, RTP_SOURCE)
    core.server.end(client.call_id, "bye")
    core.calls.tick()
    assert core.value("callqa_siprec_rtp_packets_total", outcome="wrong_source") == 26
    assert core.value("callqa_siprec_rtp_packets_total", outcome="audio") == 50
    assert core.value("callqa_siprec_rtp_packets_total", outcome="duplicate") == 0
    client.close()
