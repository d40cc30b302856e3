"""Which input offsets may be committed while calls are open."""

from __future__ import annotations

from pipeline.worker.offsets import OffsetTracker

TP = ("audio", 0)


def test_open_calls_hold_the_commit_at_their_first_offset() -> None:
    t = OffsetTracker()
    t.consumed(TP, 10, "a")
    t.consumed(TP, 11, "b")
    t.consumed(TP, 12, "a")
    t.consumed(TP, 13, None)  # e.g. a dead letter: nobody holds it
    assert t.committable() == {TP: 10}
    t.release("a")
    assert t.committable() == {TP: 11}
    t.release("b")
    assert t.committable() == {TP: 14}


def test_commits_only_move_forward() -> None:
    t = OffsetTracker()
    t.consumed(TP, 5, None)
    t.committed(t.committable())
    assert t.committable() == {}
    t.consumed(TP, 6, "c")
    assert t.committable() == {}  # still 6 == one past what was committed before "c" arrived
    t.release("c")
    assert t.committable() == {TP: 7}


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    t.consumed(("audio", 0), 3, "a")
    t.consumed(("audio", 1), 8, None)
    t.consumed(("events", 0), 1, "a")
    assert t.committable() == {("audio", 0): 3, ("audio", 1): 9, ("events", 0): 1}
