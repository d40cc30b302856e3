"""Settings of the ClickHouse store."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class StoreSettings(BaseModel):
    # URLs are secrets: an http(s) URL carries the account's password.
    clickhouse_url: SecretStr = Field(
        SecretStr(""),
        description="Writer account (migrations, the sink): chdb:///abs/path (embedded engine) or "
        "http(s)://user:pass@host:8123; empty means chdb under state_dir.",
    )
    clickhouse_readonly_url: SecretStr = Field(
        SecretStr(""),
        description="Read-only account for /api/query and `callqa report` (http(s)://reader:pass@host:8123); "
        "empty means clickhouse_url.",
    )
    clickhouse_database: str = Field("callqa", description="ClickHouse database for callqa tables.")
    clickhouse_ca_cert: str = Field(
        "", description="PEM CA file that signed the ClickHouse server's https certificate; empty: the system CAs."
    )
    clickhouse_verify: bool = Field(
        True, description="Verify the ClickHouse server's https certificate and host name (off only to debug)."
    )
    clickhouse_client_cert: str = Field(
        "", description="PEM client certificate for a ClickHouse server that requires TLS client authentication."
    )
    clickhouse_client_key: str = Field("", description="PEM private key of clickhouse_client_cert.")
    store_batch_rows: int = Field(
        1000, ge=1, description="The sink flushes a table's buffer once it holds this many rows."
    )
    store_flush_interval_s: float = Field(
        1.0, gt=0, description="The sink flushes buffered rows at least this often (seconds)."
    )
    store_max_buffered_rows: int = Field(
        50_000,
        ge=1,
        description="Rows the sink holds before write() waits (back-pressure that pauses Kafka consumption).",
    )
    store_retry_backoff_min_s: float = Field(
        0.2, gt=0, description="First wait before retrying a failed ClickHouse insert (seconds)."
    )
    store_retry_backoff_max_s: float = Field(
        30.0, gt=0, description="Cap of the exponential wait between insert retries (seconds)."
    )
    store_insert_timeout_s: float = Field(
        30.0, gt=0, description="Send/receive timeout of one ClickHouse HTTP request, inserts included (seconds)."
    )
    store_connect_timeout_s: float = Field(
        5.0, gt=0, description="Connect timeout to a ClickHouse HTTP server (seconds)."
    )
    # Privacy law's storage limits; the sweeper runs in every worker (the erase is idempotent), see
    # pipeline/store/erasure.py.
    retention_days_transcripts: float = Field(
        0, ge=0, description="A call's rows (transcript, QA, latency, reviews) are erased from the store this many "
        "days after the call started; 0: kept.",
    )
    retention_days_audio: float = Field(
        0, ge=0, description="A call's recording is deleted this many days after the call started (its transcript "
        "stays, per retention_days_transcripts); 0: kept as long as the transcript.",
    )
    retention_sweep_interval_s: float = Field(
        3600, gt=0, description="How often a worker sweeps: erases the calls past retention_days_transcripts, "
        "deletes the recordings past retention_days_audio, and "
        "again the rows of erased calls that came back (a post-call job or a replay written after the erase) (s).",
    )

    @property
    def writer_url(self) -> str | None:
        """The writer account's URL; None means the embedded store under state_dir."""
        return self.clickhouse_url.get_secret_value().strip() or None

    @property
    def reader_url(self) -> str | None:
        """The read-only account's URL (falls back to the writer's)."""
        return self.clickhouse_readonly_url.get_secret_value().strip() or self.writer_url
