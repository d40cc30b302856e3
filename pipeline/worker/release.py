"""Analysis and release: a call's decoded segments go through its analyzer (redaction, QA rules) in time
order, both legs interleaved, whatever order their decodes finish in.

The analyzer holds a decoded segment until every segment announced before it is decoded or skipped and
each leg's watermark (state.watermarks: what its segmenter has heard) has passed its start, so no
earlier segment can still appear. What it releases goes to ``CallOutputs``, each segment with the
details of its own decoding, kept on the call (``CallState.decoded``) until then.

A leg that sends nothing does not hold the others for more than ``CALLQA_HELD_FINAL_MAX_MS`` of stream
time (state.watermarks): stream time is what the call's other legs have heard, or, while the whole call
sends nothing, its audio partition's stream clock (clock.py) since its last frames. A leg whose frames
come later still may then give a segment that starts before ones already released: it is released and
stored all the same, redacted with the context before it in time (not the context after it, which went
out already), its live alerts raised late; the call's final QA is computed in time order at its end
(``CallAnalyzer.finalize``), so it does not depend on the order of release.
"""

from __future__ import annotations

from pipeline.config import Settings
from pipeline.qa.call import AnalyzedSegment
from pipeline.qa.segment import Segment
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.clock import StreamClock
from pipeline.worker.state import CallState, DecodedSegment, watermarks
from pipeline.worker.tasks import CallTasks


class ReleaseGate:
    """Hands decoded and skipped segments to the call's analyzer and emits what it releases."""

    def __init__(self, settings: Settings, outputs: CallOutputs, tasks: CallTasks,
                 clock: StreamClock | None = None) -> None:
        self.settings = settings
        self.outputs = outputs
        self.tasks = tasks
        # The audio partitions' stream time, for calls that send nothing at all (None: not known; then
        # only the call's other legs move a silent leg's watermark). CallLifecycle sets it otherwise.
        self.clock = clock

    def watermarks(self, call: CallState) -> dict[str, int]:
        return watermarks(call, self.settings.pre_roll_ms, self.settings.held_final_max_ms, self.quiet_ms(call))

    def quiet_ms(self, call: CallState) -> int:
        """Stream time of the call's audio partition since the call last took frames (0: not known)."""
        if self.clock is None or call.audio_tp is None or not call.partition_ms_at_audio:
            return 0
        return max(0, self.clock.now(call.audio_tp) - call.partition_ms_at_audio)

    async def complete(self, call: CallState, seg_id: str, decoded: DecodedSegment, text: str) -> None:
        """A segment decoded to ``text``: released once nothing earlier is pending."""
        assert call.analyzer is not None
        call.decoded[seg_id] = decoded
        leg, start_ms, end_ms = decoded[0], decoded[1], decoded[2]
        segment = Segment(call.call_id, leg.leg, seg_id, start_ms, end_ms, text)  # type: ignore[arg-type]
        await self.emit(call, call.analyzer.complete(segment, self.watermarks(call)))

    async def skip(self, call: CallState, seg_id: str) -> None:
        """A segment that yields no text (silence, failed decoding): it no longer holds later ones."""
        assert call.analyzer is not None
        call.unresolved.discard(seg_id)
        await self.emit(call, call.analyzer.skip(seg_id, self.watermarks(call)))

    def release_moved_on(self, call: CallState) -> None:
        """After the call's legs took audio: a decoded segment held only for the other leg's VAD to pass
        its start goes out now, not at the call's next decoded segment (as a task of the call's, so the
        call completes only after it, and a failure stays with the call, not the batch)."""
        if self.clock is not None and call.audio_tp is not None:
            # Where the partition's stream time stood when the call last took frames (at most a batch late:
            # a call that goes quiet is taken as quiet a little later, never earlier).
            call.partition_ms_at_audio = self.clock.now(call.audio_tp)
        self.release_held(call)

    def release_held(self, call: CallState) -> None:
        """What the watermarks let through now (also on the lifecycle's timer: a call that sends nothing
        at all has no frames to move it on)."""
        if call.decoded and not call.finishing and call.analyzer is not None:
            # Released now (the watermarks as they are): the task only emits them.
            released = call.analyzer.release(self.watermarks(call))
            if released:
                self.tasks.spawn(call, self.emit(call, released), "emit")

    async def flush(self, call: CallState) -> None:
        """At the call's end, after all its decodes: every decoded segment still held."""
        assert call.analyzer is not None
        await self.emit(call, call.analyzer.flush())

    async def emit(self, call: CallState, released: list[AnalyzedSegment]) -> None:
        """Publish released segments (in time order), each with its own decoding's details."""
        for analyzed in released:
            decoded = call.decoded.pop(analyzed.redacted.segment.segment_id)
            await self.outputs.segment(call, decoded, analyzed)
