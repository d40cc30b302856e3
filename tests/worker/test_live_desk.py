"""The live desk end to end: a library call replayed in real time to a real worker; its web port's live desk
shows the call while it is in progress (its turns and its escalation alert before the call has ended, none of
it to another tenant's supervisor), and the call leaves the desk when it ends. What was shown is what the
worker stored."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CALL = LIBRARY_DIR / "07_escalation_manager.wav"  # 60 s; the customer asks for a manager at about 15 s


class EventStream(threading.Thread):
    """A client of /api/live/events reading on a thread: each event with the time it came."""

    def __init__(self, port: int, token: str, query: str) -> None:
        super().__init__(daemon=True)
        self.port, self.token, self.query = port, token, query
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.status = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request("GET", f"/api/live/events?{self.query}", headers={"Authorization": f"Bearer {self.token}"})
        response = conn.getresponse()
        self.status = response.status
        fields: dict[str, str] = {}
        while True:
            line = response.readline()  # de-chunked
            if not line:
                return
            text = line.decode().rstrip("\n")
            if text.startswith(":"):
                continue
            if not text:
                if fields:
                    self.events.append((time.monotonic(), fields["event"], json.loads(fields["data"])))
                    fields = {}
                continue
            name, _, value = text.partition(": ")
            fields[name] = value

    def of(self, kind: str, call_id: str) -> list[tuple[float, dict[str, Any]]]:
        return [(at, data) for at, k, data in list(self.events) if k == kind and data.get("call_id") == call_id]


def test_a_call_is_on_the_live_desk_with_its_turns_and_alert_before_it_ends_and_leaves_when_it_ends(
    kafka_settings, start_worker  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker()
    token = worker.env["CALLQA_API_TOKEN"]
    gil = worker.api().send("POST", "/api/users", {"name": "gil", "role": "supervisor", "tenant": "globex"})["token"]
    stream = EventStream(worker.web_port, token, "kinds=call,turn,alert,ended")
    stream.start()

    options = ReplayOptions(encoding="mulaw", frame_ms=200, realtime=True, tenant="acme", call_id_prefix="live")
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    report: list[Any] = []
    sender = threading.Thread(target=lambda: report.append(player.run([load_recording(CALL, options)], options)))
    sender.start()
    deadline = time.monotonic() + 60
    while not stream.events and time.monotonic() < deadline:
        time.sleep(0.2)
    calls: list[dict[str, Any]] = []
    while not calls and time.monotonic() < deadline:  # the call shows once its start event is read
        calls = worker.api().send("GET", "/api/live/calls")["calls"]
        time.sleep(0.5)
    [live] = calls
    call_id = live["call_id"]
    assert (live["tenant"], live["queue"]) == ("acme", "support") and live["agent_id"]
    other = json.loads(_get(worker.web_port, "/api/live/calls", gil))
    assert other["calls"] == []  # another tenant's supervisor sees none of it
    sender.join(120)
    sent_at = time.monotonic()  # the call's last frame and its end event are sent

    deadline = time.monotonic() + 180
    while not stream.of("ended", call_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stream.status == 200
    [(_, ended)] = stream.of("ended", call_id)
    assert ended["page"] == f"/calls/{call_id}"
    assert worker.api().send("GET", "/api/live/calls")["calls"] == []

    finals = [(at, t) for at, t in stream.of("turn", call_id) if t["final"]]
    alerts = stream.of("alert", call_id)
    # The library's manifest: this call's live rules are the escalation request and the customer's sentiment drop.
    assert sorted(a["rule"] for _, a in alerts) == ["customer_sentiment_drop", "escalation_request"]
    escalation = next(at for at, a in alerts if a["rule"] == "escalation_request")
    # Shown while the call went on: turns and the escalation came before its audio had all been sent.
    assert sum(1 for at, _ in finals if at < sent_at) >= 3
    assert escalation < sent_at
    summaries = [s for _, s in stream.of("call", call_id)]
    # (A change inside the summary interval just before the end is not sent: the tombstone follows at once.)
    assert summaries[-1]["turns"] >= 3 and summaries[-1]["customer_talk_ms"] > 0
    assert any(s["alerts"] >= 1 and s["last_alert_rule"] for s in summaries)
    # What the desk showed is what the worker stored, each final once. (The call's end travels on another
    # producer and topic than its last final and was once read first: that final is still shown, after it.)
    worker.wait_for_calls([call_id])
    stored = {(r["segment_id"], r["text"]) for r in worker.query(
        "SELECT segment_id, text FROM segments FINAL WHERE call_id = {id:String} AND is_final", id=call_id)}
    deadline = time.monotonic() + 30
    while {(t["segment_id"], t["text"]) for _, t in finals} != stored and time.monotonic() < deadline:
        time.sleep(0.5)
        finals = [(at, t) for at, t in stream.of("turn", call_id) if t["final"]]
    assert {(t["segment_id"], t["text"]) for _, t in finals} == stored
    assert len(finals) == len(stored)


def _get(port: int, path: str, token: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    assert response.status == 200, response.status
    return response.read().decode()
