"""Stream time, and the decision to close a call: judged in stream time, so a backlog does not close
calls early (after a backlog the worker reads old audio fast, and a wall clock would close calls whose
frames are merely queued behind other calls' frames)."""

from __future__ import annotations

from pipeline.worker.offsets import TopicPartition
from pipeline.worker.state import CallState


class StreamClock:
    """Stream time per audio partition: the newest producer timestamp consumed from it; and when (wall
    time) a frame of it was last consumed."""

    def __init__(self) -> None:
        self._produced: dict[TopicPartition, int] = {}
        self._consumed_at: dict[TopicPartition, int] = {}

    def advance(self, tp: TopicPartition, produced_at_ms: int, consumed_at_ms: int = 0) -> None:
        self._produced[tp] = max(self._produced.get(tp, 0), produced_at_ms)
        self._consumed_at[tp] = max(self._consumed_at.get(tp, 0), consumed_at_ms)

    def now(self, tp: TopicPartition) -> int:
        return self._produced.get(tp, 0)

    def idle_ms(self, tp: TopicPartition, wall_ms: int) -> int:
        """Wall time since a frame of ``tp`` was last consumed (large when none ever was)."""
        return wall_ms - self._consumed_at.get(tp, 0)

    def forget(self, tps: set[TopicPartition]) -> None:
        """Partitions no longer assigned: their stream time starts afresh if they come back."""
        for tp in tps:
            self._produced.pop(tp, None)
            self._consumed_at.pop(tp, None)


def close_reason(call: CallState, lag: int, partition_now_ms: int, wall_ms: int, timeout_ms: float,
                 grace_ms: int, partition_idle_ms: int | None = None, end_wait_ms: float = 30_000.0) -> str | None:
    """How the call should be closed now ("end", "abort", "timeout"), or None to keep it open.

    ``lag``: messages not yet consumed on the call's audio partition (-1 unknown); ``partition_now_ms``:
    that partition's stream time (``StreamClock.now``); ``partition_idle_ms``: wall time since a frame of
    it was consumed (None: not known, then ``lag`` alone decides); ``end_wait_ms``: how long after its
    end event a call whose announced frames have not all come waits for them, once nothing is left to read.
    """
    # A lag of 0 alone is not enough: the consumer's high-water mark is the one of its last fetch, so in a
    # backlog it reads 0 for a moment whenever the fetched records are all processed. Caught up also
    # means the partition gave nothing for a grace period (else a long call's tail would be cut off).
    caught_up = lag == 0 and (partition_idle_ms is None or partition_idle_ms >= grace_ms)
    # Caught up, the wall clock is stream time; behind, the partition's newest producer time is.
    stream_now = wall_ms if caught_up else partition_now_ms
    if call.end is not None and end_due(call, lag, caught_up, stream_now, wall_ms, grace_ms, end_wait_ms):
        return call.end.event_type
    # A held (or securely paused) call sends no frames by design: inactivity is not judged while it is held,
    # and counts from the hold's end after it (the last-resort rule below still bounds a hold whose resume
    # never comes).
    last = max(call.last_frame_produced_ms or call.opened_at_ms, call.resumed_at_ms)
    if call.held_from_ms is None and call.paused_from_ms is None and stream_now - last >= timeout_ms:
        return "timeout"
    # Last resort for a partition whose position is unknown: a call cannot stay open forever.
    if wall_ms - call.last_activity_ms >= 10 * timeout_ms:
        return "timeout"
    return None


def end_due(call: CallState, lag: int, caught_up: bool, stream_now: int, wall_ms: int, grace_ms: int,
            end_wait_ms: float) -> bool:
    """Whether a call whose end event came may close now (``stream_now`` as in ``close_reason``).

    With every frame the end event announced, after its grace (where they came after the event, the
    call closed at once: lifecycle.py). Without them, the call waits ``end_wait_ms`` for them: while
    messages are still unread, of the partition's stream time past the end; with none unread (a frame
    not yet in Kafka, or not yet fetched, looks the same as a lost one), of wall time after the end
    event was read (a call lost its last seconds so, 2 s after its end event).

    Behind, the grace alone is not enough: Kafka keeps a partition in order per producer only. After a
    broker restart, producers that reconnected sooner (other calls, another gateway) append frames
    produced after this call's end while its last frames, produced before it, still wait in their own
    producer's queue; closing at end + grace of such stream time lost a call's last two finals so.
    """
    assert call.end is not None
    past_end = stream_now >= call.end.at_ms + grace_ms
    if call.frames_complete():
        return past_end or (caught_up and wall_ms - call.end_consumed_ms >= grace_ms)
    wait_ms = max(grace_ms, end_wait_ms)
    if lag != 0:
        return stream_now >= call.end.at_ms + wait_ms
    return past_end and wall_ms - call.end_consumed_ms >= wait_ms
