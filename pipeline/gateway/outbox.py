"""Between the sockets and Kafka: bounded per-leg buffers, drained by one sender thread.

Socket readers only append here (under a lock held for microseconds); they never wait on Kafka, so
pings and ``opened`` stay on time whatever the broker does. Each leg holds at most
``gateway_leg_buffer_s`` of frames; when one is full its oldest frame is dropped and counted (the seq
gap it leaves is filled with silence by the worker). AudioHook sessions read ``buffered_fraction`` and
pause their client before that happens; Twilio has no flow control, so its audio is what gets dropped.

The sender produces what is buffered (start, hold, pause and resume events first, in the order they came, then frames round-robin over the legs, then
the end events of calls whose frames Kafka has all taken), waits for the broker's acknowledgement of the batch
(acks=all, idempotent: ``ContractProducer``; through an outage too), and only then takes the next one: the
buffers fill up exactly when Kafka is slower than the calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np
from confluent_kafka import KafkaError

from pipeline.broker.producer import ContractProducer, DeliveryError
from pipeline.contracts.messages import LEGS, AudioFrame, CallEvent
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.timeline import FRAME_MS

log = logging.getLogger("callqa.gateway")


@dataclass
class Batch:
    starts: list[CallEvent] = field(default_factory=list)
    frames: list[AudioFrame] = field(default_factory=list)
    ends: list[CallEvent] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.starts) + len(self.frames) + len(self.ends)


class Outbox:
    """The core's ``CallSink``: frames and call events waiting for Kafka."""

    def __init__(self, metrics: GatewayMetrics, leg_buffer_s: float, message_ms: int = FRAME_MS) -> None:
        self.metrics = metrics
        self.leg_capacity = max(1, round(leg_buffer_s * 1000 / message_ms))
        # A plain lock (Condition's default is an RLock, slower to take 50 times a second per leg).
        self._lock = threading.Condition(threading.Lock())
        self._sender_waiting = False  # notify only then: most frames arrive while the sender is busy
        self._starts: deque[CallEvent] = deque()  # starts, holds, pauses and their ends
        self._opened: dict[str, CallEvent] = {}  # call -> its start event, whose fields holds repeat
        self._ends: deque[CallEvent] = deque()
        self._legs: dict[tuple[str, str], deque[AudioFrame]] = {}
        self._in_flight: dict[str, int] = {}  # call -> frames taken by the sender, not yet acknowledged
        self.dropped: dict[str, int] = {}  # call -> frames dropped from its full leg buffers

    # ---- CallSink (the event loop's side) ---------------------------------------------------------------
    def call_started(self, event: CallEvent) -> None:
        with self._lock:
            self._starts.append(event)
            self._opened[event.call_id] = event
            self._lock.notify()

    def frame(self, frame: AudioFrame) -> None:
        with self._lock:
            buffer = self._legs.setdefault((frame.call_id, frame.leg), deque())
            if len(buffer) >= self.leg_capacity:
                buffer.popleft()
                self.dropped[frame.call_id] = self.dropped.get(frame.call_id, 0) + 1
                self.metrics.frames_dropped.inc()
            buffer.append(frame)
            if self._sender_waiting:
                self._lock.notify()

    def buffered_fraction(self, call_id: str) -> float:
        with self._lock:
            fullest = max(len(self._legs.get((call_id, leg), ())) for leg in LEGS)
            return fullest / self.leg_capacity

    def call_ended(self, event: CallEvent) -> None:
        with self._lock:
            self._ends.append(event)
            self.dropped.pop(event.call_id, None)
            self._opened.pop(event.call_id, None)
            self._lock.notify()

    def call_held(self, call_id: str, at_ms: int) -> None:
        """A PCI pause began: a ``hold`` call event (the worker keeps the call open and measures it)."""
        log.info("call %s: client paused the audio at %d ms (PCI)", call_id, at_ms)
        self._hold_change(call_id, "hold", at_ms)

    def call_resumed(self, call_id: str, at_ms: int, held_ms: int) -> None:
        """A PCI pause ended: a ``resume`` call event (the gateway's own count is
        ``callqa_gateway_hold_seconds_total``)."""
        log.info("call %s: client resumed the audio at %d ms after %d ms", call_id, at_ms, held_ms)
        self._hold_change(call_id, "resume", at_ms)

    def call_paused(self, call_id: str, at_ms: int) -> None:
        """A secure pause began: a ``pause`` call event (the worker keeps the call open and leaves the span out
        of its talk and silence)."""
        log.info("call %s: capture paused at %d ms (secure pause)", call_id, at_ms)
        self._hold_change(call_id, "pause", at_ms)

    def call_unpaused(self, call_id: str, at_ms: int, paused_ms: int, reason: str | None = None) -> None:
        """A secure pause ended: an ``unpause`` call event (``resume`` on the wire)."""
        log.info("call %s: capture resumed at %d ms after %d ms%s", call_id, at_ms, paused_ms,
                 f" ({reason})" if reason else "")
        self._hold_change(call_id, "unpause", at_ms, reason)

    def _hold_change(self, call_id: str, kind: Literal["hold", "resume", "pause", "unpause"], at_ms: int,
                     reason: str | None = None) -> None:
        # The start's fields are repeated: a reader of CallEvent version 1 takes a hold change for a
        # repeated start, and must not read a call with no tenant or agent from it.
        with self._lock:
            start = self._opened.get(call_id) or CallEvent(call_id, "start")
            self._starts.append(CallEvent(call_id, kind, tenant=start.tenant, agent_id=start.agent_id,
                                          queue=start.queue, legs=list(start.legs), offset_ms=at_ms,
                                          reason=reason))
            self._lock.notify()

    # ---- the sender's side --------------------------------------------------------------------------------
    def retry(self, event: CallEvent) -> None:
        """A call event Kafka refused: sent again with the next batch (an end after the call's frames)."""
        with self._lock:
            (self._ends if event.event_type in ("end", "abort") else self._starts).appendleft(event)
            self._lock.notify()

    def take(self, max_messages: int, wait_s: float) -> Batch:
        """What to produce next (waiting up to ``wait_s`` for anything)."""
        with self._lock:
            if not (self._starts or self._legs or self._ends):
                self._sender_waiting = True
                self._lock.wait(wait_s)
                self._sender_waiting = False
            batch = Batch(starts=list(self._starts))
            self._starts.clear()
            self._take_frames(batch, max_messages)
            self._take_ends(batch)
            self.metrics.buffered_frames.set(sum(len(b) for b in self._legs.values()))
            return batch

    def _take_frames(self, batch: Batch, max_messages: int) -> None:
        if not self._legs:
            return
        share = max(1, max_messages // len(self._legs))
        for key in list(self._legs):
            buffer = self._legs[key]
            for _ in range(min(share, len(buffer))):
                batch.frames.append(buffer.popleft())
            if not buffer:
                del self._legs[key]
        for f in batch.frames:
            self._in_flight[f.call_id] = self._in_flight.get(f.call_id, 0) + 1

    def _take_ends(self, batch: Batch) -> None:
        # Not with its call's last frames, nor before Kafka took them: frames and end are on two topics, and a
        # producer's queues drain in any order after a broker outage (an end read first closes the call
        # without its last frames). ``_in_flight`` holds this batch's frames too (``_take_frames`` ran).
        waiting = {c for c, _ in self._legs} | set(self._in_flight)
        keep: deque[CallEvent] = deque()
        for event in self._ends:
            (keep if event.call_id in waiting else batch.ends).append(event)
        self._ends = keep

    def acknowledged(self, batch: Batch) -> None:
        with self._lock:
            for f in batch.frames:
                left = self._in_flight[f.call_id] - 1
                if left:
                    self._in_flight[f.call_id] = left
                else:
                    del self._in_flight[f.call_id]

    def call_flushed(self, call_id: str) -> bool:
        """No frame of the call is buffered or on its way to Kafka (AudioHook's ``closed`` waits for it)."""
        with self._lock:
            return call_id not in self._in_flight and not any((call_id, leg) in self._legs for leg in LEGS)

    def empty(self) -> bool:
        with self._lock:
            return not (self._starts or self._legs or self._ends or self._in_flight)


class KafkaSender:
    """The thread that drains the outbox into Kafka, one acknowledged batch at a time."""

    def __init__(self, outbox: Outbox, producer: ContractProducer, audio_topic: str, events_topic: str,
                 metrics: GatewayMetrics, batch_max: int = 2000) -> None:
        self.outbox = outbox
        self.producer = producer
        self.audio_topic = audio_topic
        self.events_topic = events_topic
        self.metrics = metrics
        self.batch_max = batch_max
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="callqa-gateway-sender", daemon=True)
        self.failure: str | None = None  # why the thread stopped on an error (a bug): the gateway is unhealthy
        self.frames_refused = 0  # frames Kafka refused (their delivery reports come in this thread's flushes)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Send everything still buffered, then stop."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while True:
                batch = self.outbox.take(self.batch_max, wait_s=0.05)
                if not len(batch):
                    if self._stop.is_set() and self.outbox.empty():
                        return
                    continue
                self._send(batch)
        except Exception as exc:  # noqa: BLE001 - a bug: said once, and /healthz fails, so a supervisor restarts
            # A thread's exception used to end it silently while the sockets went on filling the buffers.
            self.failure = f"{type(exc).__name__}: {exc}"[:300]
            log.exception("the Kafka sender stopped: %s", self.failure)

    def _send(self, batch: Batch) -> None:
        for event in batch.starts:
            self.producer.send(self.events_topic, event.call_id, event, partial(self._refused, event))
        not_sent: list[str] = []
        refused_before = self.frames_refused
        for frame in batch.frames:
            # A frame is out of its buffer now: one that cannot even be handed to the producer (too large, a
            # topic the client knows is gone) is counted and the batch goes on. Raised out of here, it ended
            # the sender with the rest of the batch taken and neither produced nor counted.
            try:
                self.producer.send(self.audio_topic, frame.call_id, frame, self._frame_refused)
            except Exception as exc:  # noqa: BLE001 - counted below, said once per batch
                not_sent.append(f"{frame.call_id}/{frame.leg}/{frame.seq}: {exc}")
        if not_sent:
            self.metrics.frames_lost.labels("not_sent").inc(len(not_sent))
            log.error("%d frames could not be handed to Kafka (first: %s)", len(not_sent), not_sent[0][:200])
        for event in batch.ends:
            self.producer.send(self.events_topic, event.call_id, event, partial(self._refused, event))
        self._flush(len(batch))
        acked_at_ms = time.time() * 1000
        built_ms = np.fromiter((f.produced_at_ms for f in batch.frames), np.float64, len(batch.frames))
        self.metrics.ack_latency.observe_many(np.maximum(0.0, acked_at_ms - built_ms) / 1000)
        refused = self.frames_refused - refused_before
        self.metrics.frames_acked.inc(max(0, len(batch.frames) - len(not_sent) - refused))
        self.outbox.acknowledged(batch)

    def _flush(self, messages: int) -> None:
        """Until Kafka took or refused every message produced: the batch counts as sent only then, and a
        call's end waits for it (``Outbox._take_ends``). An outage is waited out meanwhile (the buffers fill:
        Twilio's oldest audio is dropped, AudioHook is paused), said once per batch."""
        said = False
        while True:
            try:
                self.producer.flush(30.0)
                return
            except DeliveryError as exc:
                if self.producer.failures:
                    # Nothing to hand the failure back to (the audio was live): count it, say it once per batch.
                    self.metrics.delivery_failures.inc(len(self.producer.failures))
                    log.error("Kafka did not take %d messages: %s", len(self.producer.failures), exc)
                    self.producer.failures.clear()
                if not self.producer.pending():
                    return
                if not said:
                    log.warning("Kafka has not taken %d of %d messages after 30 s: waiting for it",
                                self.producer.pending(), messages)
                    said = True

    def _frame_refused(self, error: KafkaError) -> None:
        """A frame Kafka refused (served in this thread's flush): counted, not retried (live audio, its seq gap
        becomes silence)."""
        self.frames_refused += 1
        self.metrics.frames_lost.labels("refused").inc()

    def _refused(self, event: CallEvent, error: KafkaError) -> None:
        """A call event Kafka refused (in a flush of this thread) goes back to the outbox, to be sent again:
        a lost end left its call open until the worker's inactivity timeout (20 minutes), a lost start
        its tenant and agent unknown. Events are idempotent for the worker (a repeated start or end changes
        nothing); a lost frame is only counted (live audio: its seq gap becomes silence)."""
        self.metrics.event_retries.inc()
        log.warning("call %s: Kafka refused its %s event (%s); sending it again", event.call_id, event.event_type,
                    error.str())
        self.outbox.retry(event)
