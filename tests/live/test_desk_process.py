"""`callqa desk` as a process of its own: it follows the topics from its start, serves the live desk with the
API token, answers /health, and stops on SIGTERM at once although a browser's stream is open."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline.broker.local import free_port
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import LiveCall

pytestmark = [pytest.mark.broker]

TOKEN = "d" * 40  # noqa: S105 - a test token


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
    answer = conn.getresponse()
    return answer.status, answer.read().decode()


def test_the_desk_process_shows_the_calls_in_progress_and_stops_at_once_on_sigterm(
    kafka_settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "CALLQA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap, "CALLQA_API_TOKEN": TOKEN,
           "CALLQA_CLICKHOUSE_URL": f"chdb://{tmp_path / 'chdb'}", "CALLQA_STATE_DIR": str(tmp_path / "state"),
           **{f"CALLQA_{name.upper()}": getattr(kafka_settings, name)
              for name in Settings.model_fields if name.startswith("topic_")}}
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    now = int(time.time() * 1000)
    producer.produce(kafka_settings.topic_live_calls, key=b"before", value=Serde.from_settings().encode(
        LiveCall("before", now - 60_000, now, tenant="acme", agent_id="a1")))  # in progress before the desk starts
    producer.flush(10)
    desk = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "desk", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        health = (0, "")
        while health[0] != 200 and time.monotonic() < deadline and desk.poll() is None:
            with contextlib.suppress(OSError):
                health = _get(port, "/health")
            time.sleep(0.3)
        assert health[0] == 200, (health, desk.poll())
        producer.produce(kafka_settings.topic_live_calls, key=b"after", value=Serde.from_settings().encode(
            LiveCall("after", now, now + 1, tenant="acme", agent_id="a2")))
        producer.flush(10)
        calls: set[str] = set()
        while calls != {"before", "after"} and time.monotonic() < deadline:
            calls = {c["call_id"] for c in json.loads(_get(port, "/api/live/calls")[1])["calls"]}
            time.sleep(0.3)
        assert calls == {"before", "after"}
        assert _get(port, "/live")[0] == 200  # the bearer token opens the pages too

        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        stream.request("GET", "/api/live/events", headers={"Authorization": f"Bearer {TOKEN}"})
        answer = stream.getresponse()
        assert answer.status == 200 and answer.readline().startswith(b"id: ")
        sent = time.monotonic()
        desk.send_signal(signal.SIGTERM)
        assert desk.wait(20) == 0
        assert time.monotonic() - sent < 10  # the open stream did not hold the stop
    finally:
        if desk.poll() is None:
            desk.kill()
            desk.wait()
