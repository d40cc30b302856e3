"""Settings of the live telephony gateway (`callqa gateway`: Twilio Media Streams, Genesys AudioHook)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator


class GatewaySettings(BaseModel):
    gateway_public_url: str = Field(
        "",
        description="Base URL callers use to reach the gateway (e.g. wss://gw.example.com), which Twilio signs; "
        "empty rebuilds it from Host and X-Forwarded-Proto/-Host.",
    )
    gateway_tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) of the gateway: set with gateway_tls_key, it serves wss://."
    )
    gateway_tls_key: Path | None = Field(None, description="PEM private key of gateway_tls_cert.")
    twilio_auth_token: SecretStr = Field(
        SecretStr(""),
        description="Twilio auth token that signs X-Twilio-Signature (secret); empty refuses every /twilio stream "
        "unless gateway_auth is off.",
    )
    audiohook_api_key: SecretStr = Field(
        SecretStr(""),
        description="X-API-KEY Genesys AudioHook must send (secret); empty refuses every /audiohook session "
        "unless gateway_auth is off.",
    )
    # A loopback bind is not trusted without credentials: the usual production setup, a TLS proxy on the
    # same host, forwards the internet's streams to it. Taking streams without credentials is an explicit
    # choice, as CALLQA_API_AUTH=off is for the worker's API.
    gateway_auth: Literal["on", "off"] = Field(
        "on",
        description="on: /twilio needs twilio_auth_token signatures and /audiohook audiohook_api_key, and a "
        "protocol without its credential refuses every stream. off: a protocol without its credential takes "
        "streams unauthenticated, allowed only with a loopback --host (local trials, tests); credentials that "
        "are set are checked either way.",
    )
    audiohook_client_secret: SecretStr = Field(
        SecretStr(""),
        description="Base64 client secret of the AudioHook integration: its RFC 9421 signatures are required "
        "when set (secret).",
    )
    audiohook_signature_max_age_s: float = Field(
        10.0, gt=0, description="Oldest AudioHook signature accepted, from its `created` time (s)."
    )
    audiohook_clock_skew_s: float = Field(
        3.0, ge=0, description="Clock difference allowed between Genesys and the gateway in signature times (s)."
    )
    gateway_end_grace_s: float = Field(
        5.0, ge=0,
        description="After a call's last stream closes, how long a new stream may continue it before its end "
        "event is sent (s).",
    )
    gateway_idle_timeout_s: float = Field(
        60.0, gt=0, description="A stream that sends nothing (no media, no ping) for this long is closed (s)."
    )
    gateway_leg_buffer_s: float = Field(
        2.0, gt=0,
        description="Audio held per leg while Kafka is slow (s); AudioHook is paused near it, Twilio's oldest "
        "audio is dropped past it.",
    )
    gateway_max_sessions: int = Field(
        2000, ge=1, description="Open websocket sessions a gateway takes; beyond it the handshake gets 503."
    )
    gateway_drain_s: float = Field(
        30.0, ge=0, description="On SIGTERM, how long open streams may go on before they are closed (s)."
    )
    gateway_close_flush_s: float = Field(
        5.0, ge=0,
        description="How long an AudioHook `close` waits for the session's audio to reach Kafka before `closed` (s).",
    )
    # The public port faces the internet (or a TLS proxy that forwards it); what a metric says about calls
    # and load is for the operator's Prometheus only.
    gateway_metrics_host: str = Field(
        "127.0.0.1", description="Interface of the gateway's /metrics (and /healthz) listener, apart from the "
        "public port; 0.0.0.0 for a Prometheus on another host (e.g. the compose network).",
    )
    gateway_metrics_port: int = Field(
        9465, ge=0, le=65535, description="Port of that listener; 0: a free one, printed at start.",
    )
    # Secure pause (pipeline/gateway/pause.py) is asked of the gateway that holds the call; behind a load
    # balancer the command line does not know which one, so it asks each in turn.
    gateway_control_urls: str = Field(
        "", description="The gateways' operators' listeners (http://host:port, comma-separated) that `callqa "
        "pause` and `callqa resume` ask in turn; empty: this host's (gateway_metrics_host:gateway_metrics_port).",
    )
    # Limits at the door (pipeline/gateway/limits.py): each refusal is a close (1013 for a source over its
    # limits, 1008 for a session's message rate), counted in callqa_gateway_limit_refusals_total.
    gateway_source_max_sessions: int = Field(
        500, ge=0, description="Sessions one source address may hold open at once; more are closed 1013 (0: no limit).",
    )
    gateway_source_handshakes_per_s: float = Field(
        50.0, ge=0, description="Handshakes a second one source address may make, bursts of four seconds' worth "
        "allowed; more sessions are closed 1013 (0: no limit).",
    )
    gateway_session_messages_per_s: float = Field(
        250.0, ge=0, description="Messages a second one session may send (bursts of two seconds' worth); a "
        "session past it is closed 1008. Twilio sends 100 with both tracks, AudioHook 50 (0: no limit).",
    )
    gateway_forwarded_for: bool = Field(
        False, description="Behind a proxy that appends the caller to X-Forwarded-For: the per-source limits "
        "count its last address, not the proxy's. Leave off unless such a proxy is the only way in.",
    )
    gateway_handshake_timeout_s: float = Field(
        10.0, gt=0, description="A client must finish its websocket handshake within this (s), else it is "
        "dropped (a slow client holding sockets open).",
    )
    gateway_send_batch: int = Field(
        2000, ge=1, description="Most messages the Kafka sender produces before waiting for their acknowledgement."
    )

    @field_validator("gateway_tls_cert", "gateway_tls_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("gateway_tls_cert", "gateway_tls_key")
    @classmethod
    def _existing_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewaySettings:
        if (self.gateway_tls_cert is None) != (self.gateway_tls_key is None):
            raise ValueError("CALLQA_GATEWAY_TLS_CERT and CALLQA_GATEWAY_TLS_KEY must be set together")
        return self
