"""The gateway's Prometheus metrics, in a registry of their own (served at /metrics).

A registry per gateway, not the process-wide default: tests run several gateways in one process, and
each one's /metrics must show its own counts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

PROTOCOLS = ("twilio", "audiohook")
ACK_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class BatchHistogram(Collector):
    """A Prometheus histogram observed a batch at a time: the sender acknowledges thousands of frames at
    once, and ``Histogram.observe`` per frame (a lock and a bucket search each) was 2 µs of every frame."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # per bucket (not cumulative); last: above all
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        if not len(values):
            return
        # side="left": a value equal to a bound belongs to that bound's bucket (Prometheus's le).
        counts = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum
        buckets = [(floatToGoString(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("callqa_gateway_sessions_active", "Open websocket sessions.", ["protocol"],
                                     registry=r)
        self.sessions = Counter("callqa_gateway_sessions_total", "Sessions by how the handshake ended.",
                                ["protocol", "outcome"], registry=r)
        self.limit_refusals = Counter("callqa_gateway_limit_refusals_total",
                                      "Sessions closed for a limit (1013 per source, 1008 message rate), by which.",
                                      ["protocol", "limit"], registry=r)
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
        self.secure_pauses = Counter("callqa_gateway_secure_pauses_total",
                                     "Secure pause requests (callqa pause / resume, POST /calls/{id}/pause|resume), "
                                     "by action and outcome.", ["action", "outcome"], registry=r)
        self.paused_seconds = Counter("callqa_gateway_secure_pause_seconds_total",
                                      "Time calls spent with their capture securely paused.", registry=r)
        self.paused_audio_dropped = Counter("callqa_gateway_secure_pause_dropped_seconds_total",
                                            "Audio received during a secure pause and dropped here, never produced "
                                            "(per leg: a second of both legs counts 2).", registry=r)
        self.buffered_frames = Gauge("callqa_gateway_buffered_frames", "Frames waiting for Kafka.", registry=r)
        self.delivery_failures = Counter("callqa_gateway_delivery_failures_total",
                                         "Messages Kafka did not take.", registry=r)
        # Every frame the sender takes from a buffer is acknowledged or counted here: none vanishes unsaid.
        self.frames_lost = Counter("callqa_gateway_frames_lost_total",
                                   "Frames taken for Kafka and not written, by why (refused, not_sent).", ["reason"],
                                   registry=r)
        self.event_retries = Counter("callqa_gateway_event_retries_total",
                                     "Call events Kafka refused, queued to be sent again.", registry=r)
        self.ack_latency = BatchHistogram("callqa_gateway_frame_ack_seconds",
                                          "Frame built (its audio received) -> acknowledged by Kafka.", ACK_BUCKETS, r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when it was never set): for tests and the CLI's summary."""
        got = self.registry.get_sample_value(name, labels or None)
        return got if got is not None else 0.0
