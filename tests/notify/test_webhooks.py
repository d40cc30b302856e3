"""Live alerts to webhooks (pipeline/notify/): a real broker's QA topic, a real HTTP receiver on 127.0.0.1 that
checks each request's signature itself (hmac over "<t>.<body>", computed here), the dead-letter topic read back."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from pipeline.broker.local import free_port
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import DeadLetter, QaAlert
from pipeline.notify.notifier import AlertNotifier, NotifyConfigError, check_targets, targets_by_rule
from pipeline.qa.categories import load_categories
from pipeline.qa.rules import load_rules

pytestmark = [pytest.mark.broker]

SECRET = "s" * 32  # noqa: S105 - a test key
TARGETS = {"escalation_request": ("desk",), "cancellation_intent": ("gone",)}


class Receiver:
    """Answers each POST with the next status of ``statuses`` (then 200), keeping what it got."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.got: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def wait(self, count: int, timeout_s: float = 30.0) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.got)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def settings_for(kafka_settings: Settings, receiver: Receiver, **overrides: Any) -> Settings:
    topics = {name: getattr(kafka_settings, name) for name in Settings.model_fields if name.startswith("topic_")}
    return Settings(**{**topics, "bootstrap_servers": kafka_settings.bootstrap, "worker_id": kafka_settings.worker_id,
                       "webhooks": {"desk": receiver.url, "gone": f"http://127.0.0.1:{free_port()}/hook"},
                       "webhook_secret": SECRET, "webhook_backoff_s": 0.05, "webhook_backoff_max_s": 0.2,
                       "webhook_attempts": 3, "desk_url": "https://desk.example.com", **overrides})


def started(settings: Settings) -> AlertNotifier:
    notifier = AlertNotifier(settings, TARGETS)
    notifier.start()
    assert notifier.assigned.wait(60), "the notifier got no partitions"
    return notifier


def send_alert(settings: Settings, call_id: str, rule: str, offset_ms: int = 61_000) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    alert = QaAlert(call_id, rule, "intent", "customer", "detect", offset_ms, "I want to speak to a manager",
                    detected_at_ms=1_700_000_000_000)
    producer.produce(settings.topic_qa, key=call_id.encode(), value=Serde.from_settings().encode(alert))
    producer.flush(10)


def dead_letters(read_topic: Any, settings: Settings) -> list[DeadLetter]:
    serde = Serde.from_settings()
    return [serde.decode(m.value(), DeadLetter) for m in read_topic(settings.bootstrap, settings.topic_dead_letters)]


def test_an_alert_is_posted_once_signed_with_its_call_time_text_and_live_link(
    kafka_settings: Settings, receiver: Receiver
) -> None:
    settings = settings_for(kafka_settings, receiver)
    notifier = started(settings)
    try:
        send_alert(settings, "call-7", "greeting")  # a rule that notifies nobody
        send_alert(settings, "call-7", "escalation_request")
        [(headers, body)] = receiver.wait(1)
        time.sleep(1.0)
        assert len(receiver.got) == 1
    finally:
        notifier.close()
    t, v1 = (part.split("=", 1)[1] for part in headers["x-callqa-signature"].split(","))
    assert abs(int(t) - time.time()) < 60
    assert hmac.compare_digest(v1, hmac.new(SECRET.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest())
    assert json.loads(body) == {
        "call_id": "call-7", "rule": "escalation_request", "category": "intent", "severity": "warning",
        "leg": "customer", "call_time_ms": 61_000, "text": "I want to speak to a manager",
        "detected_at_ms": 1_700_000_000_000, "live_url": "https://desk.example.com/live/call-7"}
    topic, partition, offset = headers["x-callqa-delivery"].rsplit(":", 2)
    assert topic == settings.topic_qa and int(partition) >= 0 and int(offset) >= 1  # the second message


def test_a_failing_receiver_is_tried_again_until_it_takes_the_alert_once(
    kafka_settings: Settings, receiver: Receiver
) -> None:
    receiver.statuses = [500, 503]
    settings = settings_for(kafka_settings, receiver)
    notifier = started(settings)
    try:
        send_alert(settings, "call-8", "escalation_request")
        got = receiver.wait(3)
        time.sleep(1.0)
    finally:
        notifier.close()
    assert len(receiver.got) == 3
    assert [h["x-callqa-attempt"] for h, _ in got] == ["1", "2", "3"]
    assert len({h["x-callqa-delivery"] for h, _ in got}) == 1 and len({b for _, b in got}) == 1


def test_a_receiver_that_stays_down_gets_its_alerts_dead_lettered_and_the_others_go_on(
    kafka_settings: Settings, receiver: Receiver, read_topic: Any
) -> None:
    settings = settings_for(kafka_settings, receiver)
    notifier = started(settings)
    try:
        send_alert(settings, "call-9", "cancellation_intent")  # to "gone": nothing listens there
        send_alert(settings, "call-9", "escalation_request")
        send_alert(settings, "call-9", "cancellation_intent", 90_000)  # "gone" gave up: not tried again
        assert len(receiver.wait(1)) == 1
        deadline = time.monotonic() + 30
        letters: list[DeadLetter] = []
        while len(letters) < 2 and time.monotonic() < deadline:
            letters = dead_letters(read_topic, settings)
    finally:
        notifier.close()
    assert [json.loads(b)["call_id"] for _, b in receiver.got] == ["call-9"]
    first, second = letters
    assert first.call_id == "call-9" and first.original_topic == settings.topic_qa
    assert first.reason.startswith("webhook gone: gave up after 3 tries (not reached")
    assert second.reason.startswith("webhook gone: skipped") and second.original_offset > first.original_offset
    assert "manager" not in first.reason + second.reason  # a reference, never the alert's text


def test_a_restarted_notifier_goes_on_after_the_alerts_it_sent(
    kafka_settings: Settings, receiver: Receiver
) -> None:
    settings = settings_for(kafka_settings, receiver)
    first = started(settings)
    send_alert(settings, "call-a", "escalation_request")
    receiver.wait(1)
    first.close()
    send_alert(settings, "call-b", "escalation_request")  # while no notifier runs
    second = started(settings)
    try:
        receiver.wait(2)
        time.sleep(2.0)
    finally:
        second.close()
    assert [json.loads(b)["call_id"] for _, b in receiver.got] == ["call-a", "call-b"]


def test_a_slack_webhook_gets_a_message_with_the_rule_and_the_calls_link(
    kafka_settings: Settings, receiver: Receiver
) -> None:
    settings = settings_for(kafka_settings, receiver, webhook_format="slack")
    notifier = started(settings)
    try:
        send_alert(settings, "call-s", "escalation_request", 75_000)
        [(_, body)] = receiver.wait(1)
    finally:
        notifier.close()
    assert json.loads(body) == {"text": "*escalation_request* (warning) on call "
                                        "<https://desk.example.com/live/call-s|call-s> at 1:15, customer: "
                                        "\u201cI want to speak to a manager\u201d"}


def test_rules_and_categories_name_their_webhooks_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "categories").mkdir()
    (tmp_path / "r.yaml").write_text(
        "version: 1\nrules:\n"
        "  - {name: escalation_request, category: intent, type: detect, leg: customer, phrases: [speak to a manager],"
        " notify: [desk]}\n"
        "  - {name: cancellation_intent, category: intent, type: detect, leg: customer, phrases: [cancel my account]}\n")
    (tmp_path / "categories" / "c.yaml").write_text(
        "version: 1\ncategories:\n  - {name: leaving, any: [cancellation_intent, escalation_request], notify: [retention]}\n")
    rule_set = load_rules(str(tmp_path))
    targets = targets_by_rule(rule_set, load_categories(str(tmp_path), rule_set))
    assert targets == {"escalation_request": ("desk", "retention"), "cancellation_intent": ("retention",)}
    with pytest.raises(NotifyConfigError, match="rules notify 'retention', which CALLQA_WEBHOOKS does not define"):
        check_targets(Settings(webhooks={"desk": "https://a.example/h"}, webhook_secret=SECRET), targets)
    with pytest.raises(NotifyConfigError, match="CALLQA_WEBHOOK_SECRET is empty"):
        check_targets(Settings(webhooks={"desk": "https://a", "retention": "https://b"}), targets)
