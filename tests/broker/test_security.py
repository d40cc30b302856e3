"""Kafka security: a second local broker with a SASL_SSL listener, and every kind of client against it.

The broker is this module's own (its state folder under tmp, its own ports); the shared broker on
19092 is never touched. Its admin user logs in with PLAIN; the pipeline runs as a user that has only
SCRAM-SHA-512 credentials, so the pipeline working proves the clients really used SCRAM.
"""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.local import BrokerError, LocalKafka, free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.security import (
    ClientErrors,
    KafkaSecurityError,
    admin_client,
    faust_credentials,
    kafka_config,
)
from pipeline.broker.tls import BrokerTls
from pipeline.broker.topics import TopicSpec, ensure_topics
from pipeline.config import Settings
from pipeline.contracts import CallEvent, Serde, TranscriptSegment
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "callqa-admin"
PIPELINE_USER = "callqa-pipeline"


@dataclass
class SecureBroker:
    kafka: LocalKafka
    admin_password: str
    pipeline_password: str

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka.settings.kafka_port}"

    def client(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512", **extra: Any) -> dict[str, str]:
        """Settings overrides (field name -> text) of a SASL_SSL client; also usable as a worker's env."""
        return {"bootstrap_servers": self.bootstrap, "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": mechanism, "kafka_sasl_username": user, "kafka_sasl_password": password,
                "kafka_ssl_ca_file": str(self.kafka.tls.ca_cert), **extra}


def settings_of(overrides: dict[str, str]) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A wide terminal: rich must not shorten the values `callqa settings` prints.
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env={**env, "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=120)


def add_scram_only_user(broker: SecureBroker) -> None:
    """A user the PLAIN login does not know: only SCRAM can authenticate it."""
    admin_settings = settings_of(broker.client(ADMIN, broker.admin_password, "PLAIN"))
    admin = admin_client(admin_settings, ClientErrors(admin_settings))
    upsert = UserScramCredentialUpsertion(PIPELINE_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          broker.pipeline_password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():  # type: ignore[arg-type]
        future.result(timeout=30)


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    state = tmp_path_factory.mktemp("sasl-ssl-broker")
    admin_password = secrets.token_urlsafe(18)
    settings = Settings(state_dir=state, kafka_port=free_port(), kafka_controller_port=free_port(),
                        kafka_local_listener="SASL_SSL", kafka_sasl_username=ADMIN,
                        kafka_sasl_password=admin_password)  # type: ignore[arg-type]
    kafka = LocalKafka(settings)
    # Reuse the jars the session already resolved rather than resolving them again.
    kafka.libs.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(LocalKafka(Settings()).libs, kafka.libs)
    kafka.start()
    broker = SecureBroker(kafka, admin_password, secrets.token_urlsafe(18))
    try:
        add_scram_only_user(broker)
        yield broker
    finally:
        kafka.stop()


def short_call() -> CallRecording:
    """The first 4.6 s of a sample call: one agent and one customer utterance."""
    options = ReplayOptions(encoding="mulaw")
    full = load_recording(ROOT / "samples" / "calls" / "call_01.wav", options)
    end = int(4.6 * full.sample_rate)
    rec = CallRecording(full.source, {leg: np.ascontiguousarray(x[:end]) for leg, x in full.legs.items()},
                        full.sample_rate)
    rec.encode("mulaw")
    return rec


def read_all(settings: Settings, topic: str, expected: int) -> list[Any]:
    """Messages of ``topic`` from the start, read with the settings' security, until ``expected`` came."""
    consumer = Consumer({**kafka_config(settings), "group.id": f"read-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    try:
        for _ in range(400):  # at most ~2 minutes of 0.3 s polls
            if len(out) >= expected:
                break
            msg = consumer.poll(0.3)
            if msg is not None and not msg.error():
                out.append(msg)
    finally:
        consumer.close()
    return out


def test_scram_sha_512_over_sasl_ssl_runs_the_whole_pipeline_and_no_secret_is_written(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    prefix = f"sec.{uuid.uuid4().hex[:8]}"
    topics = {f"topic_{t}": f"{prefix}.{t}" for t in ("audio", "call_events", "transcripts", "latency", "qa",
                                                        "dead_letters", "checkpoints", "postcall", "live_calls")}
    overrides = secure_broker.client(PIPELINE_USER, secure_broker.pipeline_password, worker_id=prefix, **topics)
    env = worker_env(overrides)
    settings = settings_of(overrides)

    created = run_cli("topics", "create", env=env)
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("created") == len(topics)

    port = free_port()
    worker = WorkerProcess(worker_env({**overrides, "web_port": str(port), "commit_interval_s": "1.0",
                                       "model_watch_interval_s": "0",
                                       "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}"}),
                           port, tmp_path / "worker.log")
    worker.start()
    try:
        player = TelephonyReplay(ContractProducer.from_settings(settings, Serde.from_settings()),
                                 settings.topic_audio, settings.topic_call_events)
        call_ids = player.run([short_call()], ReplayOptions(encoding="mulaw", call_id_prefix=prefix)).call_ids
        rows = worker.wait_for_calls(call_ids)
        metrics = worker.metrics_text()
        assert [r["end_reason"] for r in rows] == ["end"]
        segments = int(rows[0]["segments"])
        assert segments >= 2  # one utterance per leg
        # Read while the worker runs: the store row can land before the Kafka transaction holding the last
        # final commits (up to commit_interval_s later), and a stop aborts what is open (the next owner
        # replays it), so a read_committed reader after the stop may miss it.
        published = read_all(settings, settings.topic_transcripts, segments)
    finally:
        worker.stop()

    # The transcripts went out through faust's SCRAM-authenticated producer.
    serde = Serde.from_settings()
    finals = [m for m in (serde.decode_any(msg.value()) for msg in published)
              if isinstance(m, TranscriptSegment) and m.call_id == call_ids[0]]
    assert len(finals) == segments and all(m.text.strip() for m in finals)

    # aiokafka (faust's client) says how it logged in; and the same user over PLAIN is refused.
    assert f"Authenticated as {PIPELINE_USER} via SCRAM-SHA-512" in worker.log_path.read_text(errors="replace")
    plain = settings_of({**overrides, "kafka_sasl_mechanism": "PLAIN"})
    with pytest.raises(KafkaSecurityError, match="refused the SASL login"):
        ensure_topics(plain, timeout_s=20)

    shown = run_cli("settings", env=env)
    assert shown.returncode == 0 and PIPELINE_USER in shown.stdout  # values printed whole, not cut short
    written = {"worker log": worker.log_path.read_text(errors="replace"), "/metrics": metrics,
               "topics create": created.stdout + created.stderr, "settings": shown.stdout + shown.stderr}
    written.update(broker_files(secure_broker.kafka))
    for secret in (secure_broker.pipeline_password, secure_broker.admin_password):
        assert [name for name, text in written.items() if secret in text] == []
    assert "SecretStr('**********')" in shown.stdout
    # The one file that holds the broker's password (its JAAS line) is its owner's only.
    kafka = secure_broker.kafka
    for private in (kafka.config_dir / "server.properties", kafka.tls.folder / "ca.key", kafka.tls.keystore):
        assert private.stat().st_mode & 0o077 == 0, private


def broker_files(kafka: LocalKafka) -> dict[str, str]:
    """The broker's logs: its own files, checked too (Kafka prints password settings as [hidden])."""
    return {str(p): p.read_text(errors="replace") for p in kafka.log_dir.iterdir() if p.is_file()}


def test_plain_over_sasl_ssl_produces_and_consumes(secure_broker: SecureBroker) -> None:
    settings = settings_of(secure_broker.client(ADMIN, secure_broker.admin_password, "PLAIN"))
    topic = f"sec.plain.{uuid.uuid4().hex[:8]}"
    assert ensure_topics(settings, [TopicSpec(topic, 2, 3_600_000, "round trip")]) == [topic]
    serde = Serde.from_settings()
    producer = ContractProducer.from_settings(settings, serde)
    sent = [CallEvent(call_id=f"c{i}", event_type="start", at_ms=1_000 + i) for i in range(20)]
    for event in sent:
        producer.send(topic, event.call_id, event)
    producer.flush(30)
    received = [serde.decode_any(m.value()) for m in read_all(settings, topic, len(sent))]
    assert sorted((e.call_id, e.at_ms) for e in received) == sorted((e.call_id, e.at_ms) for e in sent)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout.strip() == ""
    return lines[0]


def test_wrong_password_is_one_error_line_and_exit_1(secure_broker: SecureBroker) -> None:
    wrong = secrets.token_urlsafe(12)
    result = run_cli("topics", "create", env=worker_env(secure_broker.client(PIPELINE_USER, wrong)))
    line = one_error_line(result)
    assert f"refused the SASL login of user '{PIPELINE_USER}' (SCRAM-SHA-512)" in line
    assert wrong not in line and secure_broker.pipeline_password not in line


def test_client_without_the_ca_fails_tls_with_one_line(secure_broker: SecureBroker) -> None:
    # No CA file: the system's CAs, which never signed this broker's certificate.
    env = worker_env(secure_broker.client(ADMIN, secure_broker.admin_password, kafka_ssl_ca_file=""))
    line = one_error_line(run_cli("topics", "create", env=env))
    assert "TLS handshake with Kafka at" in line and "certificate verify failed" in line
    assert "CALLQA_KAFKA_SSL_CA_FILE" in line and secure_broker.admin_password not in line


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"kafka_security_protocol": "TLS"}, "CALLQA_KAFKA_SECURITY_PROTOCOL: Input should be 'PLAINTEXT'"),
    ({"kafka_sasl_mechanism": "GSSAPI"}, "CALLQA_KAFKA_SASL_MECHANISM: Input should be 'PLAIN'"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_password": "pw-given"},
     "CALLQA_KAFKA_SASL_USERNAME is empty but SASL_SSL needs a user"),
    ({"kafka_ssl_ca_file": "/nonexistent/ca.pem"}, "CALLQA_KAFKA_SSL_CA_FILE: no such file: /nonexistent/ca.pem"),
])
def test_bad_security_settings_are_one_error_line_at_start(overrides: dict[str, str], expected: str) -> None:
    result = run_cli("topics", "create", env=worker_env(overrides))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "pw-given" not in result.stderr


def test_faust_hands_aiokafka_the_scram_mechanism_and_a_verifying_tls_context(tmp_path: Path) -> None:
    tls = BrokerTls(tmp_path / "tls").ensure()
    settings = settings_of({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512",
                            "kafka_sasl_username": "u", "kafka_sasl_password": "p-secret",
                            "kafka_ssl_ca_file": str(tls.ca_cert)})
    auth = credentials_to_aiokafka_auth(faust_credentials(settings))
    assert (auth["security_protocol"], auth["sasl_mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    context = auth["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "callqa local Kafka CA"),),)]
    assert "p-secret" not in repr(faust_credentials(settings))
    tls_only = settings_of({"kafka_security_protocol": "SSL", "kafka_ssl_ca_file": str(tls.ca_cert),
                            "kafka_ssl_check_hostname": "false"})
    auth = credentials_to_aiokafka_auth(faust_credentials(tls_only))
    assert auth["security_protocol"] == "SSL" and "sasl_mechanism" not in auth
    assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED and not auth["ssl_context"].check_hostname


def test_sasl_ssl_local_broker_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, kafka_port=free_port(), kafka_controller_port=free_port(),
                        kafka_local_listener="SASL_SSL", kafka_sasl_username="")
    kafka = LocalKafka(settings)
    kafka.libs.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(LocalKafka(Settings()).libs, kafka.libs)
    with pytest.raises(BrokerError, match="needs CALLQA_KAFKA_SASL_USERNAME"):
        kafka.start()
    assert kafka.pid() is None and not kafka.tls.ca_cert.exists()
