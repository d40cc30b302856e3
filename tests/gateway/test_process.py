"""`callqa gateway` as a real process: SIGTERM drains it, and every open call gets its end event."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from pipeline.config import Settings

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited at start"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the gateway did not answer /healthz")


async def test_sigterm_closes_open_streams_and_ends_every_call(kafka_settings, twilio_messages, recording_mulaw,
                                                               read_calls) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {**os.environ, "CALLQA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap,
           "CALLQA_TOPIC_AUDIO": kafka_settings.topic_audio, "CALLQA_TOPIC_CALL_EVENTS": kafka_settings.topic_call_events,
           "CALLQA_GATEWAY_DRAIN_S": "0.5", "CALLQA_GATEWAY_END_GRACE_S": "30", "CALLQA_GATEWAY_AUTH": "off",
                   "CALLQA_GATEWAY_METRICS_PORT": "0", "CALLQA_GATEWAY_SESSION_MESSAGES_PER_S": "0"}
    process = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "gateway", "--port", str(port)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        open_call, ended_call = twilio_messages("CA-open"), twilio_messages("CA-ended")
        async with connect(f"ws://127.0.0.1:{port}/twilio") as done:  # ended, still in its grace at SIGTERM
            for message in [ended_call.start(("inbound",)),
                            *ended_call.chunks_of({"inbound": recording_mulaw[:1600]}), ended_call.stop()]:
                await done.send(message)
        async with connect(f"ws://127.0.0.1:{port}/twilio") as ws:
            for message in [open_call.start(), *open_call.chunks_of({"inbound": recording_mulaw[:4000],
                                                                     "outbound": recording_mulaw[4000:8000]})]:
                await ws.send(message)
            await asyncio.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 20)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        output = (await asyncio.to_thread(process.communicate, timeout=30))[0].decode()
        assert process.returncode == 0, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    def messages(ms: int) -> int:  # of the gateway's default span (CALLQA_AUDIO_MESSAGE_MS), the last one short
        return -(-ms // Settings().audio_message_ms)

    frames, events = await read_calls(kafka_settings, frames=messages(200) + 2 * messages(500), events=4)
    ends = {e.call_id: e for e in events if e.event_type == "end"}
    assert len([e for e in events if e.event_type == "end"]) == 2
    assert ends["CA-open"].reason == "gateway shutdown"
    assert ends["CA-open"].frame_counts == {"customer": messages(500), "agent": messages(500)}
    assert ends["CA-ended"].reason == "stop" and ends["CA-ended"].frame_counts == {"customer": messages(200)}
    assert "frames acknowledged" in output
