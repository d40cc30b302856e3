"""Settings of the local Kafka broker and of every Kafka client."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class BrokerSettings(BaseModel):
    state_dir: Path = Field(
        Path(".callqa"),
        description="Folder for all local state: Kafka jars, broker data and logs, models cache, ClickHouse data.",
    )
    kafka_port: int = Field(19092, description="Port of the local broker's client listener on 127.0.0.1.")
    kafka_controller_port: int = Field(19093, description="Port of the local broker's KRaft controller listener.")
    bootstrap_servers: str = Field(
        "",
        description="Kafka bootstrap servers; empty means the local broker at 127.0.0.1:<kafka_port>.",
    )
    kafka_heap: str = Field("-Xmx512m -Xms256m", description="JVM heap options for the local broker.")
    broker_start_timeout_s: float = Field(90.0, description="How long `broker start` waits for metadata answers.")
    # A service (worker, gateway) started while its brokers are down (one host's boot, a compose file, a
    # cluster's restart) waits for them rather than exiting and leaving its restart to a supervisor; each
    # 10 s of it is said in one line. A refused login or TLS handshake is not waited on. 0: ask once (30 s).
    # CALLQA_KAFKA_START_WAIT_S, default 300.
    kafka_start_wait_s: float = Field(
        300.0, ge=0, description="How long `callqa worker` and `callqa gateway` wait at start for a broker to "
        "answer before exiting with one line (s); 0: they ask once, for 30 s.",
    )
    # A restarting broker answers metadata with no brokers for a moment (it is fenced until it has caught up);
    # librdkafka then forgets every broker it knew, bootstrap included, and by default bootstraps again only
    # after 5 minutes of no metadata: meanwhile a producer sends nothing, and its messages fail as timed out
    # (seen: a call's audio lost from a broker restart to the call's end, in 2 of 56 replay producers). With
    # this, a client that can reach none of its brokers starts again from bootstrap_servers this soon.
    kafka_rebootstrap_ms: int = Field(
        2000, ge=500, description="librdkafka's metadata.recovery.rebootstrap.trigger.ms for every callqa client: "
        "after this long (ms) without metadata from any known broker, a client bootstraps again (librdkafka: 300000).",
    )
    schema_registry_url: str = Field(
        "",
        description="Confluent Schema Registry URL; empty means schema ids come from schemas/registry.json.",
    )

    kafka_security_protocol: SecurityProtocol = Field(
        "PLAINTEXT",
        description="How every Kafka client connects: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    )
    kafka_sasl_mechanism: SaslMechanism = Field(
        "SCRAM-SHA-512",
        description="SASL mechanism with SASL_*: PLAIN (password sent as is; only over TLS), SCRAM-SHA-256 or SCRAM-SHA-512.",
    )
    kafka_sasl_username: str = Field(
        "", description="SASL user of every Kafka client; also the user `broker start --sasl-ssl` creates."
    )
    kafka_sasl_password: SecretStr = Field(
        SecretStr(""), description="SASL password of kafka_sasl_username (secret: never printed or logged)."
    )
    kafka_ssl_ca_file: Path | None = Field(
        None,
        description="PEM CA certificate(s) that signed the broker's certificate; unset means the system CAs. "
        "The local SASL_SSL broker's is <state_dir>/kafka/tls/ca.pem.",
    )
    kafka_ssl_cert_file: Path | None = Field(
        None, description="PEM client certificate for brokers that require TLS client authentication."
    )
    kafka_ssl_key_file: Path | None = Field(None, description="PEM private key of kafka_ssl_cert_file.")
    kafka_ssl_key_password: SecretStr = Field(
        SecretStr(""), description="Password of an encrypted kafka_ssl_key_file (secret: never printed or logged)."
    )
    kafka_ssl_check_hostname: bool = Field(
        True, description="Check that the broker's certificate names the host connected to; off still verifies the chain."
    )
    kafka_local_listener: Literal["PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Client listener of the local broker: PLAINTEXT, or SASL_SSL (own CA, PLAIN and SCRAM users "
        "from kafka_sasl_username/password); `broker start --sasl-ssl` sets SASL_SSL.",
    )

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", "kafka_local_listener", mode="before")
    @classmethod
    def _upper_case(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file")
    @classmethod
    def _existing_pem_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        if not value.is_file():
            raise ValueError(f"no such file: {value}")
        # What the PEM must hold, so a wrong file is named here, not deep inside a TLS library.
        marker = "PRIVATE KEY-----" if info.field_name == "kafka_ssl_key_file" else "BEGIN CERTIFICATE-----"
        if marker not in value.read_text(errors="replace"):
            raise ValueError(f"{value} is not a PEM file with a {marker.rstrip('-').replace('BEGIN ', '').lower()}")
        return value

    @model_validator(mode="after")
    def _complete_credentials(self) -> BrokerSettings:
        if self.kafka_security_protocol in SASL_PROTOCOLS:
            if not self.kafka_sasl_username:
                raise ValueError(f"CALLQA_KAFKA_SASL_USERNAME is empty but {self.kafka_security_protocol} needs a user")
            if not self.kafka_sasl_password.get_secret_value():
                raise ValueError(f"CALLQA_KAFKA_SASL_PASSWORD is empty but {self.kafka_security_protocol} needs one")
        if self.kafka_ssl_key_file is not None and self.kafka_ssl_cert_file is None:
            raise ValueError("CALLQA_KAFKA_SSL_KEY_FILE is set without CALLQA_KAFKA_SSL_CERT_FILE")
        return self

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"
