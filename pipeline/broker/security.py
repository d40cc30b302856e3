"""Kafka client security from the settings: one place that every client (librdkafka or faust) uses.

- ``kafka_config(settings)``: the librdkafka (confluent-kafka) config: bootstrap servers, security
  protocol, SASL mechanism and credentials, CA / client certificate, hostname verification, and an
  error callback plus a logger that keep librdkafka's own retries off stderr;
- ``aiokafka_security(settings)``: the same as aiokafka keyword arguments (the worker's transactional
  producers);
- ``faust_credentials(settings)``: faust's ``broker_credentials`` (``SASLCredentials`` or
  ``SSLCredentials`` carrying an ``ssl.SSLContext``), which faust hands to aiokafka as
  ``security_protocol``, ``sasl_mechanism`` and ``ssl_context``;
- ``ClientErrors`` turns librdkafka's authentication and TLS errors into one line that says what to
  fix, so a wrong password or a missing CA fails at once instead of retrying until a timeout.

Secrets stay in ``SecretStr`` until the moment a client is built; no message here includes them.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata
from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from pipeline.config.broker import SASL_PROTOCOLS, TLS_PROTOCOLS, BrokerSettings

# librdkafka's connection retries are expected noise for callers; ClientErrors reports what matters.
# A NullHandler keeps them off a CLI's stderr, and they still reach a worker's log handlers.
CLIENT_LOG = logging.getLogger("callqa.kafka.client")
CLIENT_LOG.addHandler(logging.NullHandler())


class KafkaSecurityError(RuntimeError):
    """The broker refused our credentials or our TLS handshake; the message says which and what to fix."""


class KafkaUnavailableError(RuntimeError):
    """No broker answered in time (none running, wrong address, or a protocol the listener does not speak);
    ``cause`` is the client's last error, where there was one."""

    cause = ""


def unavailable(settings: BrokerSettings, within: str, cause: str) -> KafkaUnavailableError:
    """The one-line error for a broker that did not answer ``within`` (a duration as said to the user)."""
    # The local broker (no CALLQA_BOOTSTRAP_SERVERS) is most often simply not started yet.
    start = "; `callqa broker start` starts the local one" if not settings.bootstrap_servers else ""
    error = KafkaUnavailableError(
        f"Kafka at {settings.bootstrap} did not answer within {within}: {cause}; is a broker running there, "
        f"with a listener that speaks {settings.kafka_security_protocol} (CALLQA_KAFKA_SECURITY_PROTOCOL)?{start}")
    error.cause = cause
    return error


def kafka_config(settings: BrokerSettings, errors: ClientErrors | None = None) -> dict[str, Any]:
    """librdkafka config for ``settings``: bootstrap servers and security (no secret is logged by it)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "security.protocol": settings.kafka_security_protocol,
        "logger": CLIENT_LOG,
        # Back to bootstrap_servers soon after every known broker is gone (see BrokerSettings.kafka_rebootstrap_ms).
        "metadata.recovery.strategy": "rebootstrap",
        "metadata.recovery.rebootstrap.trigger.ms": settings.kafka_rebootstrap_ms,
    }
    if errors is not None:
        conf["error_cb"] = errors.on_error
    if settings.kafka_security_protocol in SASL_PROTOCOLS:
        conf.update({
            "sasl.mechanism": settings.kafka_sasl_mechanism,
            "sasl.username": settings.kafka_sasl_username,
            "sasl.password": settings.kafka_sasl_password.get_secret_value(),
        })
    if settings.kafka_security_protocol in TLS_PROTOCOLS:
        conf["ssl.endpoint.identification.algorithm"] = "https" if settings.kafka_ssl_check_hostname else "none"
        if settings.kafka_ssl_ca_file is not None:
            conf["ssl.ca.location"] = str(settings.kafka_ssl_ca_file)
        if settings.kafka_ssl_cert_file is not None:
            conf["ssl.certificate.location"] = str(settings.kafka_ssl_cert_file)
            conf["ssl.key.location"] = str(settings.kafka_ssl_key_file or settings.kafka_ssl_cert_file)
            if settings.kafka_ssl_key_password.get_secret_value():
                conf["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    return conf


def ssl_context(settings: BrokerSettings) -> ssl.SSLContext:
    """The TLS context faust/aiokafka use: the configured CA (or the system's), optional client cert."""
    cafile = str(settings.kafka_ssl_ca_file) if settings.kafka_ssl_ca_file is not None else None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    # Without hostname checks the chain is still verified (CERT_REQUIRED stays on).
    context.check_hostname = settings.kafka_ssl_check_hostname
    if settings.kafka_ssl_cert_file is not None:
        key_password = settings.kafka_ssl_key_password.get_secret_value() or None
        context.load_cert_chain(str(settings.kafka_ssl_cert_file),
                                str(settings.kafka_ssl_key_file) if settings.kafka_ssl_key_file else None,
                                password=key_password)
    return context


def faust_credentials(settings: BrokerSettings) -> CredentialsT | None:
    """faust's ``broker_credentials``: None for PLAINTEXT.

    faust picks the protocol from the credentials' type: SASLCredentials is SASL_PLAINTEXT, or SASL_SSL
    when it carries an ssl_context; its mechanism reaches aiokafka's ``sasl_mechanism`` as is.
    """
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return SSLCredentials(ssl_context(settings))
    return SASLCredentials(
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password.get_secret_value(),
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=ssl_context(settings) if protocol == "SASL_SSL" else None,
    )


def aiokafka_security(settings: BrokerSettings) -> dict[str, Any]:
    """aiokafka client keyword arguments for the configured security (the transactional producers of
    pipeline/broker/transactions.py; faust builds its own from ``faust_credentials``)."""
    protocol = settings.kafka_security_protocol
    out: dict[str, Any] = {"security_protocol": protocol}
    if protocol in TLS_PROTOCOLS:
        out["ssl_context"] = ssl_context(settings)
    if protocol in SASL_PROTOCOLS:
        out.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=settings.kafka_sasl_username,
                   sasl_plain_password=settings.kafka_sasl_password.get_secret_value())
    return out


class ClientErrors:
    """librdkafka ``error_cb``: remembers the first authentication or TLS failure as one clear line."""

    # Error codes after which retrying cannot help: the configuration is wrong.
    FATAL_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED,
                             KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.ILLEGAL_SASL_STATE})

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self.first: str | None = None

    def on_error(self, error: KafkaError) -> None:
        message = explain(error, self.settings)
        if message is None:
            return
        with self._lock:
            if self.first is None:
                self.first = message

    def raise_if_failed(self) -> None:
        if self.first is not None:
            raise KafkaSecurityError(self.first)


def explain(error: KafkaError, settings: BrokerSettings) -> str | None:
    """One line for an authentication or TLS error (None for others, e.g. a broker still starting)."""
    text = error.str()
    where = f"Kafka at {settings.bootstrap}"
    if "SASL" in text and ("authentication" in text.lower() or error.code() in ClientErrors.FATAL_CODES):
        return (f"{where} refused the SASL login of user {settings.kafka_sasl_username!r} "
                f"({settings.kafka_sasl_mechanism}): {_reason(text)}; check CALLQA_KAFKA_SASL_USERNAME, "
                "CALLQA_KAFKA_SASL_PASSWORD and CALLQA_KAFKA_SASL_MECHANISM")
    if error.code() == KafkaError._SSL or "SSL handshake failed" in text or "certificate verify failed" in text:
        return (f"TLS handshake with {where} failed: {_reason(text)}; check CALLQA_KAFKA_SSL_CA_FILE "
                "(the CA that signed the broker's certificate) and that the certificate names the host of "
                "CALLQA_BOOTSTRAP_SERVERS (CALLQA_KAFKA_SSL_CHECK_HOSTNAME)")
    if error.code() in ClientErrors.FATAL_CODES:
        return f"{where}: {_reason(text)}"
    return None


def _reason(text: str) -> str:
    """librdkafka's message without its "sasl_ssl://host:port/bootstrap: " prefix and state suffix."""
    reason = text.split(": ", 1)[1] if text.count("://") and ": " in text else text
    return reason.split(" (after ")[0].strip()


def admin_client(settings: BrokerSettings, errors: ClientErrors, **extra: Any) -> AdminClient:
    return AdminClient({**kafka_config(settings, errors), **extra})


def cluster_metadata(admin: AdminClient, errors: ClientErrors, timeout_s: float) -> ClusterMetadata:
    """``admin.list_topics`` that stops as soon as the broker refuses our login or TLS handshake.

    librdkafka retries refused logins until the timeout; asking in short steps and checking the error
    callback in between turns a wrong password into an error in about a second, not a hang.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        step = max(0.1, min(1.0, deadline - time.monotonic()))
        try:
            return admin.list_topics(timeout=step)
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            errors.raise_if_failed()
            if time.monotonic() >= deadline:
                raise unavailable(errors.settings, f"{timeout_s:.0f} s",
                                  exc.args[0].str() if exc.args else str(exc)) from None


def wait_for_kafka(settings: BrokerSettings, wait_s: float, say: Callable[[str], None],
                   every_s: float = 10.0, step_s: float = 3.0) -> ClusterMetadata:
    """The cluster's metadata, waiting up to ``wait_s`` for a broker to answer: a service started beside its
    broker (one host's boot, a compose file, a cluster restart) would otherwise exit and leave its restart
    to a supervisor. Asked every ``step_s``; ``say`` gets a line at the first miss and then every ``every_s``
    while the wait lasts. A refused login or TLS handshake raises KafkaSecurityError at once (waiting cannot
    fix it); no answer by the end raises KafkaUnavailableError saying how long it waited."""
    errors = ClientErrors(settings)
    admin = admin_client(settings, errors)
    began = time.monotonic()
    said_at: float | None = None
    while True:
        left = wait_s - (time.monotonic() - began)
        try:
            return cluster_metadata(admin, errors, max(0.1, min(step_s, left)))
        except KafkaUnavailableError as exc:
            waited = time.monotonic() - began
            if waited >= wait_s:
                raise unavailable(settings, f"{wait_s:.0f} s (CALLQA_KAFKA_START_WAIT_S)", exc.cause) from None
            if said_at is None or time.monotonic() - said_at >= every_s:
                said_at = time.monotonic()
                say(f"waiting for Kafka at {settings.bootstrap} ({waited:.0f} s so far, at most {wait_s:.0f} s: "
                    "CALLQA_KAFKA_START_WAIT_S)")
