"""Settings of the local Kafka broker and of every Kafka client."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


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
    schema_registry_url: str = Field(
        "",
        description="Confluent Schema Registry URL; empty means schema ids come from schemas/registry.json.",
    )

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"
