"""The worker's Kafka-free core: call state, segments to the shared batcher, outputs, call lifecycle.

``CallProcessor`` receives decoded frames and call events with their input positions, and emits
contract messages through an ``OutputPort`` and rows through a ``RowSink``. The faust app (app.py)
is a thin shell that feeds it and commits what ``OffsetTracker`` allows.

Durability rule: a call's input offsets are released only after every message and row of that call
is durable (produced and acknowledged by Kafka; flushed into ClickHouse). Until then the call holds
its partitions' commit back, so a crash replays it from its first frame and, the pipeline being
deterministic, yields the same segment ids, which the ReplacingMergeTree tables deduplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import (
    AudioFrame,
    CallEvent,
    CallQA,
    DeadLetter,
    LatencyMetric,
    Message,
    QaAlert,
    QaItem,
    TranscriptSegment,
    now_ms,
)
from pipeline.contracts.messages import QaEvent as QaEventMessage
from pipeline.qa.call import AnalyzedSegment, CallAnalyzer, QaConfig
from pipeline.qa.rules import QaEvent
from pipeline.qa.segment import Segment
from pipeline.segmentation.segmenter import SpeechSegment, accept_many
from pipeline.store.base import RowSink
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker, TopicPartition

log = logging.getLogger("callqa.worker")

# With debug_raw_audio a dead letter carries at most this much of its payload (the start of it): Kafka
# refuses messages over 1 MiB by default, and 512 KiB holds a whole default-length segment (15 s of PCM).
DEBUG_RAW_MAX_BYTES = 512 * 1024


# ---- ports ----------------------------------------------------------------------------------------
class OutputPort(Protocol):
    """Where contract messages go (Kafka in the worker). Returns an awaitable that resolves on delivery."""

    async def publish(self, topic: str, key: str, message: Message) -> Awaitable[Any]: ...


@dataclass(frozen=True)
class Transcription:
    text: str
    avg_logprob: float
    no_speech_prob: float
    confidence: float
    model_name: str
    model_version: int
    batch_size: int
    batcher_wait_ms: float
    inference_ms: float
    is_silence: bool = False  # Whisper's no-speech verdict: no transcript is emitted


class SegmentTranscriber(Protocol):
    """The shared micro-batcher, seen from the worker: waits (back-pressure) when its queue is full."""

    async def transcribe(self, audio_16k: np.ndarray) -> Transcription: ...


# ---- state ----------------------------------------------------------------------------------------
@dataclass
class CallState:
    call_id: str
    start: CallEvent | None = None
    end: CallEvent | None = None
    legs: dict[str, LegState] = field(default_factory=dict)
    analyzer: CallAnalyzer | None = None
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    deliveries: list[Awaitable[Any]] = field(default_factory=list)
    segments_done: int = 0
    audio_tp: TopicPartition | None = None
    # Decoded segments the analyzer holds until earlier ones are known: what publishing them needs.
    # (leg, start ms, end ms, result, consumed ms, closed ms): no audio, which is not needed any more.
    decoded: dict[str, tuple[LegState, int, int, Transcription, int, int]] = field(default_factory=dict)
    last_frame_produced_ms: int = 0  # producer time of the newest frame seen (stream time)
    last_activity_ms: int = field(default_factory=now_ms)  # wall time of the last frame or event
    opened_at_ms: int = field(default_factory=now_ms)
    end_consumed_ms: int = 0
    started_at_ms: int = field(default_factory=now_ms)
    finishing: bool = False

    def frames_complete(self) -> bool:
        if self.end is None:
            return False
        counts = self.end.frame_counts
        return all(
            leg in self.legs and self.legs[leg].frames_released + self.legs[leg].reorder.held >= n
            for leg, n in counts.items()
        )


class InflightBudget:
    """Bounds decoded audio submitted for inference and not yet transcribed (bytes)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self.peak = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            # A single segment larger than the budget still goes through once nothing else is in flight.
            await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
            self.peak = max(self.peak, self.used)

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()


class StreamClock:
    """Stream time per audio partition: the newest producer timestamp consumed from it."""

    def __init__(self) -> None:
        self._produced: dict[TopicPartition, int] = {}

    def advance(self, tp: TopicPartition, produced_at_ms: int) -> None:
        self._produced[tp] = max(self._produced.get(tp, 0), produced_at_ms)

    def now(self, tp: TopicPartition) -> int:
        return self._produced.get(tp, 0)


class CallProcessor:
    def __init__(
        self,
        settings: Settings,
        transcriber: SegmentTranscriber,
        output: OutputPort,
        sink: RowSink,
        front_ends: Callable[[int, str], LegFrontEnd],
        qa_config: QaConfig,
        metrics: WorkerMetrics | None = None,
        is_finished_elsewhere: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.settings = settings
        self.transcriber = transcriber
        self.output = output
        self.sink = sink
        self.front_ends = front_ends
        self.qa_config = qa_config
        self.metrics = metrics or WorkerMetrics()
        self.offsets = OffsetTracker()
        self.clock = StreamClock()
        # Messages not yet consumed on a partition, -1 when unknown (the app asks Kafka; without
        # Kafka: caught up).
        self.lag: Callable[[TopicPartition], int] = lambda tp: 0
        self.budget = InflightBudget(settings.max_inflight_audio_mb * 1024 * 1024)
        self.calls: dict[str, CallState] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()  # recently finished calls (bounded)
        self.awaiting_release: list[CallState] = []
        self._is_finished_elsewhere = is_finished_elsewhere

    # ---- input ---------------------------------------------------------------------------------
    async def on_frame(self, tp: TopicPartition, offset: int, frame: AudioFrame) -> None:
        await self.on_frames([(tp, offset, frame)])

    async def on_frames(self, frames: Sequence[tuple[TopicPartition, int, AudioFrame]]) -> None:
        """A batch of frames, in consumption order: the VAD scores every leg that got audio in one run."""
        consumed_ms = now_ms()
        touched: dict[tuple[str, str], tuple[CallState, LegState, list[np.ndarray]]] = {}
        for tp, offset, frame in frames:
            call = await self._call_for(frame.call_id)
            if call is None or call.finishing:
                self.offsets.consumed(tp, offset, None)
                self.metrics.frames_dropped.labels("after_call_end").inc()
                continue
            self.offsets.consumed(tp, offset, call.call_id)
            self.clock.advance(tp, frame.produced_at_ms)
            call.audio_tp = tp
            call.last_frame_produced_ms = max(call.last_frame_produced_ms, frame.produced_at_ms)
            call.last_activity_ms = consumed_ms
            leg = self._leg(call, frame)
            before = _stats_tuple(leg)
            samples = leg.release(frame.seq, frame.payload, frame.produced_at_ms)
            self._count_reorder(leg, before)
            entry = touched.setdefault((call.call_id, leg.leg), (call, leg, []))
            if samples is not None and len(samples):
                entry[2].append(samples)
        self.metrics.frames.inc(len(frames))
        fed = [(call, leg, np.concatenate(chunks)) for call, leg, chunks in touched.values() if chunks]
        closed = accept_many([leg.front_end.segmenter for _, leg, _ in fed], [audio for _, _, audio in fed])
        submitted = [(call, leg, seg) for (call, leg, _), segments in zip(fed, closed, strict=True) for seg in segments]
        self._announce(submitted)
        for call, leg, seg in submitted:
            await self._submit(call, leg, seg, consumed_ms)
        for call in {id(c): c for c, _, _ in touched.values()}.values():
            if call.decoded and not call.finishing and call.analyzer is not None:
                # A decoded segment held only for the other leg's VAD to pass its start goes out as soon
                # as the audio has moved on, not at the call's next decoded segment (a task of the call's,
                # so the call completes only after it, and a failure stays with the call, not the batch).
                self._spawn(call, self._emit_released(call, call.analyzer.release(self._watermarks(call))))
        for call, leg, _ in touched.values():
            if self.settings.partial_interval_ms > 0:
                self._maybe_partial(call, leg)
            if call.end is not None and not call.finishing and call.frames_complete():
                await self._finish(call, call.end.event_type)

    async def on_event(self, tp: TopicPartition, offset: int, event: CallEvent) -> None:
        call = await self._call_for(event.call_id)
        if call is None or call.finishing:
            self.offsets.consumed(tp, offset, None)
            return
        self.offsets.consumed(tp, offset, call.call_id)
        call.last_activity_ms = now_ms()
        if call.audio_tp is None:
            # Audio and events are co-partitioned (same key, same partition count): the call's frames
            # are on the audio partition with this number, even before the first of them is read.
            call.audio_tp = (self.settings.topic_audio, tp[1])
        if event.event_type == "start":
            call.start = event
            call.started_at_ms = event.at_ms
            return
        call.end = event
        call.end_consumed_ms = now_ms()
        if event.event_type == "abort" or call.frames_complete():
            await self._finish(call, event.event_type)
        # Otherwise frames are still on their way on the audio topic; tick() closes the call once the
        # audio partition's stream time has passed the end event (plus a grace), or all frames came.

    def dead_letter_message(
        self, tp: TopicPartition, offset: int, key: bytes | None, raw: bytes, exc: BaseException,
        frame: AudioFrame | None = None,
    ) -> DeadLetter:
        """A reference to an input message that could not be processed (``frame``: it was decoded)."""
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        self.offsets.consumed(tp, offset, None)
        letter = DeadLetter(
            tp[0], tp[1], offset, f"{tp[0]}[{tp[1]}]@{offset}: {describe_error(exc)}",
            error_type=type(exc).__name__, worker_id=self.settings.worker_id,
            # Input topics are keyed by call ID: the key names the call even when the value is garbage.
            call_id=frame.call_id if frame is not None else _key_text(key),
        )
        if frame is not None:
            letter.leg, letter.start_ms = frame.leg, frame.start_ms
            # The frame may be what failed (a zero sample rate): building its reference must not raise too.
            if frame.sample_rate > 0:
                letter.end_ms = frame.start_ms + round(len(frame.payload) / _bytes_per_ms(frame))
        if self.settings.debug_raw_audio:
            letter.raw, letter.key, letter.raw_kind = raw[:DEBUG_RAW_MAX_BYTES], key, "message"
        return letter

    # ---- timers --------------------------------------------------------------------------------
    async def tick(self) -> None:
        """Close calls whose end event's grace has passed, or that went quiet (no end event ever came).

        Both are judged in stream time (producer timestamps of the audio partition the call is on), not
        wall time: after a backlog the worker reads old audio fast, and a wall clock would close calls
        whose frames are merely queued behind other calls' frames.
        """
        timeout_ms = self.settings.call_inactivity_timeout_s * 1000
        grace_ms = self.settings.end_grace_ms
        wall = now_ms()
        for call in list(self.calls.values()):
            if call.finishing:
                continue
            how = self._due(call, wall, timeout_ms, grace_ms)
            if how == "timeout":
                log.info("call %s: no audio for %.0f s of stream time, closing it", call.call_id, timeout_ms / 1000)
            if how is not None:
                await self._finish(call, how)
        self.metrics.active_calls.set(len(self.calls))
        self.metrics.active_legs.set(sum(len(c.legs) for c in self.calls.values()))
        self.metrics.inflight_audio_bytes.set(self.budget.used)
        self.metrics.inflight_audio_peak_bytes.set(self.budget.peak)

    def _due(self, call: CallState, wall: int, timeout_ms: float, grace_ms: int) -> str | None:
        """How the call should be closed now ("end", "abort", "timeout"), or None to keep it open."""
        tp = call.audio_tp
        assert tp is not None  # set by the first frame or event
        caught_up = self.lag(tp) == 0
        # Caught up, the wall clock is stream time; behind, the partition's newest producer time is.
        stream_now = wall if caught_up else self.clock.now(tp)
        if call.end is not None and (
            (caught_up and wall - call.end_consumed_ms >= grace_ms)
            or stream_now >= call.end.at_ms + grace_ms  # frames sent after the end event were read
        ):
            return call.end.event_type
        last = call.last_frame_produced_ms or call.opened_at_ms
        if stream_now - last >= timeout_ms:
            return "timeout"
        # Last resort for a partition whose position is unknown: a call cannot stay open forever.
        if wall - call.last_activity_ms >= 10 * timeout_ms:
            return "timeout"
        return None

    async def make_durable(self) -> dict[TopicPartition, int]:
        """Wait for finished calls' outputs to be durable, release their offsets; return what may be committed."""
        ready = [c for c in self.awaiting_release if not c.pending]
        if ready:
            for call in ready:
                await asyncio.gather(*call.deliveries)
            await self.sink.flush()
            for call in ready:
                self.offsets.release(call.call_id)
                self.awaiting_release.remove(call)
        return self.offsets.committable()

    async def drain(self) -> None:
        """Finish in-flight inference (on shutdown); calls stay open and will be replayed."""
        tasks = [t for c in self.calls.values() for t in c.pending]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- internals -----------------------------------------------------------------------------
    async def _call_for(self, call_id: str) -> CallState | None:
        call = self.calls.get(call_id)
        if call is not None:
            return call
        if call_id in self.finished:
            return None
        if self._is_finished_elsewhere is not None and await self._is_finished_elsewhere(call_id):
            # Tail of a call finished before a restart: its results are stored already.
            self._remember_finished(call_id)
            return None
        # The audio and the events agent both run this; the other may have opened the call while
        # this one awaited the store, so look again before opening it (no await from here on).
        call = self.calls.get(call_id)
        if call is None and call_id not in self.finished:
            call = self.calls[call_id] = CallState(call_id)
            call.analyzer = CallAnalyzer(call_id, self.qa_config)
        return call

    def _leg(self, call: CallState, frame: AudioFrame) -> LegState:
        leg = call.legs.get(frame.leg)
        if leg is None:
            frame_ms = max(1, round(len(frame.payload) / _bytes_per_ms(frame)))
            leg = call.legs[frame.leg] = LegState.open(
                call.call_id, frame.leg, self.front_ends(frame.sample_rate, frame.encoding), frame_ms,
                self.settings.max_segment_ms, self.settings.reorder_window_frames,
            )
        return leg

    def _count_reorder(self, leg: LegState, before: tuple[int, int, int]) -> None:
        s = leg.reorder.stats
        dup, late, gaps = s.duplicates - before[0], s.late - before[1], s.gaps_filled - before[2]
        if dup:
            self.metrics.frames_dropped.labels("duplicate").inc(dup)
        if late:
            self.metrics.frames_dropped.labels("late").inc(late)
            log.info("call %s %s: %d frame(s) arrived after their place was filled with silence",
                     leg.call_id, leg.leg, late)
        if gaps:
            self.metrics.gap_frames.inc(gaps)

    @staticmethod
    def _announce(closed: Sequence[tuple[CallState, LegState, SpeechSegment]]) -> None:
        """Tell each call's analyzer about its newly closed segments before anything awaits: once a leg's
        segmenter has moved past a segment, a later segment may be released only after it is known."""
        for call, leg, seg in closed:
            assert call.analyzer is not None
            call.analyzer.expect(leg.leg, _segment_id(call, leg, seg), seg.start_ms)

    @staticmethod
    def _spawn(call: CallState, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as one of the call's pending tasks (the call completes only after them)."""
        task = asyncio.create_task(work)
        call.pending.add(task)
        task.add_done_callback(call.pending.discard)

    async def _submit(self, call: CallState, leg: LegState, seg: SpeechSegment, consumed_ms: int) -> None:
        nbytes = seg.audio.nbytes
        await self.budget.acquire(nbytes)  # back-pressure: the agent waits, Kafka fetching pauses
        self._spawn(call, self._transcribe(call, leg, seg, consumed_ms, nbytes))

    async def _transcribe(self, call: CallState, leg: LegState, seg: SpeechSegment, consumed_ms: int,
                          nbytes: int) -> None:
        closed_ms = now_ms()
        segment_id = _segment_id(call, leg, seg)
        assert call.analyzer is not None
        # The budget is held until the segment's rows are in the sink's buffer: while ClickHouse is
        # down the sink's write() waits, so does this, and the agents stop taking frames.
        try:
            try:
                result = await self.transcriber.transcribe(seg.audio)
            except Exception as exc:  # noqa: BLE001 - one failed segment must not stop the call
                self.metrics.segment_failures.inc()
                log.warning("segment %s failed: %s", segment_id, describe_error(exc))
                await self._publish(call, self.settings.topic_dead_letters, call.call_id,
                                    self._segment_dead_letter(call, leg, seg, segment_id, exc))
                await self._emit_released(call, call.analyzer.skip(segment_id, self._watermarks(call)))
                return
            if result.is_silence or not result.text.strip():
                self.metrics.segments.labels("silence").inc()
                await self._emit_released(call, call.analyzer.skip(segment_id, self._watermarks(call)))
                return
            call.decoded[segment_id] = (leg, seg.start_ms, seg.end_ms, result, consumed_ms, closed_ms)
            segment = Segment(call.call_id, leg.leg, segment_id,  # type: ignore[arg-type]
                              seg.start_ms, seg.end_ms, result.text.strip())
            await self._emit_released(call, call.analyzer.complete(segment, self._watermarks(call)))
        finally:
            await self.budget.release(nbytes)

    def _segment_dead_letter(self, call: CallState, leg: LegState, seg: SpeechSegment, segment_id: str,
                             exc: BaseException) -> DeadLetter:
        """A reference to a segment whose inference failed: its call, leg and time range on the audio topic."""
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        letter = DeadLetter(
            self.settings.topic_audio, call.audio_tp[1] if call.audio_tp else -1, -1,
            f"segment {segment_id}: inference failed: {describe_error(exc)}",
            error_type=type(exc).__name__, worker_id=self.settings.worker_id, call_id=call.call_id,
            leg=leg.leg, segment_id=segment_id, start_ms=seg.start_ms, end_ms=seg.end_ms,
        )
        if self.settings.debug_raw_audio:
            letter.raw, letter.raw_kind = _pcm16(seg.audio[:DEBUG_RAW_MAX_BYTES // 2]), "pcm16le_16k"
        return letter

    def _watermarks(self, call: CallState) -> dict[str, int]:
        """Per leg, the time before which all its segments have been submitted: the open segment's start,
        else what the VAD has heard less its pre-roll (a segment may start that far back)."""
        marks: dict[str, int] = {}
        for name, leg in call.legs.items():
            segmenter = leg.front_end.segmenter
            open_start = segmenter.open_segment_start_ms
            heard_ms = segmenter.samples_received // 16 - self.settings.pre_roll_ms - 100
            marks[name] = heard_ms if open_start is None else open_start
        return marks

    async def _emit_released(self, call: CallState, released: list[AnalyzedSegment]) -> None:
        """Publish segments the analyzer released (in time order), each with its own decoding's details."""
        for analyzed in released:
            segment_id = analyzed.redacted.segment.segment_id
            leg, start_ms, end_ms, r, consumed_ms, closed_ms = call.decoded.pop(segment_id)
            await self._emit_segment(call, leg, start_ms, end_ms, segment_id, r, consumed_ms, closed_ms, analyzed)

    async def _emit_segment(self, call: CallState, leg: LegState, start_ms: int, end_ms: int, segment_id: str,
                            r: Transcription, consumed_ms: int, closed_ms: int,
                            analyzed: AnalyzedSegment) -> None:
        text = analyzed.redacted.text  # the analyzer redacts unless redaction is explicitly off
        produced = now_ms()
        last_frame_ms = leg.produced_at(end_ms) or consumed_ms
        transcript = _transcript(call.call_id, leg, segment_id, start_ms, end_ms, text, r, True,
                                 sum(analyzed.redacted.counts.values()), closed_ms, produced)
        latency = LatencyMetric(
            segment_id=segment_id, call_id=call.call_id, leg=leg.leg, is_final=True,  # type: ignore[arg-type]
            frame_to_consume_ms=float(max(0, consumed_ms - last_frame_ms)),
            batcher_wait_ms=r.batcher_wait_ms, batch_size=r.batch_size, inference_ms=r.inference_ms,
            end_to_end_ms=float(max(0, produced - last_frame_ms)), worker_id=self.settings.worker_id,
            measured_at_ms=produced,
        )
        await self._publish(call, self.settings.topic_transcripts, call.call_id, transcript)
        await self._publish(call, self.settings.topic_latency, call.call_id, latency)
        for ev in analyzed.events:
            self.metrics.qa_alerts.labels(ev.rule).inc()
            await self._publish(call, self.settings.topic_qa, call.call_id, QaAlert(
                call.call_id, ev.rule, ev.category, ev.leg, ev.kind, ev.offset_ms, ev.text, ev.severity,
            ))
        await self.sink.write("segments", [_segment_row(transcript)])
        await self.sink.write("latency", [_latency_row(latency)])
        call.segments_done += 1
        self.metrics.segments.labels("final").inc()
        self.metrics.final_delay.observe(latency.end_to_end_ms / 1000)
        self.metrics.batch_size.observe(r.batch_size)

    def _maybe_partial(self, call: CallState, leg: LegState) -> None:
        """Transcribe the open segment again once it has grown by the partial interval."""
        segmenter = leg.front_end.segmenter
        start = segmenter.open_segment_start_ms
        audio = segmenter.open_segment_audio()
        if start is None or audio is None or leg.partial_inflight:
            return
        length_ms = len(audio) // 16
        grown = length_ms - (leg.partial_len_ms if leg.partial_start_ms == start else 0)
        if grown < self.settings.partial_interval_ms:
            return
        leg.partial_start_ms, leg.partial_len_ms, leg.partial_inflight = start, length_ms, True
        self._spawn(call, self._partial(call, leg, start, audio.copy()))

    async def _partial(self, call: CallState, leg: LegState, start_ms: int, audio: np.ndarray) -> None:
        try:
            await self.budget.acquire(audio.nbytes)
            try:
                r = await self.transcriber.transcribe(audio)
            finally:
                await self.budget.release(audio.nbytes)
        except Exception as exc:  # noqa: BLE001 - a partial is a preview: the final will be tried again
            log.info("partial of %s/%s failed: %s", call.call_id, leg.leg, describe_error(exc))
            return
        finally:
            leg.partial_inflight = False
        # Closed meanwhile: its final is on its way and supersedes this partial.
        if leg.front_end.segmenter.open_segment_start_ms != start_ms or r.is_silence or not r.text.strip():
            return
        assert call.analyzer is not None
        end_ms = start_ms + len(audio) // 16
        redacted = call.analyzer.redact_partial(
            Segment(call.call_id, leg.leg, f"{call.call_id}/{leg.leg}/{start_ms:09d}", start_ms, end_ms,  # type: ignore[arg-type]
                    r.text.strip()),
            self._watermarks(call),
        )
        produced = now_ms()
        partial = _transcript(call.call_id, leg, redacted.segment.segment_id, start_ms, end_ms, redacted.text, r,
                              False, sum(redacted.counts.values()), 0, produced)
        await self._publish(call, self.settings.topic_transcripts, call.call_id, partial)
        await self.sink.write("segments", [_segment_row(partial)])
        self.metrics.segments.labels("partial").inc()
        captured = leg.produced_at(end_ms)
        if captured:
            self.metrics.partial_delay.observe(max(0, produced - captured) / 1000)

    async def _finish(self, call: CallState, how: str) -> None:
        """Flush the legs, wait for the call's segments, then emit the call's QA and row."""
        if call.finishing:
            return
        call.finishing = True
        counts = call.end.frame_counts if call.end else {}
        closed: list[tuple[CallState, LegState, SpeechSegment]] = []
        for leg in call.legs.values():
            before = _stats_tuple(leg)
            closed += [(call, leg, seg) for seg in leg.finish(counts.get(leg.leg))]
            self._count_reorder(leg, before)
        self._announce(closed)
        for _, leg, seg in closed:
            await self._submit(call, leg, seg, now_ms())
        self._spawn(call, self._complete(call, how))

    async def _complete(self, call: CallState, how: str) -> None:
        current = asyncio.current_task()
        await asyncio.gather(*[t for t in call.pending if t is not current], return_exceptions=True)
        assert call.analyzer is not None
        await self._emit_released(call, call.analyzer.flush())
        audio_ms = max((leg.frames_released * leg.frame_ms for leg in call.legs.values()), default=0)
        result = call.analyzer.finalize(audio_ms)
        start = call.start or call.end
        qa = CallQA(
            call_id=call.call_id, score_pct=result.score_pct, auto_failed=result.auto_failed,
            metrics={k: float(v) for k, v in result.metrics.items()},
            # An item whose metric the call lacks (passed None) is not applicable: it is not scored.
            items=[QaItem(i.question, float(i.weight), bool(i.passed), i.rationale, bool(i.auto_fail))
                   for i in result.items if i.passed is not None],
            events=[_event_message(e) for e in result.events],
            tenant=start.tenant if start else "", agent_id=start.agent_id if start else "",
            scorecard=result.scorecard,
        )
        await self._publish(call, self.settings.topic_qa, call.call_id, qa)
        ended = now_ms()
        await self.sink.write("calls", [{
            "call_id": call.call_id, "tenant": qa.tenant, "agent_id": qa.agent_id,
            "queue": start.queue if start else "", "direction": start.direction if start else "inbound",
            "legs": sorted(call.legs), "started_at": _dt(call.started_at_ms), "ended_at": _dt(ended),
            "end_reason": how, "segments": call.segments_done, "audio_ms": audio_ms, "updated_at": _dt(ended),
        }])
        await self.sink.write("call_qa", [_call_qa_row(qa)])
        if result.events:
            await self.sink.write("qa_events", [_qa_event_row(call.call_id, e) for e in result.events])
        self.metrics.calls_finished.labels(how).inc()
        call.legs.clear()  # audio buffers and VAD state are not needed while the call awaits release
        del self.calls[call.call_id]
        self._remember_finished(call.call_id)
        self.awaiting_release.append(call)

    async def _publish(self, call: CallState, topic: str, key: str, message: Message) -> None:
        call.deliveries.append(await self.output.publish(topic, key, message))

    def _remember_finished(self, call_id: str) -> None:
        self.finished[call_id] = None
        while len(self.finished) > 100_000:
            self.finished.popitem(last=False)


# ---- messages and rows ----------------------------------------------------------------------------
def _transcript(call_id: str, leg: LegState, segment_id: str, start_ms: int, end_ms: int, text: str,
                r: Transcription, is_final: bool, redactions: int, closed_ms: int, produced_ms: int) -> TranscriptSegment:
    """The TranscriptSegment of a final or partial result (a partial has no closing time)."""
    return TranscriptSegment(
        segment_id=segment_id, call_id=call_id, leg=leg.leg,  # type: ignore[arg-type]
        start_ms=start_ms, end_ms=end_ms, text=text, is_final=is_final, confidence=r.confidence,
        avg_logprob=r.avg_logprob, no_speech_prob=r.no_speech_prob, model_name=r.model_name,
        model_version=r.model_version, redactions=redactions,
        first_frame_produced_at_ms=leg.produced_at(start_ms + 1), segment_closed_at_ms=closed_ms,
        batch_size=r.batch_size, batcher_wait_ms=r.batcher_wait_ms, inference_ms=r.inference_ms,
        produced_at_ms=produced_ms,
    )


def _segment_id(call: CallState, leg: LegState, seg: SpeechSegment) -> str:
    """Derived from call, leg and start: a replayed call gets the same ids (deduplicated downstream)."""
    return f"{call.call_id}/{leg.leg}/{seg.start_ms:09d}"


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _segment_row(t: TranscriptSegment) -> dict[str, Any]:
    return {
        "segment_id": t.segment_id, "call_id": t.call_id, "leg": t.leg, "start_ms": t.start_ms,
        "end_ms": t.end_ms, "text": t.text, "confidence": t.confidence, "avg_logprob": t.avg_logprob,
        "no_speech_prob": t.no_speech_prob, "is_final": int(t.is_final), "model_name": t.model_name,
        "model_version": t.model_version, "redactions": t.redactions, "produced_at": _dt(t.produced_at_ms),
    }


def _latency_row(m: LatencyMetric) -> dict[str, Any]:
    return {
        "segment_id": m.segment_id, "call_id": m.call_id, "leg": m.leg, "batch_size": m.batch_size,
        "batcher_wait_ms": m.batcher_wait_ms, "inference_ms": m.inference_ms,
        "frame_to_consume_ms": m.frame_to_consume_ms, "end_to_end_ms": m.end_to_end_ms,
        "worker_id": m.worker_id, "measured_at": _dt(m.measured_at_ms),
    }


def _call_qa_row(qa: CallQA) -> dict[str, Any]:
    return {
        "call_id": qa.call_id, "tenant": qa.tenant, "agent_id": qa.agent_id, "score_pct": qa.score_pct,
        "auto_failed": int(qa.auto_failed), "metrics": qa.metrics,
        "items.question": [i.question for i in qa.items], "items.weight": [i.weight for i in qa.items],
        "items.passed": [int(i.passed) for i in qa.items], "items.rationale": [i.rationale for i in qa.items],
        "computed_at": _dt(qa.computed_at_ms),
    }


def _qa_event_row(call_id: str, e: QaEvent) -> dict[str, Any]:
    return {
        "call_id": call_id, "rule": e.rule, "category": e.category, "leg": e.leg, "kind": e.kind,
        "offset_ms": max(0, e.offset_ms), "text": e.text, "severity": e.severity, "detected_at": _dt(now_ms()),
    }


def _event_message(e: QaEvent) -> QaEventMessage:
    return QaEventMessage(e.rule, e.category, e.leg, e.kind, e.offset_ms, e.text, e.severity)


def _stats_tuple(leg: LegState) -> tuple[int, int, int]:
    s = leg.reorder.stats
    return s.duplicates, s.late, s.gaps_filled


def _bytes_per_ms(frame: AudioFrame) -> float:
    per_sample = 2 if frame.encoding == "pcm16" else 1
    return frame.sample_rate * per_sample / 1000


def describe_error(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one bounded line, for dead letters and logs (never a traceback's worth)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def _key_text(key: bytes | None) -> str:
    """The call ID a message key names (keys are call IDs), bounded: a garbage key stays a short one."""
    return key.decode("utf-8", errors="replace")[:128] if key else ""


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
