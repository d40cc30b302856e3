"""Frame intake and ordering: the first stage a batch of audio frames goes through.

Each frame is checked on its own (a bad one is rejected alone, before it touches any state), matched
to its open call (``CallRegistry``), checked against its leg (format, seq jump), recorded as consumed
(offsets, stream clock, call activity), and put through its leg's jitter buffer, which lets out the
samples now in order, at its segmenter's input rate (16 kHz, or an 8 kHz leg's own with the VAD at 8 kHz). What comes out is the audio each touched leg got, for segmentation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, DeadLetter, now_ms
from pipeline.segmentation.segmenter import Silence
from pipeline.worker.clock import StreamClock
from pipeline.worker.dead_letters import bytes_per_ms, message_dead_letter
from pipeline.worker.frames import FrameError, RejectedFrame, check_frame, check_leg_format, check_seq_jump
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker, TopicPartition
from pipeline.worker.registry import CallRegistry
from pipeline.worker.reorder import ReleasedFrame
from pipeline.worker.state import CallState

log = logging.getLogger("callqa.worker")


@dataclass
class LegAudio:
    """The audio one batch let out of one leg's jitter buffer, in order (may be none), at the leg's
    segmenter's input rate; a long gap (a hold) as ``Silence``, its length, not its zeros."""

    call: CallState
    leg: LegState
    chunks: list[np.ndarray | Silence] = field(default_factory=list)


@dataclass
class IntakeBatch:
    """What a batch of frames left for the next stages."""

    legs: list[LegAudio]  # every leg that took a frame, in the order they were first touched
    rejected: list[RejectedFrame]  # unusable frames, for the caller to dead-letter
    consumed_ms: int  # wall time the batch was taken

    def calls(self) -> list[CallState]:
        """The calls of the touched legs, each once, in order."""
        return list({id(a.call): a.call for a in self.legs}.values())


@dataclass(slots=True)  # not frozen: taken for every frame, and a frozen init costs 4x as much
class ReorderTally:
    """A leg's jitter-buffer counters at one moment, to count what a release or flush changed."""

    duplicates: int
    late: int
    gaps_filled: int
    before_checkpoint: int

    @classmethod
    def of(cls, leg: LegState) -> ReorderTally:
        s = leg.reorder.stats
        return cls(s.duplicates, s.late, s.gaps_filled, leg.before_checkpoint)

    def count_since(self, leg: LegState, metrics: WorkerMetrics) -> None:
        s = leg.reorder.stats
        skipped = leg.before_checkpoint - self.before_checkpoint
        dup, late, gaps = s.duplicates - self.duplicates, s.late - self.late, s.gaps_filled - self.gaps_filled
        if skipped > 0:
            metrics.frames_dropped.labels("before_checkpoint").inc(skipped)
        if dup:
            metrics.frames_dropped.labels("duplicate").inc(dup)
        if late:
            metrics.frames_dropped.labels("late").inc(late)
            log.info("call %s %s: %d frame(s) arrived after their place was filled with silence",
                     leg.call_id, leg.leg, late)
        if gaps:
            metrics.gap_frames.inc(gaps)


class FrameIntake:
    """Checks, orders and takes frames into their calls' legs; holds rejected frames' offsets until their
    dead letters are delivered."""

    def __init__(self, settings: Settings, registry: CallRegistry, offsets: OffsetTracker, clock: StreamClock,
                 front_ends: Callable[[int, str], LegFrontEnd], metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.registry = registry
        self.offsets = offsets
        self.clock = clock
        self.front_ends = front_ends
        self.metrics = metrics

    async def take(self, frames: Sequence[tuple[TopicPartition, int, AudioFrame]]) -> IntakeBatch:
        """A batch of frames, in consumption order. Frames of partitions not owned are ignored; frames of
        finished calls are consumed and dropped; unusable frames touch no state (their seqs stay gaps)."""
        batch = IntakeBatch([], [], now_ms())
        owned = [f for f in frames if self.registry.owns(f[0])]
        touched: dict[tuple[str, str], tuple[LegAudio, list[ReleasedFrame]]] = {}
        for tp, offset, frame in owned:
            try:
                check_frame(frame)
            except FrameError as exc:
                batch.rejected.append(self._reject(tp, offset, frame, exc))
                continue
            call = await self.registry.call_for(frame.call_id, tp)
            if not self.registry.owns(tp):
                continue  # revoked while this batch waited: not consumed here, its next owner reads it
            if call is None or call.finishing:
                self.offsets.consumed(tp, offset, None)
                self.metrics.frames_dropped.labels("after_call_end").inc()
                continue
            try:
                self._check_against_leg(call, frame)
            except FrameError as exc:
                batch.rejected.append(self._reject(tp, offset, frame, exc))
                continue
            leg = self._consume(tp, offset, frame, call, batch.consumed_ms)
            tally = ReorderTally.of(leg)
            released = leg.push(frame.seq, frame.payload, frame.produced_at_ms)
            tally.count_since(leg, self.metrics)
            entry = touched.get((call.call_id, leg.leg))
            if entry is None:
                entry = touched[(call.call_id, leg.leg)] = (LegAudio(call, leg), [])
            entry[1].extend(released)
        self.metrics.frames.inc(len(owned))
        # Each leg's frames of the batch decoded and resampled together: one numpy call per leg, not per frame.
        for audio, released_frames in touched.values():
            audio.chunks = audio.leg.to_segmenter(released_frames)
        batch.legs = [audio for audio, _ in touched.values()]
        return batch

    def dead_letter_message(
        self, tp: TopicPartition, offset: int, key: bytes | None, raw: bytes, exc: BaseException,
        frame: AudioFrame | None = None,
    ) -> DeadLetter:
        """A reference to an input message that could not be processed (``frame``: it was decoded).
        Its offset stays uncommitted until ``dead_letter_delivered``: a crash before then must not lose it."""
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        self.offsets.consumed(tp, offset, dead_letter_holder(tp, offset))
        return message_dead_letter(tp, offset, key, raw, exc, self.settings.worker_id,
                                   self.settings.debug_raw_audio, frame)

    def dead_letter_delivered(self, tp: TopicPartition, offset: int) -> None:
        """The dead letter of the message at ``tp``/``offset`` is acknowledged by Kafka: it may be committed."""
        self.offsets.release(dead_letter_holder(tp, offset))

    def _check_against_leg(self, call: CallState, frame: AudioFrame) -> None:
        known = call.legs.get(frame.leg)
        if known is None:
            return  # the leg's first frame sets its format
        check_leg_format(frame, known.front_end.sample_rate, known.front_end.encoding)
        # A pause longer than the timeout closes the call; twice that is no pause, it is corrupt. Unless a
        # hold or secure pause the call announced (its events) spans it: either may last any length of time.
        next_seq = known.reorder.next_seq
        max_gap = int(2 * self.settings.call_inactivity_timeout_s * 1000 / known.frame_ms)
        if frame.seq - next_seq > max_gap:  # only then are the holds looked at: not on every frame
            max_gap += call.held_ms_between(next_seq * known.frame_ms, frame.seq * known.frame_ms) // known.frame_ms
        check_seq_jump(frame, next_seq, max_gap)

    def _consume(self, tp: TopicPartition, offset: int, frame: AudioFrame, call: CallState,
                 consumed_ms: int) -> LegState:
        """Record the frame as consumed by its call; its leg (opened on its first frame)."""
        self.offsets.consumed(tp, offset, call.call_id)
        self.clock.advance(tp, frame.produced_at_ms, consumed_ms)
        call.audio_tp = tp
        call.last_frame_produced_ms = max(call.last_frame_produced_ms, frame.produced_at_ms)
        if not call.first_frame_produced_ms or frame.produced_at_ms < call.first_frame_produced_ms:
            call.first_frame_produced_ms = frame.produced_at_ms  # where the post-call pass reads its audio from
        call.last_activity_ms = consumed_ms
        leg = call.legs.get(frame.leg)
        if leg is None:
            frame_ms = max(1, round(len(frame.payload) / bytes_per_ms(frame)))
            leg = call.legs[frame.leg] = LegState.open(
                call.call_id, frame.leg, self.front_ends(frame.sample_rate, frame.encoding), frame_ms,
                self.settings.max_segment_ms, self.settings.reorder_window_ms,
            )
        return leg

    def _reject(self, tp: TopicPartition, offset: int, frame: AudioFrame, exc: FrameError) -> RejectedFrame:
        # Held until its dead letter is delivered (dead_letter_message holds it under the same name).
        self.offsets.consumed(tp, offset, dead_letter_holder(tp, offset))
        return RejectedFrame(tp, offset, frame, exc)


def dead_letter_holder(tp: TopicPartition, offset: int) -> str:
    """The offset tracker's holder name of a message on its way to the dead-letter topic."""
    return f"dead letter {tp[0]}[{tp[1]}]@{offset}"
