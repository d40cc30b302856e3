"""Batch ordering: which waiting segments the next batch takes. Pure and deterministic:
`take_batch` reads only each segment's arrival time and window bucket and the `now` it is given; the
collector's own order is checked through a recognizer that records its batches."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from pipeline.asr.batcher import SegmentBatcher, take_batch
from pipeline.asr.results import AudioSegment, SegmentTimings, TranscriptResult
from pipeline.config import Settings


@dataclass
class Seg:
    name: str
    enqueued: float  # s
    bucket: int  # window frames


def names(segments: list[Seg]) -> list[str]:
    return [s.name for s in segments]


# Arrival order: a long turn first, then short replies, one medium, another long.
QUEUE = [
    Seg("long1", 0.00, 1500), Seg("short1", 0.10, 500), Seg("mid", 0.20, 1000),
    Seg("short2", 0.30, 500), Seg("long2", 0.40, 1500), Seg("short3", 0.50, 500),
]


def test_oldest_takes_the_oldest_bucket_first_then_by_age() -> None:
    batch, rest = take_batch(QUEUE, 3, "oldest", 1.0, now=0.6)
    assert names(batch) == ["long1", "long2", "short1"]
    assert names(rest) == ["mid", "short2", "short3"]


def test_shortest_takes_short_windows_first_and_by_age_within_a_bucket() -> None:
    batch, rest = take_batch(QUEUE, 4, "shortest", 1.0, now=0.6)
    assert names(batch) == ["short1", "short2", "short3", "mid"]
    assert names(rest) == ["long1", "long2"]  # what waits keeps its arrival order


def test_shortest_lets_a_segment_past_the_age_limit_go_first() -> None:
    # At 1.15 s long1 (1.15 s) and short1 (1.05 s) have waited past 1 s: they go first, oldest first.
    batch, rest = take_batch(QUEUE, 3, "shortest", 1.0, now=1.15)
    assert names(batch) == ["long1", "short1", "short2"]
    assert names(rest) == ["mid", "long2", "short3"]


def test_shortest_with_age_limit_zero_is_first_come_first_served() -> None:
    batch, rest = take_batch(QUEUE, 4, "shortest", 0.0, now=0.6)
    assert names(batch) == ["long1", "short1", "mid", "short2"]
    assert names(rest) == ["long2", "short3"]


def test_a_long_turn_is_not_starved_while_short_ones_keep_arriving() -> None:
    """Under a stream of short replies that always fills the batch, the long turn goes once it has
    waited the age limit: within ceil(limit / batch interval) + 1 batches."""
    queue = [Seg("long", 0.0, 1500)]
    arrivals = iter(range(1000))
    now, taken_at = 0.0, None
    for batch_no in range(20):
        queue += [Seg(f"s{next(arrivals)}", now, 500) for _ in range(4)]  # 4 new replies per batch
        batch, queue = take_batch(queue, 4, "shortest", 1.0, now)
        if "long" in names(batch):
            taken_at = batch_no
            break
        now += 0.3  # a batch every 0.3 s
    assert taken_at == 4  # at 1.2 s, the first batch after it has waited 1 s


def test_everything_is_taken_exactly_once() -> None:
    rng = np.random.default_rng(7)
    queue = [Seg(str(i), float(t), int(b)) for i, (t, b) in
             enumerate(zip(np.sort(rng.uniform(0, 2, 40)), rng.choice([500, 1000, 1500, 3000], 40), strict=True))]
    for order in ("oldest", "shortest"):
        left, seen = list(queue), []
        while left:
            batch, left = take_batch(left, 16, order, 1.0, now=1.5)
            assert 0 < len(batch) <= 16
            seen += names(batch)
        assert sorted(seen) == sorted(names(queue))


def test_one_window_keeps_a_batch_to_its_first_segments_bucket() -> None:
    batch, rest = take_batch(QUEUE, 4, "shortest", 1.0, now=0.6, one_window=True)
    assert names(batch) == ["short1", "short2", "short3"]  # mid (1000) is not padded beside them
    assert names(rest) == ["long1", "mid", "long2"]
    batch, rest = take_batch(QUEUE, 4, "oldest", 1.0, now=0.6, one_window=True)
    assert names(batch) == ["long1", "long2"]
    assert names(rest) == ["short1", "mid", "short2", "short3"]
    # past the age limit, the oldest goes first and sets the bucket
    batch, _ = take_batch(QUEUE, 4, "shortest", 1.0, now=1.15, one_window=True)
    assert names(batch) == ["long1", "long2"]


def test_one_window_takes_everything_exactly_once_in_bucket_pure_batches() -> None:
    rng = np.random.default_rng(11)
    queue = [Seg(str(i), float(t), int(b)) for i, (t, b) in
             enumerate(zip(np.sort(rng.uniform(0, 2, 40)), rng.choice([500, 1000, 1500], 40), strict=True))]
    for order in ("oldest", "shortest"):
        left, seen = list(queue), []
        while left:
            batch, left = take_batch(left, 16, order, 1.0, now=1.5, one_window=True)
            assert 0 < len(batch) <= 16 and len({s.bucket for s in batch}) == 1
            seen += names(batch)
        assert sorted(seen) == sorted(names(queue))


def test_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown batch order"):
        take_batch(QUEUE, 2, "random", 1.0, 0.0)


def test_settings_default_and_old_order_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().batch_order, Settings().batch_one_window) == ("shortest", True)
    monkeypatch.setenv("CALLQA_BATCH_ORDER", "oldest")
    monkeypatch.setenv("CALLQA_BATCH_AGE_LIMIT_MS", "250")
    settings = Settings()
    assert (settings.batch_order, settings.batch_age_limit_ms) == ("oldest", 250.0)
    monkeypatch.setenv("CALLQA_BATCH_ONE_WINDOW", "false")
    assert Settings().batch_one_window is False


class RecordingRecognizer:
    """Records each batch's segments (by length); the first batch blocks until released, so the
    others queue up behind it and the collector's ordering decides what goes next."""

    name, version = "recording", 1

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()

    def recognize(self, segments: Sequence[AudioSegment], waits: Sequence[float] | None = None,
                  wide: bool = False, on_result: Any = None, contexts: Any = None) -> list[TranscriptResult]:
        self.batches.append([s.end_ms - s.start_ms for s in segments])
        if len(self.batches) == 1:
            self.release.wait(10)
        return [TranscriptResult(s.start_ms, s.end_ms, "", 0.0, 0.0, "recording", 1, (), SegmentTimings())
                for s in segments]


class SecondsWindow:
    """One window bucket per whole second of audio, so the bucket orders segments by length."""

    def window_frames(self, frames: int) -> int:
        return (frames // 100 + 1) * 100


@pytest.mark.parametrize(("order", "one_window", "expected"), [
    ("shortest", False, [[1000, 1000], [3000, 8000]]),
    ("oldest", False, [[8000, 3000], [1000, 1000]]),
    ("shortest", True, [[1000, 1000], [3000], [8000]]),
    ("oldest", True, [[8000], [3000], [1000, 1000]]),
])
async def test_the_collector_takes_batches_in_the_configured_order(
    order: str, one_window: bool, expected: list[list[int]],
) -> None:
    recognizer = RecordingRecognizer()
    batcher = SegmentBatcher(recognizer, window=SecondsWindow(), max_batch=2, max_wait_ms=1,  # type: ignore[arg-type]
                             order=order, age_limit_ms=60_000, one_window=one_window)  # type: ignore[arg-type]
    await batcher.start()
    first = asyncio.ensure_future(batcher.submit(AudioSegment(0, 500, np.zeros(8000, np.float32))))
    while not recognizer.batches:  # the first batch holds the only inference thread
        await asyncio.sleep(0.01)
    lengths = (8000, 3000, 1000, 1000)  # a long turn first, then shorter ones
    rest = [asyncio.ensure_future(batcher.submit(AudioSegment(0, ms, np.zeros(ms * 16, np.float32))))
            for ms in lengths]
    while batcher.queued < len(lengths) - 1:  # the collector may hold the first of them already
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)  # the submits were made in one turn of the loop: all are queued now
    recognizer.release.set()
    await asyncio.gather(first, *rest)
    await batcher.close()
    assert recognizer.batches[1:] == expected


class CountingRecognizer(RecordingRecognizer):
    """Records each batch's segments and takes a moment over it (as a decode does), blocking nothing."""

    def recognize(self, segments: Sequence[AudioSegment], waits: Sequence[float] | None = None,
                  wide: bool = False, on_result: Any = None, contexts: Any = None) -> list[TranscriptResult]:
        self.release.set()
        results = super().recognize(segments, waits, wide, on_result, contexts)
        threading.Event().wait(0.05)
        return results


@pytest.mark.parametrize(("spread", "expected"), [(True, [2, 2]), (False, [4])])
async def test_segments_waiting_for_two_free_threads_are_shared_out(spread: bool, expected: list[int]) -> None:
    """Four segments arrive together while both inference threads are free: shared out, each thread decodes
    two at once (Moonshine encodes a batch's rows one by one); without ``spread`` the first takes all four."""
    recognizer = CountingRecognizer()
    batcher = SegmentBatcher(recognizer, window=SecondsWindow(), max_batch=16, max_wait_ms=100,  # type: ignore[arg-type]
                             inference_threads=2, spread=spread)
    await batcher.start()
    await asyncio.gather(*(batcher.submit(AudioSegment(0, 1000, np.zeros(16000, np.float32))) for _ in range(4)))
    await batcher.close()
    assert sorted((len(b) for b in recognizer.batches), reverse=True) == expected
    assert Settings().batch_spread is True
