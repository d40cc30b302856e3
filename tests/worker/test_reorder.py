"""The per-leg jitter buffer: duplicates, reordering, gaps and late frames."""

from __future__ import annotations

from pipeline.worker.reorder import FrameReorderBuffer


def seqs(frames) -> list[tuple[int, bool]]:  # type: ignore[no-untyped-def]
    """(seq, filled with silence) of every frame let out; a run of silence counts each frame it fills."""
    return [(f.seq + k, f.payload is None) for f in frames for k in range(f.frames)]


def test_in_order_frames_pass_straight_through() -> None:
    buf = FrameReorderBuffer(window=4)
    out = [f for s in range(6) for f in buf.push(s, bytes([s]))]
    assert seqs(out) == [(s, False) for s in range(6)]
    assert [f.payload for f in out] == [bytes([s]) for s in range(6)]


def test_reordered_frames_are_put_back_in_order() -> None:
    buf = FrameReorderBuffer(window=4)
    out = []
    for s in (0, 2, 1, 4, 3, 5):
        out += buf.push(s, bytes([s]))
    assert seqs(out) == [(s, False) for s in range(6)]
    assert buf.stats.gaps_filled == 0


def test_duplicates_are_dropped_and_counted() -> None:
    buf = FrameReorderBuffer(window=4)
    out = []
    for s in (0, 1, 1, 3, 3, 2, 0):
        out += buf.push(s, bytes([s]))
    assert seqs(out) == [(0, False), (1, False), (2, False), (3, False)]
    assert buf.stats.duplicates == 3


def test_a_gap_older_than_the_window_is_filled_with_silence_and_a_late_frame_is_counted() -> None:
    buf = FrameReorderBuffer(window=3)
    out = []
    for s in (0, 2, 3, 4, 5):
        out += buf.push(s, bytes([s]))
    assert seqs(out) == [(0, False), (1, True), (2, False), (3, False), (4, False), (5, False)]
    assert buf.stats.gaps_filled == 1
    assert buf.push(1, b"late") == []
    assert buf.stats.late == 1 and buf.stats.duplicates == 0


def test_flush_fills_missing_tail_frames_up_to_the_announced_count() -> None:
    buf = FrameReorderBuffer(window=10)
    out = []
    for s in (0, 1, 3):
        out += buf.push(s, bytes([s]))
    out += buf.flush(total_frames=6)
    assert seqs(out) == [(0, False), (1, False), (2, True), (3, False), (4, True), (5, True)]
    assert buf.stats.gaps_filled == 3


def test_a_long_gap_is_filled_as_one_run_every_missing_frame_counted() -> None:
    buf = FrameReorderBuffer(window=10)
    out = buf.push(0, b"a") + buf.push(60_001, b"b")  # a 20-minute hold: no frames at all
    # One run up to a window before the newest frame, which waits for the rest of the window.
    assert [(f.seq, f.payload, f.frames) for f in out] == [(0, b"a", 1), (1, None, 59_991)]
    assert buf.stats.gaps_filled == 59_991 and buf.held == 1
    out = buf.flush()
    assert [(f.seq, f.payload, f.frames) for f in out] == [(59_992, None, 9), (60_001, b"b", 1)]
    assert buf.stats.gaps_filled == 60_000
    # The last fills can still turn up late; the first ones are forgotten (counted as duplicates).
    assert buf.push(60_000, b"late") == [] and buf.stats.late == 1
    assert buf.push(1, b"old") == [] and buf.stats.duplicates == 1
