"""Previews (partial transcripts) in the SegmentBatcher give way to finals: a batch is
finals or previews, finals first; with several threads a preview never takes the last free one; a preview
that waited ``preview_max_wait_ms`` is dropped undecoded. Checked through a recognizer that records its
batches and holds each one until the test lets it go."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from pipeline.asr.batcher import PreviewDroppedError, SegmentBatcher
from pipeline.asr.results import AudioSegment, SegmentTimings, TranscriptResult
from pipeline.config import Settings


class GatedRecognizer:
    """Records each batch (segments by length in ms) and decodes a batch only once ``go`` lets it."""

    name, version = "gated", 1
    window = None  # the tests give the batcher its window policy

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gates: list[threading.Event] = []
        self._lock = threading.Lock()

    def recognize(self, segments: Sequence[AudioSegment], waits: Sequence[float] | None = None,
                  wide: bool = False, on_result: Any = None, contexts: Any = None) -> list[TranscriptResult]:
        gate = threading.Event()
        with self._lock:
            self.batches.append([s.end_ms - s.start_ms for s in segments])
            self.gates.append(gate)
        gate.wait(10)
        return [TranscriptResult(s.start_ms, s.end_ms, "", 0.0, 0.0, "gated", 1, (), SegmentTimings())
                for s in segments]

    def go(self, batch: int) -> None:
        self.gates[batch].set()

    def go_all(self) -> None:
        for gate in self.gates:
            gate.set()


class OneWindow:
    def window_frames(self, frames: int) -> int:
        return 3000


def segment(ms: int) -> AudioSegment:
    return AudioSegment(0, ms, np.zeros(ms * 16, np.float32))


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def batcher_of(recognizer: GatedRecognizer, threads: int, max_wait_preview_ms: float = 0.0) -> SegmentBatcher:
    return SegmentBatcher(recognizer, window=OneWindow(), max_batch=8, max_wait_ms=1,  # type: ignore[arg-type]
                          inference_threads=threads, preview_max_wait_ms=max_wait_preview_ms)


async def busy_batcher(threads: int, max_wait_preview_ms: float = 0.0,
                       ) -> tuple[GatedRecognizer, SegmentBatcher, asyncio.Future[TranscriptResult]]:
    """A started batcher whose first thread decodes a 100 ms final, held until the test lets it go."""
    recognizer = GatedRecognizer()
    batcher = batcher_of(recognizer, threads, max_wait_preview_ms)
    await batcher.start()
    busy = asyncio.ensure_future(batcher.submit(segment(100)))
    await until(lambda: len(recognizer.batches) == 1)
    return recognizer, batcher, busy


async def test_with_one_thread_a_final_queued_after_a_preview_is_decoded_first() -> None:
    recognizer, batcher, busy = await busy_batcher(threads=1)
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await asyncio.sleep(0.02)
    final = asyncio.ensure_future(batcher.submit(segment(300)))
    await until(lambda: batcher.queued >= 1)  # the preview waits in the collector for the thread, the final queued
    await asyncio.sleep(0.02)
    recognizer.go(0)
    await until(lambda: len(recognizer.batches) == 2)
    assert recognizer.batches[1] == [300]  # the final, alone: a batch never mixes finals and previews
    recognizer.go_all()
    await asyncio.gather(busy, final)
    await until(lambda: len(recognizer.batches) == 3)
    recognizer.go_all()  # the preview's batch, opened after the finals' (its gate did not exist before)
    await preview
    await batcher.close()
    assert recognizer.batches == [[100], [300], [200]]


async def test_a_preview_leaves_the_last_free_thread_to_the_next_final() -> None:
    recognizer, batcher, busy = await busy_batcher(threads=2)
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await asyncio.sleep(0.1)
    assert len(recognizer.batches) == 1 and batcher.queued == 1  # one thread free: kept for finals
    final = asyncio.ensure_future(batcher.submit(segment(300)))
    await until(lambda: len(recognizer.batches) == 2)
    assert recognizer.batches[1] == [300]  # the final took the free thread at once
    recognizer.go(0)  # one thread frees, the final still decodes: that thread stays for the next final
    await asyncio.sleep(0.1)
    assert len(recognizer.batches) == 2
    recognizer.go(1)  # both free: the preview takes one
    await until(lambda: len(recognizer.batches) == 3)
    assert recognizer.batches[2] == [200]
    recognizer.go_all()
    await asyncio.gather(busy, preview, final)
    await batcher.close()


async def test_previews_run_while_threads_are_free() -> None:
    recognizer = GatedRecognizer()
    batcher = batcher_of(recognizer, threads=2)
    await batcher.start()
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await until(lambda: len(recognizer.batches) == 1)
    recognizer.go_all()
    result = await preview
    assert result.end_ms == 200
    await batcher.close()


async def test_a_stale_preview_is_dropped_undecoded() -> None:
    recognizer, batcher, busy = await busy_batcher(threads=1, max_wait_preview_ms=50)
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    with pytest.raises(PreviewDroppedError, match="waited 50 ms"):
        await asyncio.wait_for(preview, 5)  # dropped while the only thread is still busy
    assert batcher.previews_dropped == 1 and batcher.queued == 0
    recognizer.go_all()
    await busy
    await batcher.close()
    assert recognizer.batches == [[100]]


async def test_a_stale_preview_is_dropped_beside_a_final_of_the_same_span() -> None:
    # Requests are told apart by who they are, not by their fields: dropping a preview once compared it with
    # the final of the same start and end waiting before it, then their audio arrays, and the collector died
    # of it ("The truth value of an array ... is ambiguous"; bench live at 28 calls with partials on).
    recognizer, batcher, busy = await busy_batcher(threads=1, max_wait_preview_ms=50)
    final = asyncio.ensure_future(batcher.submit(segment(200)))
    await asyncio.sleep(0.02)
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await asyncio.sleep(0.1)  # stale by the time the thread frees
    recognizer.go(0)
    await until(lambda: len(recognizer.batches) == 2)
    recognizer.go(1)
    with pytest.raises(PreviewDroppedError, match="waited 50 ms"):
        await asyncio.wait_for(preview, 5)
    assert (await busy).end_ms == 100 and (await asyncio.wait_for(final, 5)).end_ms == 200
    assert batcher.error is None
    await batcher.close()
    assert recognizer.batches == [[100], [200]]


async def test_previews_waiting_at_close_are_dropped_and_finals_finish() -> None:
    recognizer, batcher, busy = await busy_batcher(threads=2)
    preview = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await until(lambda: batcher.queued == 1)
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0.05)
    recognizer.go_all()
    await closing
    assert (await busy).end_ms == 100
    with pytest.raises(PreviewDroppedError, match="closed"):
        await preview
    assert recognizer.batches == [[100]]


def test_preview_max_wait_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().preview_max_wait_ms == 1000.0
    monkeypatch.setenv("CALLQA_PREVIEW_MAX_WAIT_MS", "0")
    recognizer = GatedRecognizer()
    recognizer.window = OneWindow()  # type: ignore[assignment]
    assert SegmentBatcher.from_settings(recognizer, Settings()).preview_max_wait_s == 0  # type: ignore[arg-type]


async def test_previews_leave_the_batcher_idle_for_early_decodes() -> None:
    """``idle`` (what early decodes wait for) counts finals only: a preview decoding on one thread, or
    waiting for one, leaves spare capacity that a final may take."""
    recognizer = GatedRecognizer()
    batcher = batcher_of(recognizer, threads=2)
    await batcher.start()
    running = asyncio.ensure_future(batcher.submit(segment(200), preview=True))
    await until(lambda: len(recognizer.batches) == 1)
    waiting = asyncio.ensure_future(batcher.submit(segment(250), preview=True))
    await until(lambda: batcher.queued == 1)
    assert batcher.idle
    final = asyncio.ensure_future(batcher.submit(segment(300)))
    await until(lambda: len(recognizer.batches) == 2)
    assert not batcher.idle and recognizer.batches[1] == [300]
    recognizer.go_all()
    await asyncio.gather(running, final)
    await until(lambda: len(recognizer.batches) == 3)
    recognizer.go_all()
    await waiting
    await batcher.close()
