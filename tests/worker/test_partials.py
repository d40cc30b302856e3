"""When a partial transcript of a leg's open segment is due."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.worker.legs import LegState
from pipeline.worker.partials import take_partial
from pipeline.worker.reorder import FrameReorderBuffer


@dataclass
class FakeSegmenter:
    open_segment_start_ms: int | None = None
    open_ms: int = 0
    open_segment_lead: int = 200 * 16  # the recogniser's lead before the start: heard, not timed

    @property
    def open_segment_ms(self) -> int | None:
        return None if self.open_segment_start_ms is None else self.open_ms

    def open_segment_audio(self) -> np.ndarray | None:
        if self.open_segment_start_ms is None:
            return None
        return np.ones(self.open_segment_lead + self.open_ms * 16, np.float32)


@dataclass
class FakeFrontEnd:
    segmenter: FakeSegmenter


def _leg() -> tuple[LegState, FakeSegmenter]:
    segmenter = FakeSegmenter()
    leg = LegState("c1", "agent", FakeFrontEnd(segmenter), 20, FrameReorderBuffer(4), 100)  # type: ignore[arg-type]
    return leg, segmenter


def test_a_partial_is_due_each_time_the_open_segment_grew_by_the_interval() -> None:
    leg, segmenter = _leg()
    assert take_partial(leg, 1000) is None  # no open segment
    segmenter.open_segment_start_ms, segmenter.open_ms = 2000, 999
    assert take_partial(leg, 1000) is None  # 1,199 ms of audio with the lead: its growth is counted from the start
    segmenter.open_ms = 1000
    due = take_partial(leg, 1000)
    assert due is not None and due[0] == 2000 and len(due[1]) == 16_000 + 200 * 16  # the lead is heard
    assert leg.partial_len_ms == 1000  # the partial's end: start + 1000 ms
    segmenter.open_ms = 1500
    assert take_partial(leg, 1000) is None  # one in flight per leg
    leg.partial_inflight = False
    assert take_partial(leg, 1000) is None  # grew by 500 ms only
    segmenter.open_ms = 2000
    assert take_partial(leg, 1000) is not None


def test_a_new_segment_counts_its_growth_from_its_own_start() -> None:
    leg, segmenter = _leg()
    segmenter.open_segment_start_ms, segmenter.open_ms = 0, 3000
    assert take_partial(leg, 1000) is not None
    leg.partial_inflight = False
    segmenter.open_segment_start_ms, segmenter.open_ms = 5000, 1000
    due = take_partial(leg, 1000)
    assert due is not None and due[0] == 5000

