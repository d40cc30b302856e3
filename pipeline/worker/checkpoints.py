"""Call checkpoints: bounded replay after a crash or a rebalance.

A call's input offsets used to be held from its first frame until the call ended, so one hour-long call
meant an hour of its partition re-decoded by the next owner. Now, whenever every leg of a call is
between segments (``is_quiet``), the worker takes a ``PendingSnapshot``: each leg's audio path state
(jitter-buffer position, resampler input history, VAD state and pre-roll), and the segments announced
so far. Once those segments are decoded, published and stored, the snapshot becomes a ``CallCheckpoint``
on the compacted checkpoint topic, and the call's hold on its audio partition moves up to the first
offset the checkpoint does not cover. A new owner restores the call from it (``restore_call``) and
re-decodes at most the audio after it: one open segment per leg plus what a commit interval lets pass.

Restored legs produce the same segments, with the same ids, as the uninterrupted run (float rounding
aside: the resampler is rebuilt from its recent input), and the call's QA state is rebuilt from its
stored final segments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio.resample import ResamplerSnapshot
from pipeline.contracts.messages import (
    CallCheckpoint,
    CallEvent,
    CheckpointSegment,
    CheckpointStatus,
    LegCheckpoint,
)
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.segmentation.segmenter import SegmenterSnapshot
from pipeline.worker.legs import LegState
from pipeline.worker.state import CallState


class CheckpointStore(Protocol):
    """Where checkpoints live (the compacted topic in the worker; a dict in unit tests)."""

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        """The newest checkpoint of every call on audio partition ``partition``."""
        ...

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        """Write (None: delete) a call's checkpoint; returns an awaitable that resolves once durable."""
        ...


@dataclass(frozen=True)
class PendingSnapshot:
    """A call's state at a quiet moment, waiting for the segments before it to become durable."""

    legs: list[LegCheckpoint]
    announced: int  # how many of the call's segments had been announced (call.announced[:n])
    resume_offset: int  # first audio offset of the partition not consumed when it was taken
    audio_ms: int  # the call's audio position then (spacing snapshots in stream time)

    def resolved(self, call: CallState) -> bool:
        """Every segment announced before the snapshot is emitted or skipped."""
        return not any(sid in call.unresolved for sid in call.announced[: self.announced])


def is_quiet(call: CallState) -> bool:
    """Every leg between segments with no frame waiting in its jitter buffer: a snapshot is exact here."""
    return bool(call.legs) and all(
        not leg.finished and not leg.front_end.segmenter.in_speech and leg.reorder.held == 0
        for leg in call.legs.values()
    )


def audio_position_ms(call: CallState) -> int:
    return max((leg.frames_released * leg.frame_ms for leg in call.legs.values()), default=0)


def take_snapshot(call: CallState, resume_offset: int) -> PendingSnapshot:
    return PendingSnapshot([leg_checkpoint(leg) for leg in call.legs.values()], len(call.announced),
                           resume_offset, audio_position_ms(call))


def leg_checkpoint(leg: LegState) -> LegCheckpoint:
    resampler, segmenter = leg.front_end.snapshot()
    return LegCheckpoint(
        leg=leg.leg, sample_rate=leg.front_end.sample_rate, encoding=leg.front_end.encoding,
        frame_ms=leg.frame_ms, next_seq=leg.reorder.next_seq, frames_released=leg.frames_released,
        samples_in=resampler.samples_in, samples_out=resampler.samples_out,
        resampler_history=_f32(resampler.history), vad_state=_f32(segmenter.vad_state),
        vad_context=_f32(segmenter.vad_context), vad_pending=_f32(segmenter.vad_pending),
        windows_done=segmenter.windows_done, last_end=segmenter.last_end, emitted=segmenter.emitted,
        audio_start=segmenter.audio_start, audio=_f32(segmenter.audio),
    )


def call_checkpoint(call: CallState, status: CheckpointStatus, snapshot: PendingSnapshot | None = None,
                    end_reason: str = "") -> CallCheckpoint:
    """The record to store: ``snapshot``'s legs with the call's segments before it (open), or just the
    call's fate (finished), or, closed for inactivity, the legs as they are now."""
    checkpoint = CallCheckpoint(call.call_id, status, end_reason=end_reason)
    if status == "finished":
        return checkpoint
    start = call.start
    if start is not None:
        checkpoint.has_start, checkpoint.tenant, checkpoint.agent_id = True, start.tenant, start.agent_id
        checkpoint.queue, checkpoint.direction = start.queue, start.direction
    checkpoint.started_at_ms = call.started_at_ms
    assert call.analyzer is not None
    covered = set(call.announced[: snapshot.announced]) if snapshot is not None else None
    segments = [s for s in call.analyzer.segments if covered is None or s.segment_id in covered]
    checkpoint.segments = [CheckpointSegment(s.segment_id, s.leg, s.start_ms, s.end_ms, s.text) for s in segments]
    checkpoint.segments_done = len(segments)
    if snapshot is not None:
        checkpoint.legs, checkpoint.resume_offset = snapshot.legs, snapshot.resume_offset
    else:
        checkpoint.legs = [leg_checkpoint(leg) for leg in call.legs.values()]
    return checkpoint


def restore_call(checkpoint: CallCheckpoint, qa_config: QaConfig,
                 front_end: Callable[[int, str], LegFrontEnd], max_segment_ms: int,
                 reorder_window: int) -> CallState:
    """The call as it was at ``checkpoint``: legs resume where it was taken, QA state rebuilt."""
    call = CallState(checkpoint.call_id)
    if checkpoint.has_start:
        call.start = CallEvent(checkpoint.call_id, "start", at_ms=checkpoint.started_at_ms,
                               tenant=checkpoint.tenant, agent_id=checkpoint.agent_id, queue=checkpoint.queue,
                               direction=checkpoint.direction)  # type: ignore[arg-type]
    call.started_at_ms = checkpoint.started_at_ms
    call.analyzer = CallAnalyzer(call.call_id, qa_config)
    for s in checkpoint.segments:
        # Redaction context and rule state come back from the stored (already redacted) finals; their
        # live alerts were raised by the owner that decoded them.
        call.analyzer.process(Segment(call.call_id, s.leg, s.segment_id, s.start_ms, s.end_ms, s.text))  # type: ignore[arg-type]
    call.segments_done = checkpoint.segments_done
    call.announced = [s.segment_id for s in checkpoint.segments]
    for cp in checkpoint.legs:
        call.legs[cp.leg] = restore_leg(cp, call.call_id, front_end(cp.sample_rate, cp.encoding),
                                        max_segment_ms, reorder_window)
    return call


def restore_leg(cp: LegCheckpoint, call_id: str, front_end: LegFrontEnd, max_segment_ms: int,
                reorder_window: int) -> LegState:
    front_end.restore(
        ResamplerSnapshot(cp.samples_in, cp.samples_out, _arr(cp.resampler_history)),
        SegmenterSnapshot(_arr(cp.vad_state), _arr(cp.vad_context), _arr(cp.vad_pending), cp.windows_done,
                          cp.last_end, cp.emitted, cp.audio_start, _arr(cp.audio)),
    )
    leg = LegState.open(call_id, cp.leg, front_end, cp.frame_ms, max_segment_ms, reorder_window)
    leg.reorder.next_seq = leg.resumed_from_seq = cp.next_seq
    leg.frames_released = cp.frames_released
    return leg


class MemoryCheckpointStore:
    """Checkpoints in a dict: the store of unit tests and of a worker without Kafka."""

    def __init__(self) -> None:
        self.partitions: dict[int, dict[str, CallCheckpoint]] = {}

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        return dict(self.partitions.get(partition, {}))

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        held = self.partitions.setdefault(partition, {})
        if checkpoint is None:
            held.pop(call_id, None)
        else:
            held[call_id] = checkpoint
        return _done()


async def _done() -> None:
    return None


def _f32(a: np.ndarray) -> bytes:
    return np.asarray(a, dtype="<f4").tobytes()


def _arr(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<f4").astype(np.float32)
