"""`callqa gateway simulate` against an in-process gateway and the real broker: what it sends is the
file's audio, signed, for each protocol (SIPREC: a digest answered); a refusal is one clear error."""

from __future__ import annotations

import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.contracts import AudioFrame
from pipeline.gateway.simulate import SimulateOptions, SimulationError, recordings_of, simulate

pytestmark = pytest.mark.broker


def leg_audio(frames: list[AudioFrame], leg: str) -> bytes:
    return b"".join(f.payload for f in sorted(frames, key=lambda f: f.seq) if f.leg == leg)


@pytest.fixture
def stereo_call(tmp_path: Path, recording_mulaw: bytes) -> Path:
    """A 2 s stereo call at 8 kHz: left (agent) and right (customer) different speech."""
    left, right = (codecs.decode(recording_mulaw[at:at + 16000], "mulaw") for at in (0, 16000))
    pcm = (np.stack([left, right], axis=1) * 32767).astype("<i2")
    path = tmp_path / "call.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(pcm.tobytes())
    return path


def signed(protocol: str, url: str) -> SimulateOptions:
    from tests.gateway.conftest import AUDIOHOOK_KEY, AUDIOHOOK_SECRET, TWILIO_TOKEN

    return SimulateOptions(protocol, url=url, realtime=False, twilio_auth_token=TWILIO_TOKEN,  # type: ignore[arg-type]
                           audiohook_api_key=AUDIOHOOK_KEY, audiohook_client_secret=AUDIOHOOK_SECRET,
                           tenant="acme", queue="billing")


async def test_twilio_calls_carry_the_files_audio(start_gateway, credentials, stereo_call,
                                                  read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    recordings = recordings_of([stereo_call])
    report = await simulate(recordings, signed("twilio", gw.url))
    [call_id] = report.call_ids
    assert call_id.startswith("CA") and report.calls[0].frames == {"agent": 100, "customer": 100}
    frames, events = await read_calls(gw.settings, frames=200, events=2)
    assert {f.call_id for f in frames} == {call_id}
    assert leg_audio(frames, "agent") == recordings[0].encoded["agent"]
    assert leg_audio(frames, "customer") == recordings[0].encoded["customer"]
    start = next(e for e in events if e.event_type == "start")
    end = next(e for e in events if e.event_type == "end")
    assert (start.call_id, start.tenant, start.queue) == (call_id, "acme", "billing")
    assert end.frame_counts == {"agent": 100, "customer": 100} and end.reason == "stop"


async def test_audiohook_calls_carry_the_files_audio_and_pause_for_holds(
        start_gateway, credentials, stereo_call, read_calls) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    recordings = recordings_of([stereo_call])
    recordings[0].holds_ms = [(1000, 1400)]  # frames 50-69: paused, then resumed with 0.4 s discarded
    report = await simulate(recordings, replace(signed("audiohook", gw.url), calls=2))
    assert len(set(report.call_ids)) == 2
    frames, events = await read_calls(gw.settings, frames=2 * 160, events=8)
    for call_id in report.call_ids:
        mine = [f for f in frames if f.call_id == call_id]
        for leg in ("agent", "customer"):
            audio = recordings[0].encoded[leg]
            assert sorted(f.seq for f in mine if f.leg == leg) == [*range(50), *range(70, 100)]
            assert leg_audio(mine, leg) == audio[:50 * 160] + audio[70 * 160:]
    for call_id in report.call_ids:  # the pause is the call's hold
        assert [e.event_type for e in events if e.call_id == call_id] == ["start", "hold", "resume", "end"]
    ends = [e for e in events if e.event_type == "end"]
    assert sorted(e.call_id for e in ends) == sorted(report.call_ids)
    assert all(e.frame_counts == {"agent": 100, "customer": 100} and e.reason == "close (end)" for e in ends)


async def test_a_refused_handshake_is_one_clear_error(start_gateway, credentials,
                                                      stereo_call) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(**credentials)
    recordings = recordings_of([stereo_call])
    with pytest.raises(SimulationError, match=r"refused the twilio handshake .*HTTP 403 \(refused: bad_signature\)"):
        await simulate(recordings, replace(signed("twilio", gw.url), twilio_auth_token="wrong"))
    with pytest.raises(SimulationError, match=r"refused the audiohook handshake .*HTTP 401 \(refused: bad_api_key\)"):
        await simulate(recordings, replace(signed("audiohook", gw.url), audiohook_api_key="wrong"))


async def test_siprec_sessions_carry_the_files_audio_and_a_refusal_is_one_line(
        start_gateway, stereo_call, read_calls) -> None:  # type: ignore[no-untyped-def]
    from pydantic import SecretStr

    gw = await start_gateway(siprec_users=SecretStr("acme:sbc-secret"))
    sip_port, _ = await gw.server.start_siprec("127.0.0.1", 0)
    recordings = recordings_of([stereo_call])
    options = SimulateOptions("siprec", url=f"sip:127.0.0.1:{sip_port}", calls=2, realtime=False,
                              siprec_user="acme", siprec_password="sbc-secret")
    report = await simulate(recordings, options)  # the digest challenge answered
    assert len(set(report.call_ids)) == 2 and all(c.frames == {"agent": 100, "customer": 100} for c in report.calls)
    frames, events = await read_calls(gw.settings, frames=2 * 200, events=4)
    # The call ID is the SIP Call-ID scoped by the digest user's tenant, and the report names it so.
    assert all(c.startswith("acme/") and len(c) > len("acme/") for c in report.call_ids)
    for call_id in report.call_ids:
        mine = [f for f in frames if f.call_id == call_id]
        for leg in ("agent", "customer"):
            assert leg_audio(mine, leg) == recordings[0].encoded[leg]
        start, end = (next(e for e in events if e.call_id == call_id and e.event_type == k) for k in ("start", "end"))
        assert start.tenant == "acme"  # the digest user
        assert end.frame_counts == {"agent": 100, "customer": 100} and end.reason == "bye"
    with pytest.raises(SimulationError, match=r"refused the siprec session .*: INVITE answered 401 Unauthorized$"):
        await simulate(recordings, replace(options, url=f"sip:127.0.0.1:{sip_port};transport=tcp", calls=1,
                                           siprec_password="wrong"))
