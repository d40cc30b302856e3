"""The SIPREC server's signalling against SIPp (Debian's sip-tester), an independent SIP implementation: the
digest challenge, a wrong password, OPTIONS, a retransmitted INVITE, CANCEL, re-INVITE hold, and a
malformed message; the media from the project's own RTP sender. The gateway runs in this process on the
real broker (tests/gateway/conftest.py); SIPp is a child process on this event loop."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pipeline.gateway.siprec.client import RecordingClient, SrcOptions
from tests.gateway.test_process import free_port

pytestmark = [pytest.mark.broker, pytest.mark.skipif(shutil.which("sipp") is None, reason="sip-tester not installed")]

SCENARIOS = Path(__file__).parent / "sipp"


async def sipp(port: int, scenario: str, tmp: Path, *args: str, transport: str = "u1",
               pause_ms: int = 0) -> tuple[int, str]:
    """SIPp's exit status (0: every call succeeded) and its message trace."""
    trace = tmp / f"{scenario}.messages"
    proc = await asyncio.create_subprocess_exec(
        "sipp", f"127.0.0.1:{port}", "-sf", str(SCENARIOS / f"{scenario}.xml"), "-m", "1", "-t", transport,
        "-i", "127.0.0.1", "-p", str(free_port()), "-mp", str(free_port()), "-nostdin", "-timeout", "30s",
        "-timeout_error", "-trace_msg", "-message_file", str(trace), "-trace_err", "-error_file",
        str(tmp / f"{scenario}.errors"), "-d", str(pause_ms), *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=tmp)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = trace.read_text(errors="replace") if trace.exists() else ""
    assert proc.returncode is not None
    if proc.returncode != 0:
        errors = tmp / f"{scenario}.errors"
        text += "\n--- errors ---\n" + (errors.read_text(errors="replace") if errors.exists() else err.decode())
    return proc.returncode, text


async def gateway(start_gateway: Any, **overrides: Any) -> tuple[Any, int]:
    gw = await start_gateway(**overrides)
    port, _ = await gw.server.start_siprec("127.0.0.1", 0)
    return gw, port


def value(gw: Any, name: str, **labels: str) -> float:
    return float(gw.server.metrics.value(name, **labels))


async def test_options_is_answered(start_gateway, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway)
    rc, trace = await sipp(port, "siprec_options", tmp_path)
    assert rc == 0, trace
    assert "Allow: INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE, INFO" in trace


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_the_digest_challenge_answered_opens_a_session_with_the_user_as_tenant(
        start_gateway, read_calls, tmp_path, transport: str) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway, siprec_users=SecretStr("sbc1:s3cret,sbc2:other"))
    rc, trace = await sipp(port, "siprec_auth", tmp_path, "-au", "sbc1", "-ap", "s3cret", transport=transport)
    assert rc == 0, trace
    assert "WWW-Authenticate: Digest" in trace
    _, events = await read_calls(gw.settings, events=2, idle_s=3.0)
    start = next(e for e in events if e.event_type == "start")
    assert (start.tenant, start.agent_id, start.legs) == ("sbc1", "agent1001", ["agent", "customer"])
    assert [e.reason for e in events if e.event_type == "end"] == ["bye"]
    assert value(gw, "callqa_siprec_digest_challenges_total") == 1


async def test_a_wrong_password_is_refused_and_leaves_nothing_behind(start_gateway, read_calls, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway, siprec_users=SecretStr("sbc1:s3cret"))
    rc, trace = await sipp(port, "siprec_auth_refused", tmp_path, "-au", "sbc1", "-ap", "wrong")
    assert rc == 0, trace
    frames, events = await read_calls(gw.settings, idle_s=2.0)
    assert frames == [] and events == []
    assert value(gw, "callqa_siprec_refusals_total", reason="bad_response") == 1
    assert gw.server.siprec.server.sessions == {}


async def test_a_source_not_allowed_is_refused_403(start_gateway, read_calls, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway, siprec_allow="10.0.0.0/8")
    rc, trace = await sipp(port, "siprec_options_refused", tmp_path)
    assert rc == 0, trace
    assert value(gw, "callqa_siprec_refusals_total", reason="source_not_allowed") == 1


async def test_a_retransmitted_invite_is_answered_again_never_a_second_call(start_gateway, read_calls) -> None:  # type: ignore[no-untyped-def]
    """The same INVITE datagram twice (an SBC that missed the 200): the same answer twice, one session. SIPp
    only retransmits what gets no answer, so the project's client sends the copy."""
    gw, port = await gateway(start_gateway)
    client = RecordingClient(SrcOptions(port=port))
    content_type, body = client.offer()
    invite = client._request("INVITE", body, content_type, [("require", "siprec")])
    answers = []
    for _ in range(2):
        client.channel.send(invite)
        answers.append(await asyncio.to_thread(client.channel._receive))
    assert [a.status for a in answers] == [200, 200] and answers[0].to_bytes() == answers[1].to_bytes()
    client.to_value = answers[0].header("to") or ""
    client._ack(invite, answers[0])
    assert await asyncio.to_thread(client.bye) == 200
    client.close()
    _, events = await read_calls(gw.settings, events=2, idle_s=3.0)
    assert [e.event_type for e in events] == ["start", "end"]
    assert value(gw, "callqa_siprec_retransmissions_total") == 1
    assert value(gw, "callqa_siprec_sessions_total", outcome="accepted") == 1


async def test_cancel_after_the_answer_changes_nothing(start_gateway, read_calls, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway)
    rc, trace = await sipp(port, "siprec_cancel", tmp_path)
    assert rc == 0, trace
    _, events = await read_calls(gw.settings, events=2, idle_s=3.0)
    assert [(e.event_type, e.reason) for e in events] == [("start", None), ("end", "bye")]


async def test_a_reinvite_to_inactive_holds_the_call_and_back_resumes_it(start_gateway, read_calls, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway)
    rc, trace = await sipp(port, "siprec_reinvite", tmp_path)
    assert rc == 0, trace
    assert trace.count("a=inactive") >= 2  # offered, and answered
    _, events = await read_calls(gw.settings, events=4, idle_s=3.0)
    assert [e.event_type for e in events] == ["start", "hold", "resume", "end"]


async def test_sipp_s_malformed_invites_are_answered_400_and_leave_nothing(start_gateway, read_calls, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SIPp sends an INVITE whose SDP has a port that is not a number, then one whose Content-Length is a
    word: 400 each (with a Warning saying what), no session, nothing on the topics; then OPTIONS works."""
    gw, port = await gateway(start_gateway)
    rc, trace = await sipp(port, "siprec_malformed", tmp_path)
    assert rc == 0, trace
    assert trace.count("SIP/2.0 400") == 2 and "Warning: 399 callqa" in trace
    frames, events = await read_calls(gw.settings, idle_s=2.0)
    assert frames == [] and events == [] and gw.server.siprec.server.sessions == {}
    rc, trace = await sipp(port, "siprec_options", tmp_path)
    assert rc == 0, trace


async def test_malformed_messages_are_answered_400_or_dropped_and_the_server_goes_on(start_gateway, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw, port = await gateway(start_gateway)
    bad = [
        b"INVITE sip:srs@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bKx\r\nFrom: <sip:a@b>;tag=1\r\n"
        b"To: <sip:srs@c>\r\nCall-ID: bad1@test\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n",  # CSeq of another method
        b"\x00\xff garbage \r\n\r\n",
        b"INVITE sip:srs@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bKy\r\n\r\n",  # no From etc.
    ]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(2)
        for data in bad:
            s.sendto(data, ("127.0.0.1", port))
        s.sendto(bad[0], ("127.0.0.1", port))
        answers = []
        for _ in range(2):
            answers.append(await asyncio.to_thread(s.recv, 65536))
    assert all(a.startswith(b"SIP/2.0 400 ") for a in answers)
    assert value(gw, "callqa_siprec_malformed_total", outcome="answered") == 2
    assert value(gw, "callqa_siprec_malformed_total", outcome="dropped") == 2
    rc, trace = await sipp(port, "siprec_options", tmp_path)  # still serving
    assert rc == 0, trace


async def sipp_session(port: int, tmp: Path, pause_ms: int, customer: bytes, agent: bytes,
                       **options: Any) -> tuple[str, str]:
    """A recording session whose signalling is SIPp's (siprec_call.xml: INVITE, ACK, a pause, BYE) and whose
    RTP the project's client sends to the ports in the 200 OK SIPp received; returns (Call-ID, trace)."""
    task = asyncio.create_task(sipp(port, "siprec_call", tmp, pause_ms=pause_ms))
    trace_file = tmp / "siprec_call.messages"
    text = ""
    for _ in range(200):
        await asyncio.sleep(0.05)
        text = trace_file.read_text(errors="replace") if trace_file.exists() else ""
        if "SIP/2.0 200" in text and "m=audio" in text.split("SIP/2.0 200", 1)[1]:
            break
    answer = text.split("SIP/2.0 200", 1)[1]
    ports = [int(line.split()[1]) for line in answer.splitlines() if line.startswith("m=audio")]
    call_id = next(line.split(":", 1)[1].strip() for line in answer.splitlines() if line.startswith("Call-ID:"))
    assert len(ports) == 2 and all(ports), text
    client = RecordingClient(SrcOptions(port=port, **options))
    client.report.ports = ports
    try:
        await asyncio.to_thread(client.send_audio, customer, agent)
    finally:
        client.close()
    rc, trace = await task
    assert rc == 0, trace
    return call_id, trace


async def test_a_session_from_sipp_with_our_rtp_reaches_the_topics_as_sent(start_gateway, read_calls,
                                                                           recording_mulaw, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SIPp opens the session and ends it after its pause; meanwhile the project's sender sends both legs'
    RTP (PCMU, 4x real time)."""
    gw, port = await gateway(start_gateway, audio_message_ms=200)
    customer, agent = recording_mulaw[:24000], recording_mulaw[8000:32000]  # 3 s each
    call_id, _ = await sipp_session(port, tmp_path, 4000, customer, agent, speed=4.0)
    frames, events = await read_calls(gw.settings, frames=30, events=2, idle_s=3.0)
    by_leg = {leg: b"".join(f.payload for f in sorted(frames, key=lambda f: f.seq) if f.leg == leg)
              for leg in ("customer", "agent")}
    assert by_leg == {"customer": customer, "agent": agent}
    start, end = (next(e for e in events if e.event_type == k) for k in ("start", "end"))
    assert start.call_id == call_id and start.agent_id == "agent1001" and "5551234567" not in repr(events)
    assert end.frame_counts == {"agent": 15, "customer": 15} and end.reason == "bye"
    assert all(f.seq * 200 == f.start_ms and f.call_id == call_id for f in frames)


async def test_srtp_required_takes_an_sdes_offer_and_refuses_plain_rtp(start_gateway, read_calls,
                                                                       recording_mulaw) -> None:  # type: ignore[no-untyped-def]
    """CALLQA_SIPREC_SRTP=required: an RTP/SAVP offer (SDES AES_CM_128_HMAC_SHA1_80) is answered with a key of
    ours and its SRTP decrypted to the sent audio; a plain RTP offer gets 488 and produces nothing."""
    from pipeline.gateway.siprec.client import ClientError, record

    gw, port = await gateway(start_gateway, audio_message_ms=200, siprec_srtp="required")
    customer, agent = recording_mulaw[:16000], recording_mulaw[16000:32000]  # 2 s each
    report = await asyncio.to_thread(record, SrcOptions(port=port, speed=4.0, srtp=True), customer, agent)
    assert report.status == 200 and report.bye_status == 200
    with pytest.raises(ClientError) as refused:
        await asyncio.to_thread(record, SrcOptions(port=port, speed=0.0), customer, agent)
    assert refused.value.status == 488
    frames, events = await read_calls(gw.settings, frames=20, events=2, idle_s=3.0)
    assert {e.call_id for e in events} == {report.call_id}
    by_leg = {leg: b"".join(f.payload for f in sorted(frames, key=lambda f: f.seq) if f.leg == leg)
              for leg in ("customer", "agent")}
    assert by_leg == {"customer": customer, "agent": agent}
    assert value(gw, "callqa_siprec_refusals_total", reason="srtp_required") == 1


async def test_sip_over_tls_on_the_sips_port(start_gateway, tls_files) -> None:  # type: ignore[no-untyped-def]
    """--sips-port serves SIP over TLS with the gateway's certificate (Debian's SIPp is built without TLS, so
    Python's ssl is the client): an OPTIONS over a verified TLS connection is answered on it."""
    import ssl

    from pipeline.gateway.siprec.message import StreamFramer, parse

    cert_file, key_file = tls_files
    gw = await start_gateway(gateway_tls_cert=cert_file, gateway_tls_key=key_file)
    _, tls_port = await gw.server.start_siprec("127.0.0.1", 0, 0)
    assert tls_port
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_port,
                                                   ssl=ssl.create_default_context(cafile=str(cert_file)))
    options = (f"OPTIONS sip:srs@127.0.0.1:{tls_port} SIP/2.0\r\nVia: SIP/2.0/TLS 127.0.0.1:5999;branch=z9hG4bKtls1\r\n"
               "From: <sip:src@127.0.0.1>;tag=1\r\nTo: <sip:srs@127.0.0.1>\r\nCall-ID: tls-1@test\r\n"
               "CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
    writer.write(options.encode())
    framer, messages = StreamFramer(), []
    while not messages:
        messages = framer.feed(await asyncio.wait_for(reader.read(65536), 10))
    writer.close()
    answer = parse(messages[0], stream=True)
    assert answer.status == 200 and answer.header("allow") and answer.call_id == "tls-1@test"
