"""The recording server's core without sockets or Kafka: timers on a manual clock, the agent's stream, the
caps at the door, and what a refusal leaves (nothing). The shell and SIPp: test_sipp.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.config import Settings
from pipeline.gateway.calls import OpenCalls
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.siprec.client import RecordingClient, SrcOptions
from pipeline.gateway.siprec.message import SipMessage, parse
from pipeline.gateway.siprec.metrics import SiprecMetrics
from pipeline.gateway.siprec.recorder import Peer, RecordingServer
from pipeline.gateway.siprec.rtp_send import packetize
from tests.gateway.conftest import ManualClock, RecordingSink
from tests.gateway.siprec.test_fuzz import CountedPorts

UDP = Peer("udp", "127.0.0.1", 5070)
RTP_SOURCE = ("127.0.0.1", 40000)  # where the SRC's RTP comes from: the host its SDP names


class Core:
    def __init__(self, **settings: Any) -> None:
        self.clock = ManualClock()
        self.sink, metrics, self.ports = RecordingSink(), GatewayMetrics(), CountedPorts()
        self.calls = OpenCalls(self.sink, metrics, end_grace_s=0.0, clock=self.clock, message_ms=200)
        self.metrics = metrics
        self.server = RecordingServer(Settings(**settings), self.calls, self.ports, SiprecMetrics(metrics.registry),
                                      "127.0.0.1", 5060, clock=self.clock)

    def send(self, msg: SipMessage, peer: Peer = UDP) -> list[SipMessage]:
        return [parse(o.data) for o in self.server.on_message(parse(msg.to_bytes()), peer)]

    def tick(self, seconds: float) -> list[SipMessage]:
        self.clock.advance(seconds)
        out = [parse(o.data) for o in self.server.tick()]
        self.calls.tick()
        return out

    def value(self, name: str, **labels: str) -> float:
        return float(self.metrics.value(name, **labels))


def invite(client: RecordingClient, extra: list[tuple[str, str]] | None = None) -> SipMessage:
    content_type, body = client.offer()
    return client._request("INVITE", body, content_type, [("require", "siprec"), *(extra or [])])


def ack_for(client: RecordingClient, request: SipMessage, answer: SipMessage) -> SipMessage:
    client.to_value = answer.header("to") or ""
    return SipMessage(method="ACK", uri=client.uri, headers=[
        ("via", client.channel.via()), ("from", request.header("from") or ""), ("to", client.to_value),
        ("call-id", client.call_id), ("cseq", f"{request.cseq[0]} ACK")])


def test_a_2xx_is_sent_again_until_its_ack_and_a_session_never_acked_ends_with_a_bye() -> None:
    core, client = Core(), RecordingClient(SrcOptions())
    request = invite(client)
    (ok,) = core.send(request)
    assert ok.status == 200
    resent = [m for t in (0.5, 1.0, 2.0, 4.0) for m in core.tick(t)]
    assert [m.status for m in resent] == [200] * 4
    out = [m for _ in range(8) for m in core.tick(4.0)]  # past 32 s: Timer H
    byes = [m for m in out if m.method == "BYE"]
    assert len(byes) == 1 and byes[0].call_id == client.call_id and core.server.sessions == {}
    assert [e.reason for e in core.sink.ends] == ["no ack"] and core.ports.open_keys == {}
    client.close()


def test_an_acked_session_without_media_ends_at_the_media_timeout() -> None:
    core, client = Core(siprec_media_timeout_s=10.0), RecordingClient(SrcOptions())
    request = invite(client)
    (ok,) = core.send(request)
    assert core.send(ack_for(client, request, ok)) == []
    assert core.tick(0.5) == []  # acknowledged: not sent again
    assert core.tick(5.0) == []
    (bye,) = core.tick(6.0)
    assert bye.method == "BYE" and [e.reason for e in core.sink.ends] == ["media timeout"]
    client.close()


def test_a_session_timer_not_refreshed_ends_the_session_and_an_update_refreshes_it() -> None:
    core, client = Core(siprec_media_timeout_s=1000.0), RecordingClient(SrcOptions())
    request = invite(client, [("session-expires", "90"), ("supported", "timer")])
    (ok,) = core.send(request)
    assert ok.header("session-expires") == "90;refresher=uac" and ok.header("require") == "timer"
    core.send(ack_for(client, request, ok))
    core.tick(80.0)
    (refreshed,) = core.send(client._request("UPDATE"))
    assert refreshed.status == 200 and core.server.sessions
    assert core.tick(80.0) == []
    (bye,) = core.tick(11.0)
    assert bye.method == "BYE" and [e.reason for e in core.sink.ends] == ["session expired"]
    client.close()


def test_the_agent_is_the_aor_the_setting_matches_else_the_callee() -> None:
    for setting, want_agent_label, want_id in (("", "2", "agent1001"), (r"^sip:\+1555", "1", "+15551234567")):
        core, client = Core(siprec_agent_aor=setting), RecordingClient(SrcOptions())
        core.send(invite(client))
        (session,) = core.server.sessions.values()
        legs = {s.index: s.leg for s in session.streams.values()}
        assert legs == ({0: "customer", 1: "agent"} if want_agent_label == "2" else {0: "agent", 1: "customer"})
        assert core.sink.starts[0].agent_id == want_id
        client.close()


def test_the_caps_refuse_with_503_and_leave_nothing() -> None:
    core = Core(siprec_max_sessions=1, siprec_source_invites_per_s=1.0)
    first, second = RecordingClient(SrcOptions()), RecordingClient(SrcOptions())
    assert core.send(invite(first))[0].status == 200
    (busy,) = core.send(invite(second))
    assert busy.status == 503 and busy.header("retry-after") and len(core.server.sessions) == 1
    assert core.sink.starts[0].call_id == first.call_id and len(core.sink.starts) == 1
    rated = Core(siprec_source_invites_per_s=1.0)  # bursts of 2 s worth: the third INVITE at once is refused
    third, fourth, fifth = (RecordingClient(SrcOptions()) for _ in range(3))
    assert [rated.send(invite(c))[0].status for c in (third, fourth, fifth)] == [200, 200, 503]
    assert rated.value("callqa_siprec_refusals_total", reason="invite_rate") == 1
    assert {e.call_id for e in rated.sink.starts} == {third.call_id, fourth.call_id}
    rated.clock.advance(1.0)
    sixth = RecordingClient(SrcOptions())
    assert rated.send(invite(sixth))[0].status == 200
    for c in (first, second, third, fourth, fifth, sixth):
        c.close()


def test_an_unknown_required_extension_gets_420_naming_it() -> None:
    core, client = Core(), RecordingClient(SrcOptions())
    content_type, body = client.offer()
    (answer,) = core.send(client._request("INVITE", body, content_type, [("require", "siprec, 100rel, foo")]))
    assert answer.status == 420 and answer.header("unsupported") == "100rel, foo"
    assert core.server.sessions == {} and core.sink.starts == []
    client.close()


def test_a_stream_that_starts_late_starts_where_the_call_is() -> None:
    """The customer's RTP from the start, the agent's first packet 5 s later: the agent's audio goes at 5 s
    on the call, not at 0 (its own timestamps start where it started)."""
    core, client = Core(), RecordingClient(SrcOptions())
    request = invite(client)
    (ok,) = core.send(request)
    core.send(ack_for(client, request, ok))
    tone = (np.sin(np.arange(8000 * 6) / 3) * 8000).astype(np.int16)
    customer = packetize(tone, "pcmu", 0, ssrc=1, first_timestamp=1000)
    agent = packetize(tone[:8000], "pcmu", 0, ssrc=2, first_timestamp=777)
    for i, packet in enumerate(customer):
        core.clock.advance(0.02)
        core.server.on_rtp((client.call_id, 0), packet, RTP_SOURCE)
        if i >= 250 and i - 250 < len(agent):
            core.server.on_rtp((client.call_id, 1), agent[i - 250], RTP_SOURCE)
    core.server.end(client.call_id, "bye")
    core.calls.tick()
    agent_frames = core.sink.leg_frames("agent")
    assert min(f.seq for f in agent_frames) == 5000 // 200
    client.close()


def test_a_g722_stream_is_taken_as_8_khz_audio_of_the_same_length_and_shape() -> None:
    """A wideband PBX's G.722 (RTP clock 8000, 16 kHz audio): the leg comes out at 8 kHz μ-law, as long as
    sent, and follows the sent waveform (a 440 Hz tone through two codecs and a band limit)."""
    from pipeline.audio import codecs

    core, client = Core(), RecordingClient(SrcOptions(encoding="g722"))
    request = invite(client)
    (ok,) = core.send(request)
    core.send(ack_for(client, request, ok))
    t = np.arange(8000 * 2) / 8000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    for packet in packetize(tone, "g722", 9, ssrc=3):
        core.server.on_rtp((client.call_id, 0), packet, RTP_SOURCE)
    core.server.end(client.call_id, "bye")
    core.calls.tick()
    got = codecs.decode(b"".join(f.payload for f in core.sink.leg_frames("customer")), "mulaw")
    assert len(got) == len(tone)
    sent = tone / 32768
    lag = int(np.argmax(np.correlate(got[:2000], sent[:2000], "full"))) - 1999  # the codecs' delay
    assert 0 <= lag < 100
    assert np.corrcoef(got[lag + 500:15000], sent[500:15000 - lag])[0, 1] > 0.95
    client.close()


def test_rtp_that_a_bye_overtook_is_still_written() -> None:
    """The SBC's BYE arrives before the last packets (still in the socket): they go on the leg, and the
    session ends a moment later."""
    core, client = Core(), RecordingClient(SrcOptions())
    request = invite(client)
    (ok,) = core.send(request)
    core.send(ack_for(client, request, ok))
    packets = packetize((np.ones(8000) * 3000).astype(np.int16), "pcmu", 0, ssrc=5)  # 1 s: 5 messages
    for packet in packets[:-5]:
        core.server.on_rtp((client.call_id, 0), packet, RTP_SOURCE)
    (bye_ok,) = core.send(client._request("BYE"))
    assert bye_ok.status == 200 and core.server.sessions
    for packet in packets[-5:]:
        core.server.on_rtp((client.call_id, 0), packet, RTP_SOURCE)
    core.tick(0.3)
    assert core.server.sessions == {} and [e.reason for e in core.sink.ends] == ["bye"]
    assert core.sink.ends[0].frame_counts == {"customer": 5}
    client.close()


def test_a_draining_gateway_refuses_new_invites_and_keeps_its_sessions() -> None:
    core, old, new = Core(), RecordingClient(SrcOptions()), RecordingClient(SrcOptions())
    assert core.send(invite(old))[0].status == 200
    core.server.draining = True  # GatewayServer.shutdown sets it first thing
    (refused,) = core.send(invite(new))
    assert refused.status == 503 and refused.header("retry-after") and old.call_id in core.server.sessions
    assert core.value("callqa_siprec_refusals_total", reason="draining") == 1
    old.close()
    new.close()
