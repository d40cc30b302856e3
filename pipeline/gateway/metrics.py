"""The gateway's Prometheus metrics, in a registry of their own (served at /metrics).

A registry per gateway, not the process-wide default: tests run several gateways in one process, and
each one's /metrics must show its own counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PROTOCOLS = ("twilio", "audiohook")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("callqa_gateway_sessions_active", "Open websocket sessions.", ["protocol"],
                                     registry=r)
        self.sessions = Counter("callqa_gateway_sessions_total", "Sessions by how the handshake ended.",
                                ["protocol", "outcome"], registry=r)
        self.auth_failures = Counter("callqa_gateway_auth_failures_total", "Handshakes refused for their credentials.",
                                     ["protocol", "reason"], registry=r)
        self.protocol_errors = Counter("callqa_gateway_protocol_errors_total",
                                       "Sessions ended for bad input, by what was wrong.", ["protocol", "kind"],
                                       registry=r)
        self.messages_ignored = Counter("callqa_gateway_messages_ignored_total",
                                        "Messages read and deliberately not used (dtmf, mark, unknown types, ...).",
                                        ["protocol", "kind"], registry=r)
        self.calls_active = Gauge("callqa_gateway_calls_active", "Calls started and not yet ended.", registry=r)
        self.calls_ended = Counter("callqa_gateway_calls_ended_total", "Calls ended, by what ended their last stream.",
                                   ["reason"], registry=r)
        self.frames_built = Counter("callqa_gateway_frames_built_total", "20 ms frames cut from the streams.",
                                    registry=r)
        self.frames_acked = Counter("callqa_gateway_frames_acknowledged_total",
                                    "Frames Kafka acknowledged (acks=all).", registry=r)
        self.frames_dropped = Counter("callqa_gateway_frames_dropped_total",
                                      "Frames dropped oldest-first from a full leg buffer (a gap the worker fills).",
                                      registry=r)
        self.audio_adjusted = Counter("callqa_gateway_audio_adjusted_seconds_total",
                                      "Audio time not taken as sent: gaps filled with silence, late or duplicate "
                                      "audio dropped, paused time skipped.", ["kind"], registry=r)
        self.pauses = Counter("callqa_gateway_pauses_total",
                              "AudioHook pauses: asked by the gateway (backpressure) or by the client (pci).",
                              ["reason"], registry=r)
        self.holds_seconds = Counter("callqa_gateway_hold_seconds_total", "Time calls spent in a client pause (PCI).",
                                     registry=r)
        self.buffered_frames = Gauge("callqa_gateway_buffered_frames", "Frames waiting for Kafka.", registry=r)
        self.delivery_failures = Counter("callqa_gateway_delivery_failures_total",
                                         "Messages Kafka did not take.", registry=r)
        self.ack_latency = Histogram("callqa_gateway_frame_ack_seconds",
                                     "Frame built (its audio received) -> acknowledged by Kafka.",
                                     buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when it was never set): for tests and the CLI's summary."""
        got = self.registry.get_sample_value(name, labels or None)
        return got if got is not None else 0.0
