"""`RecordingLoad`, the benchmark's many-sessions SRC, against an in-process gateway and the real broker:
each session's two streams reach the topics as the packets carried them, in real time, and a refused
INVITE is a failure of its session only."""

from __future__ import annotations

import pytest

from pipeline.audio import codecs
from pipeline.gateway.siprec.client import RecordingLoad, SrcOptions
from pipeline.gateway.siprec.rtp_send import packetize

pytestmark = pytest.mark.broker


async def test_a_recording_load_sends_every_session_both_legs_and_counts_a_refusal(
        start_gateway, read_calls, recording_mulaw) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(siprec_max_sessions=2)  # the third INVITE is answered 503
    port, _ = await gw.server.start_siprec("127.0.0.1", 0)
    legs = {"customer": recording_mulaw[:8000], "agent": recording_mulaw[8000:16000]}  # 1 s each
    packets = [packetize(codecs.float_to_pcm16(codecs.decode(audio, "mulaw")), "pcmu", 0, ssrc=0x77 + i)
               for i, audio in enumerate(legs.values())]
    report = await RecordingLoad(SrcOptions(port=port), *packets).run(3, spread_s=0.3)
    assert len(report.call_ids) == 2 and report.packets_sent == 2 * 2 * 50 and len(report.late_s) == 2 * 50
    [failure] = report.failures
    assert failure.endswith("INVITE answered 503 Service Unavailable")
    frames, events = await read_calls(gw.settings, frames=2 * 2 * 50, events=4)
    for call_id in report.call_ids:
        for leg, audio in legs.items():
            mine = sorted((f for f in frames if f.call_id == call_id and f.leg == leg), key=lambda f: f.seq)
            assert b"".join(f.payload for f in mine) == audio
        end = next(e for e in events if e.call_id == call_id and e.event_type == "end")
        assert end.reason == "bye" and end.frame_counts == {"customer": 50, "agent": 50}
