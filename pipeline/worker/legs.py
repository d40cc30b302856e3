"""One call leg inside the worker: a jitter buffer in front of the engine's leg front end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.asr.context import LegContext
from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.worker.reorder import FrameReorderBuffer, ReleasedFrame

if TYPE_CHECKING:
    from pipeline.worker.early import EarlyDecode


@dataclass
class LegState:
    call_id: str
    leg: str
    front_end: LegFrontEnd  # decode -> 16 kHz -> VAD segmenter, the same path `callqa transcribe` takes
    frame_ms: int
    reorder: FrameReorderBuffer
    keep_frames: int
    frames_released: int = 0
    # Producer time of recent frames by seq, so a segment knows when its audio was produced.
    produced_at_ms: dict[int, int] = field(default_factory=dict)
    finished: bool = False
    # Partial transcripts: the open segment (by start) last transcribed, at what length, and whether
    # a partial is in flight (one at a time per leg, so partials never pile up in the batcher).
    partial_start_ms: int | None = None
    partial_len_ms: int = 0
    partial_inflight: bool = False
    # The open segment decoded before its endpoint (pipeline/worker/early.py), or None.
    early: EarlyDecode | None = None
    # The leg's recent final text, which its next segment is decoded after (AsrSettings.context_tokens).
    # Not checkpointed: a leg resumed from a checkpoint starts without context.
    context: LegContext = field(default_factory=LegContext)
    # Resumed from a checkpoint: frames before this seq are in it (replayed input, skipped and counted).
    resumed_from_seq: int = 0
    before_checkpoint: int = 0

    @classmethod
    def open(cls, call_id: str, leg: str, front_end: LegFrontEnd, frame_ms: int, max_segment_ms: int,
             reorder_window: int) -> LegState:
        return cls(
            call_id=call_id, leg=leg, front_end=front_end, frame_ms=frame_ms,
            reorder=FrameReorderBuffer(reorder_window),
            keep_frames=(max_segment_ms + 2000) // frame_ms + 2 * reorder_window,
        )

    @property
    def frame_samples(self) -> int:
        return self.front_end.sample_rate * self.frame_ms // 1000

    def release(self, seq: int, payload: bytes, produced_at_ms: int) -> np.ndarray | None:
        """Take one frame; the 16 kHz samples it lets through (None while it waits in the jitter buffer).

        The samples still have to go through the leg's segmenter: the processor does that for many
        legs at once (one VAD run for all of them).
        """
        if seq < self.resumed_from_seq:
            self.before_checkpoint += 1
            return None
        self.produced_at_ms[seq] = produced_at_ms
        if seq % 256 == 0:  # keep only what the longest possible segment can still reach
            keep_from = seq - self.keep_frames
            for k in [k for k in self.produced_at_ms if k < keep_from]:
                del self.produced_at_ms[k]
        released = self.reorder.push(seq, payload)
        if not released:
            return None
        self.frames_released += len(released)
        return self.front_end.to_16k(np.concatenate([self._decode(f) for f in released]))

    def finish(self, total_frames: int | None) -> list[SpeechSegment]:
        """End of the leg: release held frames (filling gaps up to ``total_frames``), close any segment."""
        if self.finished:
            return []
        self.finished = True
        return self._feed(self.reorder.flush(total_frames)) + self.front_end.finish()

    def produced_at(self, at_ms: int) -> int:
        """Producer time of the frame holding ``at_ms`` (or the nearest earlier one still known)."""
        idx = max(0, (at_ms - 1) // self.frame_ms)
        for k in range(idx, max(-1, idx - 50), -1):
            if k in self.produced_at_ms:
                return self.produced_at_ms[k]
        return 0

    def _feed(self, released: list[ReleasedFrame]) -> list[SpeechSegment]:
        if not released:
            return []
        self.frames_released += len(released)
        return self.front_end.accept_samples(np.concatenate([self._decode(f) for f in released]))

    def _decode(self, frame: ReleasedFrame) -> np.ndarray:
        if frame.payload is None:  # a gap, filled with silence so the call's timing holds
            return np.zeros(self.frame_samples, dtype=np.float32)
        return codecs.decode(frame.payload, self.front_end.encoding)
