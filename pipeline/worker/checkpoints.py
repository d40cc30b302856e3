"""Call checkpoints: bounded replay after a crash or a rebalance.

A call's input offsets used to be held from its first frame until the call ended, so one hour-long call
meant an hour of its partition re-decoded by the next owner. Now, whenever a leg is between segments
(``leg_is_quiet``), the worker takes a ``LegSnapshot`` of it: its audio path state (jitter-buffer
position, resampler input history, VAD state and pre-roll) and how many of its segments were announced.
Legs are snapshotted apart, because in a conversation one leg is often mid-segment while the other is
quiet. Once a leg's segments before its snapshot are decoded, published and stored, the snapshot can go
into a ``CallCheckpoint`` (every leg from its newest such snapshot) on the compacted checkpoint topic,
and the call's hold on its audio partition moves up to the lowest offset those snapshots still need.
A new owner restores the call from it (``restore_call``); each leg skips the frames its snapshot covers
and re-decodes at most the audio after it: one open segment plus what a commit interval lets pass.

Restored legs produce the same segments, with the same ids, as the uninterrupted run (float rounding
aside: the resampler is rebuilt from its recent input), and the call's QA state is rebuilt from its
stored final segments. A leg goes on at the VAD rate its snapshot was taken at (16 kHz, or an 8 kHz leg's
own rate: ``LegFrontEnd.restore``), whatever ``vad_sample_rate`` the restoring worker has.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio.dtmf import KeypadSnapshot
from pipeline.audio.resample import ResamplerSnapshot
from pipeline.contracts.messages import (
    CallCheckpoint,
    CallEvent,
    CheckpointSegment,
    CheckpointStatus,
    HoldSpan,
    LegCheckpoint,
)
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.exchange import ValueDigest
from pipeline.qa.redaction import RedactionMemory, segment_order
from pipeline.qa.segment import Segment
from pipeline.segmentation.segmenter import SegmenterSnapshot
from pipeline.worker.legs import LegState
from pipeline.worker.state import CallState

log = logging.getLogger(__name__)


class CheckpointStore(Protocol):
    """Where checkpoints live (the compacted topic in the worker; a dict in unit tests)."""

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        """The newest checkpoint of every call on audio partition ``partition``."""
        ...

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        """Write (None: delete) a call's checkpoint; returns an awaitable that resolves once durable."""
        ...


@dataclass(frozen=True)
class LegSnapshot:
    """One leg's audio path at a quiet moment, waiting for that leg's segments before it to be durable."""

    state: LegCheckpoint
    announced: int  # how many of the leg's segments had been announced (call.announced[leg][:n])
    resume_offset: int  # first audio offset of the partition not consumed when it was taken
    audio_ms: int  # the leg's audio position then (spacing snapshots in stream time)

    def resolved(self, call: CallState) -> bool:
        """Every segment of the leg announced before the snapshot is emitted or skipped."""
        return not any(sid in call.unresolved for sid in call.announced.get(self.state.leg, [])[: self.announced])


def leg_is_quiet(leg: LegState) -> bool:
    """Between segments with no frame waiting in its jitter buffer: a snapshot is exact here."""
    return not leg.finished and not leg.front_end.segmenter.in_speech and leg.reorder.held == 0


def leg_position_ms(leg: LegState) -> int:
    return leg.frames_released * leg.frame_ms


def take_leg_snapshot(call: CallState, leg: LegState, resume_offset: int) -> LegSnapshot:
    return LegSnapshot(leg_checkpoint(leg), len(call.announced.get(leg.leg, [])), resume_offset, leg_position_ms(leg))


def due_checkpoint(call: CallState) -> dict[str, LegSnapshot] | None:
    """Per leg, the snapshot a new checkpoint would resume it from: its newest resolved one, else the one
    already written. None unless some leg moves forward and every leg of the call has one (a leg without
    any may hold frames from before the others' snapshots)."""
    chosen: dict[str, LegSnapshot] = {}
    moved = False
    for name in call.legs:
        newest = next((snap for snap in reversed(call.leg_snapshots.get(name, [])) if snap.resolved(call)), None)
        if newest is not None:
            chosen[name], moved = newest, True
        elif name in call.durable_legs:
            chosen[name] = call.durable_legs[name]
        else:
            return None
    return chosen if moved else None


def checkpoint_written(call: CallState, legs: dict[str, LegSnapshot]) -> None:
    """``legs`` are durable: later checkpoints start from them, older pending snapshots are dropped."""
    call.durable_legs.update(legs)
    for name, snap in legs.items():
        call.leg_snapshots[name] = [s for s in call.leg_snapshots.get(name, []) if s.audio_ms > snap.audio_ms]


def leg_checkpoint(leg: LegState) -> LegCheckpoint:
    resampler, segmenter, keypad = leg.front_end.snapshot()
    checkpoint = LegCheckpoint(
        leg=leg.leg, sample_rate=leg.front_end.sample_rate, encoding=leg.front_end.encoding,
        frame_ms=leg.frame_ms, next_seq=leg.reorder.next_seq, frames_released=leg.frames_released,
        samples_in=resampler.samples_in, samples_out=resampler.samples_out,
        resampler_history=_f32(resampler.history), vad_state=_f32(segmenter.vad_state),
        vad_context=_f32(segmenter.vad_context), vad_pending=_f32(segmenter.vad_pending),
        windows_done=segmenter.windows_done, last_end=segmenter.last_end, emitted=segmenter.emitted,
        audio_start=segmenter.audio_start, audio=_f32(segmenter.audio),
    )
    # The keypad detector holds back the samples it has not decided on: they are past the resampler's
    # count but before next_seq, so without them a resumed leg would lose them and its clock would slip.
    if keypad is not None:
        checkpoint.keypad_released, checkpoint.keypad_rescan = keypad.released, keypad.rescan
        checkpoint.keypad_audio = _f32(keypad.audio)
        checkpoint.keypad_spans = [v for span in keypad.spans for v in span]
    return checkpoint


def call_checkpoint(call: CallState, status: CheckpointStatus, legs: dict[str, LegSnapshot] | None = None,
                    end_reason: str = "") -> CallCheckpoint:
    """The record to store: each leg from its snapshot in ``legs`` (None: the legs as they are now), with
    the segments before them (open); or just the call's fate (finished)."""
    checkpoint = CallCheckpoint(call.call_id, status, end_reason=end_reason)
    if status == "finished":
        return checkpoint
    start = call.start
    if start is not None:
        checkpoint.has_start, checkpoint.tenant, checkpoint.agent_id = True, start.tenant, start.agent_id
        checkpoint.queue, checkpoint.direction = start.queue, start.direction
    checkpoint.started_at_ms = call.started_at_ms
    # Holds: their events are behind the commit once this is durable, so the call's hold time rides here.
    checkpoint.holds = [HoldSpan(start, end) for start, end in call.holds_ms]
    checkpoint.held_from_ms = -1 if call.held_from_ms is None else call.held_from_ms
    checkpoint.resumed_at_ms = call.resumed_at_ms
    checkpoint.pauses = [HoldSpan(start, end) for start, end in call.pauses_ms]
    checkpoint.paused_from_ms = -1 if call.paused_from_ms is None else call.paused_from_ms
    assert call.analyzer is not None
    covered = None if legs is None else {
        sid for name, snap in legs.items() for sid in call.announced.get(name, [])[: snap.announced]
    }
    segments = [s for s in call.analyzer.segments if covered is None or s.segment_id in covered]
    checkpoint.segments = [CheckpointSegment(s.segment_id, s.leg, s.start_ms, s.end_ms, s.text) for s in segments]
    checkpoint.segments_done = len(segments)
    # As of the last segment kept here (in time order), not of those after: the resumed call decodes those again.
    memory = call.analyzer.redaction_memory(max(segments, key=segment_order) if segments else None) if (
        covered is None or segments) else RedactionMemory()
    checkpoint.card_given, checkpoint.said_values = memory.card_given, [v.encoded() for v in memory.said]
    if legs is not None:
        checkpoint.legs = [snap.state for snap in legs.values()]
        # No leg snapshot yet ({}): the call replays from its first frame; the record carries what it published.
        checkpoint.resume_offset = min((snap.resume_offset for snap in legs.values()), default=-1)
    else:
        checkpoint.legs = [leg_checkpoint(leg) for leg in call.legs.values()]
    # What a replay from here would publish again: the segments after the snapshots (and the QA result).
    checkpoint.published = sorted(call.published - {s.segment_id for s in segments})
    return checkpoint


def published_record(call: CallState) -> CallCheckpoint:
    """The call's newest checkpoint record again (its leg snapshots, sent if not yet acknowledged; none
    yet: a replay from its first frame), with what it has published since: written in the transaction
    that commits those outputs."""
    return call_checkpoint(call, "open", dict(call.recorded_legs or call.durable_legs))


def restore_call(checkpoint: CallCheckpoint, qa_config: QaConfig,
                 front_end: Callable[[int, str], LegFrontEnd], max_segment_ms: int,
                 reorder_window_ms: int) -> CallState:
    """The call as it was at ``checkpoint``: legs resume where it was taken, QA state rebuilt."""
    call = CallState(checkpoint.call_id)
    if checkpoint.has_start:
        call.start = CallEvent(checkpoint.call_id, "start", at_ms=checkpoint.started_at_ms,
                               tenant=checkpoint.tenant, agent_id=checkpoint.agent_id, queue=checkpoint.queue,
                               direction=checkpoint.direction)  # type: ignore[arg-type]
    call.started_at_ms = checkpoint.started_at_ms
    call.holds_ms = [(h.start_ms, h.end_ms) for h in checkpoint.holds]
    call.held_from_ms = None if checkpoint.held_from_ms < 0 else checkpoint.held_from_ms
    call.resumed_at_ms = checkpoint.resumed_at_ms
    call.pauses_ms = [(h.start_ms, h.end_ms) for h in checkpoint.pauses]
    call.paused_from_ms = None if checkpoint.paused_from_ms < 0 else checkpoint.paused_from_ms
    call.published = set(checkpoint.published)
    call.analyzer = CallAnalyzer(call.call_id, qa_config)
    for s in checkpoint.segments:
        # Redaction context and rule state come back from the stored (already redacted) finals; their
        # live alerts were raised by the owner that decoded them.
        call.analyzer.process(Segment(call.call_id, s.leg, s.segment_id, s.start_ms, s.end_ms, s.text))  # type: ignore[arg-type]
    call.analyzer.restore_redaction(memory_of(checkpoint))
    call.segments_done = checkpoint.segments_done
    for seg in checkpoint.segments:
        call.announced.setdefault(seg.leg, []).append(seg.segment_id)
    for cp in checkpoint.legs:
        leg = call.legs[cp.leg] = restore_leg(cp, call.call_id, front_end(cp.sample_rate, cp.encoding),
                                              max_segment_ms, reorder_window_ms)
        # What the next checkpoint keeps for a leg that has not moved on to a newer snapshot by then.
        call.durable_legs[cp.leg] = LegSnapshot(cp, len(call.announced.get(cp.leg, [])), checkpoint.resume_offset,
                                                leg_position_ms(leg))
        call.leg_snapshot_ms[cp.leg] = leg_position_ms(leg)
    return call


def restore_leg(cp: LegCheckpoint, call_id: str, front_end: LegFrontEnd, max_segment_ms: int,
                reorder_window_ms: int) -> LegState:
    keypad = None
    if cp.keypad_released >= 0:
        spans = tuple(zip(cp.keypad_spans[::2], cp.keypad_spans[1::2], strict=True))
        keypad = KeypadSnapshot(cp.keypad_released, cp.keypad_rescan, _arr(cp.keypad_audio), spans)
    front_end.restore(
        ResamplerSnapshot(cp.samples_in, cp.samples_out, _arr(cp.resampler_history)),
        SegmenterSnapshot(_arr(cp.vad_state), _arr(cp.vad_context), _arr(cp.vad_pending), cp.windows_done,
                          cp.last_end, cp.emitted, cp.audio_start, _arr(cp.audio)),
        keypad,
    )
    leg = LegState.open(call_id, cp.leg, front_end, cp.frame_ms, max_segment_ms, reorder_window_ms)
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


def memory_of(checkpoint: CallCheckpoint) -> RedactionMemory:
    """The redaction memory a checkpoint carries. A value digest that does not read is left out, with a
    warning: the rest of the checkpoint is sound, and without it only that value's read-back goes by."""
    said = []
    for text in checkpoint.said_values:
        try:
            said.append(ValueDigest.decoded(text))
        except ValueError as exc:
            log.warning("call %s: checkpoint value digest left out: %s", checkpoint.call_id, exc)
    return RedactionMemory(checkpoint.card_given, tuple(said))

