"""What the worker keeps per call: its events, legs, analyzer, pending tasks and undelivered outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from pipeline.contracts.messages import CallEvent, Message, now_ms
from pipeline.qa.call import CallAnalyzer
from pipeline.worker.legs import LegState
from pipeline.worker.offsets import TopicPartition
from pipeline.worker.ports import OutputPort, Transcription

# A decoded segment the analyzer holds until earlier ones are known: what publishing it needs.
# (leg, start ms, end ms, result, consumed ms, closed ms): no audio, which is not needed any more.
DecodedSegment = tuple[LegState, int, int, Transcription, int, int]


@dataclass(eq=False)  # a state is itself (list.remove): by value, two states of one call would compare legs and audio arrays
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
    decoded: dict[str, DecodedSegment] = field(default_factory=dict)
    last_frame_produced_ms: int = 0  # producer time of the newest frame seen (stream time)
    first_frame_produced_ms: int = 0  # producer time of the oldest frame seen (0: none since it opened here)
    # Stream time of the audio partition when the call last took frames (0: not known): how long a call
    # that sends nothing at all has been quiet, for its legs' watermarks (release.py).
    partition_ms_at_audio: int = 0
    last_activity_ms: int = field(default_factory=now_ms)  # wall time of the last frame or event
    opened_at_ms: int = field(default_factory=now_ms)
    end_consumed_ms: int = 0
    end_offset: int = -1  # of the end event on the events partition (a checkpoint does not carry the end)
    started_at_ms: int = field(default_factory=now_ms)
    finishing: bool = False
    # A task of the call's failed (a bug, not bad input): its outputs may be incomplete, so it is never
    # released and its offsets are never committed; the worker reports itself unhealthy and exits.
    failed: bool = False
    # Checkpoints (pipeline/worker/checkpoints.py), per leg: the ids of its segments in the order they
    # were announced, the LegSnapshots waiting for them (oldest first; in a backlog many are taken before
    # the oldest is decoded), the ones last written, and the leg's audio position at its last snapshot.
    # The call's segments not yet emitted or skipped. (Any: checkpoints.py imports this module.)
    announced: dict[str, list[str]] = field(default_factory=dict)
    unresolved: set[str] = field(default_factory=set)
    leg_snapshots: dict[str, list[Any]] = field(default_factory=dict)
    durable_legs: dict[str, Any] = field(default_factory=dict)
    leg_snapshot_ms: dict[str, int] = field(default_factory=dict)
    end_reason: str = ""  # how it was closed (end, abort, timeout), once it is: its finished record says so
    # Holds (hold/resume call events): the ended ones as (start, end) on the call's clock; the open one's
    # start (None: not held); the producer time of the last resume, from which inactivity counts again.
    holds_ms: list[tuple[int, int]] = field(default_factory=list)
    held_from_ms: int | None = None
    resumed_at_ms: int = 0
    # Secure pauses (pause/unpause call events): the call's capture paused on purpose, its audio dropped at
    # the gateway. Kept as holds are, apart from them: QA leaves them out of talk and silence, not as holds.
    pauses_ms: list[tuple[int, int]] = field(default_factory=list)
    paused_from_ms: int | None = None
    # Exactly once (pipeline/broker/transactions.py): the outputs this call has published (final segment ids,
    # "qa" for its QA result), with those a checkpoint it resumed from listed; a replay publishes none of
    # them again. ``unrecorded``: some are not in a checkpoint record yet (the next commit writes one).
    published: set[str] = field(default_factory=set)
    unrecorded: bool = False
    # The leg snapshots of the newest checkpoint record sent (durable_legs once it is acknowledged): a record
    # of what was published repeats these, never older ones, which would undo a checkpoint whose hold on
    # the input has moved (its audio would then be skipped on a replay).
    recorded_legs: dict[str, Any] = field(default_factory=dict)

    def hold_intervals(self, call_end_ms: int) -> list[tuple[int, int]]:
        """The call's holds; one still open at the end lasts until ``call_end_ms``."""
        if self.held_from_ms is None:
            return list(self.holds_ms)
        return [*self.holds_ms, (self.held_from_ms, max(self.held_from_ms, call_end_ms))]

    def pause_intervals(self, call_end_ms: int) -> list[tuple[int, int]]:
        """The call's secure pauses; one still open at the end (never resumed) lasts until ``call_end_ms``."""
        if self.paused_from_ms is None:
            return list(self.pauses_ms)
        return [*self.pauses_ms, (self.paused_from_ms, max(self.paused_from_ms, call_end_ms))]

    def held_ms_between(self, from_ms: int, to_ms: int) -> int:
        """Call time in [from_ms, to_ms) that announced holds or secure pauses cover (no frames come in
        either); one still open (its resume not read yet: events and frames are separate topics) covers up
        to ``to_ms``."""
        return sum(max(0, min(end, to_ms) - max(start, from_ms))
                   for start, end in [*self.hold_intervals(to_ms), *self.pause_intervals(to_ms)])

    def frames_complete(self) -> bool:
        """The end event came and every leg has received (or holds) the frames it announced."""
        return self.end is not None and not self.frames_missing()

    def frames_missing(self) -> dict[str, int]:
        """Per leg, how many of the frames its end event announced have not come (none before the end
        event). A gap the jitter buffer filled with silence counts as come: a later seq showed it missing.
        So do the frames after a leg's last one that a secure pause (or hold) covers: the call ended while
        paused, and the gateway counts the time it dropped, as it counts a pause's seq jump."""
        counts = self.end.frame_counts if self.end is not None else {}
        missing: dict[str, int] = {}
        for name, n in counts.items():
            leg = self.legs.get(name)
            have = 0 if leg is None else leg.frames_released + leg.reorder.held
            if have < n and leg is not None and (self.pauses_ms or self.paused_from_ms is not None):
                have += self.held_ms_between(have * leg.frame_ms, n * leg.frame_ms) // leg.frame_ms
            if have < n:
                missing[name] = n - have
        return missing


def segment_id(call_id: str, leg: str, start_ms: int) -> str:
    """Derived from call, leg and start: a replayed call gets the same ids (deduplicated downstream)."""
    return f"{call_id}/{leg}/{start_ms:09d}"


def watermarks(call: CallState, pre_roll_ms: int, held_final_max_ms: int = 2000,
               quiet_ms: int = 0) -> dict[str, int]:
    """Per leg, the time (on the call's clock) before which all its segments have been submitted: the
    open segment's start, else what the VAD has heard less its pre-roll (a segment may start that far
    back).

    A leg that sends nothing (one-way media, silence suppression, a muted side) would hold the other
    legs' finals until its frames resume. So a leg between segments with no frames waiting in its jitter
    buffer is taken as silent up to the call's stream time less ``held_final_max_ms``. The call's stream
    time, for a leg: the newest audio its other legs' VADs have heard, or, when the whole call has sent
    nothing for ``quiet_ms`` of its audio partition's stream time, the newest audio of any leg plus that.
    Frames of the leg that come later still than that are stored, out of time order (release.py).
    """
    marks: dict[str, int] = {}
    heard: dict[str, int] = {}
    for name, leg in call.legs.items():
        segmenter = leg.front_end.segmenter
        open_start = segmenter.open_segment_start_ms
        heard[name] = segmenter.samples_received // 16
        marks[name] = heard[name] - pre_roll_ms - 100 if open_start is None else open_start
    call_now = max(heard.values(), default=0) + max(0, quiet_ms)
    for name, leg in call.legs.items():
        if leg.front_end.segmenter.open_segment_start_ms is not None or leg.reorder.held:
            continue  # a segment (or audio) of this leg may still start at its mark
        others = max((ms for other, ms in heard.items() if other != name), default=0)
        if quiet_ms > 0:
            others = max(others, call_now)
        marks[name] = max(marks[name], others - held_final_max_ms)
    return marks


async def publish(output: OutputPort, call: CallState, topic: str, key: str, message: Message | None) -> None:
    """Publish one of the call's messages (in its audio partition's transaction); its delivery is awaited
    before the call's offsets are released."""
    partition = call.audio_tp[1] if call.audio_tp is not None else -1  # set when it opens (-1: a test's call)
    call.deliveries.append(await output.publish(topic, key, message, partition))
