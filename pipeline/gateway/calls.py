"""The calls this gateway has open: streams attach to them, audio is placed on their legs, and each
call sends one start event, its frames, and one end event.

A call whose capture is securely paused (``pause.py``) keeps its streams and clock, but its audio is
dropped here, never built into frames, until the pause ends (at the latest with the call).

A call outlives its streams by ``end_grace_s``: a stream for the same call within it (a Twilio stream
restarted after a transfer, an AudioHook session continued) goes on with the call's clock instead of
starting a new call. Streams of one call that are open at the same time (Twilio allows one per track)
share the call's clock, and each leg is written by one stream at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pipeline.contracts.messages import LEGS, AudioFrame, CallEvent, Leg, now_ms
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.ports import CallSink
from pipeline.gateway.timeline import FRAME_MS, SAMPLE_RATE, LegFrame, LegTimeline

log = logging.getLogger("callqa.gateway")

MAX_LABEL_CHARS = 128  # tenant, agent and queue come from the caller's signalling: bounded


@dataclass(frozen=True)
class CallInfo:
    """What a stream tells about its call; never phone numbers (ANI, DNIS), which stay in the signalling."""

    tenant: str = ""
    agent_id: str = ""
    queue: str = ""

    @classmethod
    def bounded(cls, tenant: object, agent_id: object, queue: object) -> CallInfo:
        def text(value: object) -> str:
            return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""

        return cls(text(tenant), text(agent_id), text(queue))


@dataclass
class LiveCall:
    call_id: str
    info: CallInfo
    legs: list[Leg]
    timelines: dict[Leg, LegTimeline] = field(default_factory=dict)
    streams: dict[str, int] = field(default_factory=dict)  # open stream id -> its first sample on the call
    leg_writer: dict[Leg, str] = field(default_factory=dict)  # leg -> the open stream that writes it
    detached_at: float | None = None  # when its last stream closed
    end_reason: str = ""
    held_at_ms: int | None = None
    paused_at_ms: int | None = None  # a secure pause under way: since when on the call's clock
    message_ms: int = FRAME_MS  # audio per frame message (CALLQA_AUDIO_MESSAGE_MS)

    @property
    def position(self) -> int:
        """The call's clock: the furthest any leg has got (samples)."""
        return max((t.position for t in self.timelines.values()), default=0)

    def timeline(self, leg: Leg) -> LegTimeline:
        if leg not in self.timelines:
            self.timelines[leg] = LegTimeline(SAMPLE_RATE * self.message_ms // 1000)
        return self.timelines[leg]


@dataclass(frozen=True)
class Attachment:
    """A stream's place in its call: where its time 0 is, and the legs it may write."""

    call_id: str
    base: int
    legs: frozenset[Leg]
    continued: bool  # the call was already open (a second stream, or one within the grace)


class OpenCalls:
    def __init__(self, sink: CallSink, metrics: GatewayMetrics, end_grace_s: float,
                 clock: Callable[[], float] = time.monotonic, message_ms: int = FRAME_MS) -> None:
        self.sink = sink
        self.message_ms = message_ms
        self.metrics = metrics
        self.end_grace_s = end_grace_s
        self.clock = clock
        self.calls: dict[str, LiveCall] = {}
        self._built = 0  # frames built since publish_counts

    def attach(self, stream_id: str, call_id: str, info: CallInfo, legs: Iterable[Leg]) -> Attachment:
        """Open the call (start event) or continue it; the stream writes the legs no other open stream
        of the call writes."""
        wanted = [leg for leg in LEGS if leg in set(legs)]
        call = self.calls.get(call_id)
        continued = call is not None
        if call is None:
            call = LiveCall(call_id, info, list(wanted), message_ms=self.message_ms)
            self.calls[call_id] = call
            self.sink.call_started(CallEvent(call_id, "start", tenant=info.tenant, agent_id=info.agent_id,
                                             queue=info.queue, legs=list(wanted), sample_rate=SAMPLE_RATE,
                                             encoding="mulaw"))
            self.metrics.calls_active.inc()
        call.legs += [leg for leg in wanted if leg not in call.legs]
        base = self._base_for_new_stream(call)
        call.streams[stream_id] = base
        call.detached_at = None
        mine = frozenset(leg for leg in wanted if leg not in call.leg_writer)
        for leg in mine:
            call.leg_writer[leg] = stream_id
        return Attachment(call_id, base, mine, continued)

    def _base_for_new_stream(self, call: LiveCall) -> int:
        if call.streams:  # concurrent streams of one call start together
            return min(call.streams.values())
        position = call.position
        if call.detached_at is not None:  # the time with no stream at all passed on the call too
            position += int((self.clock() - call.detached_at) * SAMPLE_RATE)
        message = SAMPLE_RATE * call.message_ms // 1000
        return -(-position // message) * message

    def write(self, att: Attachment, leg: Leg, at: int, payload: bytes) -> bool:
        """Place audio at the stream's sample ``at``; False (and nothing written) for a leg it doesn't own."""
        if leg not in att.legs:
            return False
        call = self.calls[att.call_id]
        timeline = call.timeline(leg)
        if call.paused_at_ms is not None:
            # Never built into a frame: the leg's clock moves past it, so audio after the pause lines up.
            self._send(call, leg, timeline.skip(att.base + at + len(payload) - timeline.position))
            self.metrics.paused_audio_dropped.inc(len(payload) / SAMPLE_RATE)
            return True
        counts = timeline.counts
        before = (counts.silence_samples, counts.overlap_samples, counts.skipped_samples)
        self._send(call, leg, timeline.write(att.base + at, payload))
        if (counts.silence_samples, counts.overlap_samples, counts.skipped_samples) != before:
            self._count_adjusted(timeline, before)
        return True

    def skip(self, att: Attachment, samples: int) -> None:
        """The stream's audio for ``samples`` will never come (paused, discarded): its legs' clocks move on
        with no frames."""
        call = self.calls[att.call_id]
        for leg in att.legs:
            self._send(call, leg, call.timeline(leg).skip(samples))
        self.metrics.audio_adjusted.labels("skipped").inc(samples / SAMPLE_RATE)

    def hold(self, att: Attachment) -> None:
        call = self.calls[att.call_id]
        if call.held_at_ms is None:
            call.held_at_ms = self._call_ms(call)
            self.sink.call_held(call.call_id, call.held_at_ms)

    def unhold(self, att: Attachment) -> None:
        call = self.calls[att.call_id]
        if call.held_at_ms is not None:
            at_ms = self._call_ms(call)
            self.sink.call_resumed(call.call_id, at_ms, at_ms - call.held_at_ms)
            call.held_at_ms = None

    def pause(self, call: LiveCall) -> int:
        """Secure pause: from now on the call's audio is dropped (``write``); returns where on its clock."""
        call.paused_at_ms = self._call_ms(call)
        self.sink.call_paused(call.call_id, call.paused_at_ms)
        return call.paused_at_ms

    def unpause(self, call: LiveCall, reason: str | None = None) -> tuple[int, int]:
        """The secure pause ends: audio is taken again; returns (where on the call's clock, how long it lasted)."""
        assert call.paused_at_ms is not None
        at_ms = self._call_ms(call)
        paused_ms = max(0, at_ms - call.paused_at_ms)
        call.paused_at_ms = None
        self.sink.call_unpaused(call.call_id, at_ms, paused_ms, reason)
        self.metrics.paused_seconds.inc(paused_ms / 1000)
        return at_ms, paused_ms

    def detach(self, stream_id: str, call_id: str, reason: str) -> None:
        """The stream closed; the call ends ``end_grace_s`` after its last stream (see ``tick``)."""
        call = self.calls.get(call_id)
        if call is None or stream_id not in call.streams:
            return
        del call.streams[stream_id]
        for leg in [leg for leg, writer in call.leg_writer.items() if writer == stream_id]:
            del call.leg_writer[leg]
        if not call.streams:
            call.detached_at = self.clock()
            call.end_reason = reason

    def tick(self) -> list[str]:
        """End the calls whose grace after their last stream has passed; returns their IDs."""
        self.publish_counts()
        now = self.clock()
        due = [c.call_id for c in self.calls.values()
               if c.detached_at is not None and now - c.detached_at >= self.end_grace_s]
        for call_id in due:
            self.end(call_id)
        return due

    def end(self, call_id: str, reason: str | None = None) -> None:
        """Send the call's last frames and its one end event (frames per leg, as replay counts them)."""
        call = self.calls.pop(call_id)
        if call.paused_at_ms is not None:  # a pause never resumed ends with the call, before its end event
            self.unpause(call, "call ended")
        for leg, timeline in call.timelines.items():
            self._send(call, leg, timeline.flush())
        counts: dict[str, int] = {leg: t.next_seq for leg, t in call.timelines.items() if t.next_seq > 0}
        why = reason or call.end_reason or "ended"
        self.sink.call_ended(CallEvent(call_id, "end", tenant=call.info.tenant, agent_id=call.info.agent_id,
                                       queue=call.info.queue, legs=list(call.legs), sample_rate=SAMPLE_RATE,
                                       encoding="mulaw", frame_counts=counts, reason=why))
        self.metrics.calls_active.dec()
        self.metrics.calls_ended.labels(why).inc()
        log.info("call %s ended (%s): %s", call_id, why,
                 ", ".join(f"{leg} {n} frames" for leg, n in counts.items()) or "no audio")

    def end_all(self, reason: str) -> None:
        """Gateway shutdown: every call ends now (no later stream can reach this gateway)."""
        for call_id, call in list(self.calls.items()):
            self.end(call_id, reason if call.streams else None)
        self.publish_counts()

    def _send(self, call: LiveCall, leg: Leg, frames: list[LegFrame]) -> None:
        for f in frames:
            self.sink.frame(AudioFrame(call.call_id, leg, f.seq, f.seq * call.message_ms, SAMPLE_RATE, "mulaw", f.payload,
                                       produced_at_ms=now_ms()))
        # Counted here, published by the tick: a counter's lock per message was 3 % of a frame's CPU.
        self._built += len(frames)

    def publish_counts(self) -> None:
        """Add the frames built since the last call to ``callqa_gateway_frames_built_total``."""
        built, self._built = self._built, 0
        if built:
            self.metrics.frames_built.inc(built)

    def _count_adjusted(self, timeline: LegTimeline, before: tuple[int, int, int]) -> None:
        silence = timeline.counts.silence_samples - before[0]
        overlap = timeline.counts.overlap_samples - before[1]
        skipped = timeline.counts.skipped_samples - before[2]  # a gap too long to fill (timeline.py)
        if silence:
            self.metrics.audio_adjusted.labels("silence").inc(silence / SAMPLE_RATE)
        if overlap:
            self.metrics.audio_adjusted.labels("overlap").inc(overlap / SAMPLE_RATE)
        if skipped:
            self.metrics.audio_adjusted.labels("skipped").inc(skipped / SAMPLE_RATE)

    @staticmethod
    def _call_ms(call: LiveCall) -> int:
        return call.position * 1000 // SAMPLE_RATE
