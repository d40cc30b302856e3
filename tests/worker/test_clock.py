"""When a call closes: judged in stream time, so a backlog does not close calls early."""

from __future__ import annotations

from pipeline.contracts.messages import CallEvent
from pipeline.worker.clock import StreamClock, close_reason
from pipeline.worker.state import CallState

T0 = 1_000_000
TIMEOUT_MS = 30_000.0
GRACE_MS = 2_000


def _call(last_frame_ms: int = T0, end: str | None = None, end_at_ms: int = T0) -> CallState:
    call = CallState("c1", last_frame_produced_ms=last_frame_ms, last_activity_ms=T0, opened_at_ms=T0,
                     end_consumed_ms=T0)
    if end is not None:
        call.end = CallEvent("c1", end, at_ms=end_at_ms)  # type: ignore[arg-type]
    return call


def test_stream_clock_keeps_the_newest_producer_time_per_partition() -> None:
    clock = StreamClock()
    clock.advance(("audio", 0), 500)
    clock.advance(("audio", 0), 400)  # an older frame read later: time does not go back
    clock.advance(("audio", 1), 900)
    assert (clock.now(("audio", 0)), clock.now(("audio", 1)), clock.now(("audio", 2))) == (500, 900, 0)


def test_caught_up_an_end_event_closes_the_call_after_its_grace_in_wall_time() -> None:
    call = _call(end="end")
    assert close_reason(call, 0, T0, T0 + GRACE_MS - 1, TIMEOUT_MS, GRACE_MS) is None
    assert close_reason(call, 0, T0, T0 + GRACE_MS, TIMEOUT_MS, GRACE_MS) == "end"


def test_behind_an_end_event_waits_for_stream_time_not_wall_time() -> None:
    call = _call(end="abort")
    # The wall clock is minutes on, but the partition's audio has only reached the end event.
    assert close_reason(call, 50, T0 + GRACE_MS - 1, T0 + 200_000, TIMEOUT_MS, GRACE_MS) is None
    assert close_reason(call, 50, T0 + GRACE_MS, T0 + 200_000, TIMEOUT_MS, GRACE_MS) == "abort"


def test_a_quiet_call_times_out_in_stream_time() -> None:
    call = _call()
    assert close_reason(call, 5, T0 + 29_999, T0 + 29_999, TIMEOUT_MS, GRACE_MS) is None
    assert close_reason(call, 5, T0 + 30_000, T0 + 30_000, TIMEOUT_MS, GRACE_MS) == "timeout"
    # Caught up, the wall clock stands in for stream time.
    assert close_reason(call, 0, 0, T0 + 30_000, TIMEOUT_MS, GRACE_MS) == "timeout"


def test_a_backlog_does_not_time_out_a_call_whose_frames_are_queued() -> None:
    call = _call()
    assert close_reason(call, 10_000, T0 + 1_000, T0 + 120_000, TIMEOUT_MS, GRACE_MS) is None


def test_an_unknown_position_still_closes_a_call_after_ten_timeouts_of_wall_time() -> None:
    call = _call()
    assert close_reason(call, -1, 0, T0 + 10 * 30_000 - 1, TIMEOUT_MS, GRACE_MS) is None
    assert close_reason(call, -1, 0, T0 + 10 * 30_000, TIMEOUT_MS, GRACE_MS) == "timeout"


def test_a_momentary_zero_lag_while_frames_still_flow_does_not_close_the_call() -> None:
    """In a backlog the end event is read long before the call's last frames, and the consumer's lag reads
    0 whenever the fetched records are all processed: only a partition quiet for the grace is caught up."""
    call = _call(end="end", end_at_ms=T0 + 600_000)  # a 10-minute call replayed fast: the end came first
    wall = T0 + 60_000
    assert close_reason(call, 0, T0 + 1_000, wall, TIMEOUT_MS, GRACE_MS, partition_idle_ms=40) is None
    assert close_reason(call, 0, T0 + 1_000, wall, TIMEOUT_MS, GRACE_MS, partition_idle_ms=GRACE_MS) == "end"


def test_stream_clock_says_how_long_a_partition_gave_nothing() -> None:
    clock = StreamClock()
    clock.advance(("audio", 0), 500, consumed_at_ms=T0)
    assert clock.idle_ms(("audio", 0), T0 + 700) == 700
    assert clock.idle_ms(("audio", 1), T0) >= T0  # never consumed: idle since forever
