"""``AlertNotifier``: the live alerts on the QA topic sent to the webhooks their rules and categories name.

Every worker runs one, in one consumer group (``<worker_id>.notify``): the QA topic's partitions are shared
among them, so each alert is sent by one worker, on a thread of its own (nothing in the worker waits on a
receiver). read_committed: an alert of a transaction that was aborted is never sent; its replay is, once.
An alert's offset is committed once every target has it or has given up, so a restarted or rebalanced
notifier goes on after it: once per alert across restarts (a worker killed between a request and its commit
sends that one again, with the same ``X-Callqa-Delivery`` id). A new group starts at the topic's end, and
commits that start at once: alerts from before the first start are not sent, those written while no notifier
runs are sent at the next start.

A try that fails (no answer, 5xx, 408, 429) is tried again after 0.5, 1, 2 ... s (``webhook_backoff_s``,
doubled, capped); after ``webhook_attempts`` the alert goes to the dead-letter topic with the reason, and for
``webhook_open_s`` that receiver's next alerts go there untried. Any other 4xx is dead-lettered at once: the
receiver refused it, and it would refuse it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry, Counter

from pipeline.broker.security import kafka_config
from pipeline.config import Settings
from pipeline.contracts.messages import DeadLetter, QaAlert
from pipeline.contracts.serde import ContractError, Serde
from pipeline.notify.webhook import Delivery, WebhookError, body_of, live_link, post, signature
from pipeline.qa.call import QaConfig
from pipeline.qa.categories import Category
from pipeline.qa.rules import RuleSet

log = logging.getLogger("callqa.notify")
# A receiver's answer that another try cannot change: it refused the request as such.
RETRIED_4XX = {408, 425, 429}


class NotifyConfigError(ValueError):
    """The rules name a webhook the settings do not define, or webhooks have no signing key."""


def targets_by_rule(rule_set: RuleSet, categories: Iterable[Category]) -> dict[str, tuple[str, ...]]:
    """Each rule's webhooks: its own ``notify`` and those of the categories that name it (any, all)."""
    out: dict[str, list[str]] = {r.name: list(r.notify) for r in rule_set.rules}
    for category in categories:
        for rule in (*category.any, *category.all):
            out.setdefault(rule, []).extend(category.notify)
    return {rule: tuple(dict.fromkeys(names)) for rule, names in out.items() if names}


def check_targets(settings: Settings, targets: dict[str, tuple[str, ...]]) -> None:
    unknown = sorted({n for names in targets.values() for n in names} - settings.webhooks.keys())
    if unknown:
        raise NotifyConfigError(f"rules notify {', '.join(map(repr, unknown))}, which CALLQA_WEBHOOKS does not "
                                f"define (defined: {', '.join(sorted(settings.webhooks)) or 'none'})")
    if targets and not settings.webhook_secret.get_secret_value().strip():
        raise NotifyConfigError("CALLQA_WEBHOOK_SECRET is empty: webhook requests must be signed")
    for name, url in settings.webhooks.items():
        if not url.startswith(("http://", "https://")):
            raise NotifyConfigError(f"CALLQA_WEBHOOKS: {name!r} is not an http(s) URL")


def check_notify_settings(settings: Settings) -> None:
    """Before a worker starts: every webhook its rules name is defined, and requests can be signed."""
    config = QaConfig.from_settings(settings)
    check_targets(settings, targets_by_rule(config.rule_set, config.categories))


class AlertNotifier:
    def __init__(self, settings: Settings, targets: dict[str, tuple[str, ...]], registry: CollectorRegistry | None = None,
                 serde: Serde | None = None) -> None:
        check_targets(settings, targets)
        self.settings = settings
        self.targets = targets
        self.serde = serde or Serde.from_settings(settings.schema_registry_url)
        self.desk_url = settings.desk_url or f"http://{settings.web_host}:{settings.web_port}"
        self.outcomes = Counter("callqa_webhooks", "Webhook requests of live alerts by webhook and outcome "
                                "(delivered, retried, dead_lettered, skipped).", ["webhook", "outcome"],
                                registry=registry)
        self.assigned = threading.Event()  # the group gave it partitions (tests wait for it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._open_until: dict[str, float] = {}  # webhook -> until when it is skipped (it gave up)

    @classmethod
    def from_settings(cls, settings: Settings, config: QaConfig, registry: CollectorRegistry | None = None,
                      ) -> AlertNotifier | None:
        """A notifier when a rule or category notifies anyone, else None (nothing to read)."""
        targets = targets_by_rule(config.rule_set, config.categories)
        return cls(settings, targets, registry) if targets else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="callqa-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask it to stop (returns at once): no new request starts, a backoff ends."""
        self._stop.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop and wait (bounded): a request in flight ends (its alert is not committed: the partition's next
        owner sends it), the consumer leaves its group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        s = self.settings
        consumer = Consumer({**kafka_config(s), "group.id": f"{s.worker_id}.notify", "isolation.level": "read_committed",
                             "enable.auto.commit": False, "auto.offset.reset": "latest"})
        producer = Producer(kafka_config(s))
        consumer.subscribe([s.topic_qa], on_assign=self._on_assign)
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.2)  # how soon a stop is seen
                if msg is None or msg.error() is not None:
                    continue
                if self._handle(msg, lambda letter: self._dead_letter(producer, letter)):
                    consumer.commit(message=msg, asynchronous=False)
        except Exception as exc:  # noqa: BLE001 - the worker goes on without webhooks, and says so
            log.error("webhooks stopped: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        finally:
            consumer.close()
            producer.flush(5)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """A partition the group never committed starts at its end as of now (not at the first fetch's, which
        comes later: an alert written in between would be skipped)."""
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(partitions, timeout=10)}
        fresh = []
        for tp in partitions:
            offset = committed.get((tp.topic, tp.partition), -1)
            tp.offset = offset if offset >= 0 else _end_of(consumer, tp)
            if offset < 0 and tp.offset >= 0:
                fresh.append(tp)
        if fresh:  # the group's start, kept: an alert written while no notifier runs is sent at the next start
            consumer.commit(offsets=fresh, asynchronous=False)
        consumer.assign(partitions)
        self.assigned.set()

    def _handle(self, msg: Any, dead_letter: Callable[[DeadLetter], None]) -> bool:
        """Send one QA message's alert to its targets; whether it is done (False: stopping mid-way)."""
        try:
            alert = self.serde.decode_any(msg.value() or b"")
        except ContractError:
            return True  # the worker dead-letters what it cannot read; not this reader's to judge
        if not isinstance(alert, QaAlert):
            return True  # a call's QA result
        delivery = Delivery(msg.topic(), msg.partition(), msg.offset())
        for name in self.targets.get(alert.rule, ()):
            reason = self._send(name, alert, delivery)
            if reason is None:
                continue
            if self._stop.is_set():
                return False
            dead_letter(DeadLetter(delivery.topic, delivery.partition, delivery.offset, f"webhook {name}: {reason}",
                                   error_type="WebhookError", worker_id=self.settings.worker_id,
                                   call_id=alert.call_id))
            self.outcomes.labels(name, "dead_lettered").inc()
        return True

    def _send(self, name: str, alert: QaAlert, delivery: Delivery) -> str | None:
        """Tries until delivered (None) or given up (the reason)."""
        if time.monotonic() < self._open_until.get(name, 0.0):
            self.outcomes.labels(name, "skipped").inc()
            return f"skipped: it gave up within the last {self.settings.webhook_open_s:.0f} s"
        s = self.settings
        body = body_of(alert, live_link(self.desk_url, alert.call_id), s.webhook_format)
        wait, last = s.webhook_backoff_s, ""
        for attempt in range(1, s.webhook_attempts + 1):
            headers = {"X-Callqa-Signature": signature(s.webhook_secret.get_secret_value(), int(time.time()), body),
                       "X-Callqa-Delivery": delivery.id, "X-Callqa-Attempt": str(attempt), "User-Agent": "callqa"}
            try:
                post(s.webhooks[name], body, headers, s.webhook_timeout_s)
                self.outcomes.labels(name, "delivered").inc()
                return None
            except WebhookError as exc:
                last = str(exc)
            code = int(last.split()[1]) if last.startswith("answered ") else 0
            if 400 <= code < 500 and code not in RETRIED_4XX:
                return f"refused ({last})"
            self.outcomes.labels(name, "retried").inc()
            if attempt < s.webhook_attempts and self._stop.wait(wait):
                return "stopping"
            wait = min(wait * 2, s.webhook_backoff_max_s)
        self._open_until[name] = time.monotonic() + s.webhook_open_s
        log.warning("webhook %s: alert %s gave up after %d tries (%s); dead-lettered", name, delivery.id,
                    s.webhook_attempts, last)
        return f"gave up after {s.webhook_attempts} tries ({last})"

    def _dead_letter(self, producer: Producer, letter: DeadLetter) -> None:
        producer.produce(self.settings.topic_dead_letters, key=letter.call_id.encode(), value=self.serde.encode(letter))
        producer.flush(10)


def _end_of(consumer: Consumer, tp: TopicPartition) -> int:
    """The partition's end now; a new topic's leader may not be known for a moment (then: the end at the first
    fetch, librdkafka's own choice)."""
    for _ in range(20):
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=5)[1])
        except KafkaException:
            time.sleep(0.25)
    return OFFSET_END
