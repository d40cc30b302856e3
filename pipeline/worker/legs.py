"""One call leg inside the worker: a jitter buffer in front of the engine's leg front end.

The leg also holds its early decode (``EarlyDecode``, defined here as part of the leg's state);
``pipeline/worker/early.py`` decides when one starts, is used or is dropped, so it imports this module
and not the other way round.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from pipeline.asr.context import LegContext
from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.segmentation.segmenter import Silence, SpeechSegment
from pipeline.worker.ports import Transcription
from pipeline.worker.reorder import FrameReorderBuffer, ReleasedFrame


@dataclass
class EarlyDecode:
    """An open segment's provisional samples [start, end) and the transcription running for them."""

    start_sample: int
    end_sample: int
    task: asyncio.Task[Transcription]
    context: tuple[int, ...] = ()  # the leg's context it was decoded after


@dataclass
class LegState:
    call_id: str
    leg: str
    front_end: LegFrontEnd  # decode -> 16 kHz (or 8 kHz VAD) -> segmenter, the path `callqa transcribe` takes
    frame_ms: int
    reorder: FrameReorderBuffer
    keep_frames: int
    frames_released: int = 0
    # How much shorter than frame_ms the last released frame was: a leg's last message may be short, and
    # with 200 ms messages rounding it up would add up to 200 ms to the call's length.
    last_frame_short_ms: int = 0
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
             reorder_window_ms: int) -> LegState:
        """A new leg whose messages are ``frame_ms`` long; its jitter buffer holds ``reorder_window_ms`` of
        them (at least one message)."""
        window = max(1, -(-reorder_window_ms // frame_ms))
        return cls(
            call_id=call_id, leg=leg, front_end=front_end, frame_ms=frame_ms,
            reorder=FrameReorderBuffer(window),
            keep_frames=(max_segment_ms + 2000) // frame_ms + 2 * window,
        )

    @property
    def frame_samples(self) -> int:
        return self.front_end.sample_rate * self.frame_ms // 1000

    @property
    def audio_ms(self) -> int:
        """The leg's audio released so far (ms): its frames, the last one at its own length."""
        return self.frames_released * self.frame_ms - self.last_frame_short_ms

    def release(self, seq: int, payload: bytes, produced_at_ms: int) -> np.ndarray | None:
        """``take``, with any run of silence made into zeros: the samples one frame lets through, at the
        segmenter's input rate (None while it waits in the jitter buffer), for callers that feed the
        segmenter themselves."""
        audio = self.take(seq, payload, produced_at_ms)
        if not audio:
            return None
        return np.concatenate([np.zeros(a.samples, dtype=np.float32) if isinstance(a, Silence) else a
                               for a in audio])

    def take(self, seq: int, payload: bytes, produced_at_ms: int) -> list[np.ndarray | Silence]:
        """Take one frame; the audio it lets through at the segmenter's input rate (16 kHz, or the leg's
        8 kHz with the VAD at 8 kHz), in order (none while it waits in the jitter buffer). A gap of missing
        frames comes as zeros, its long runs as ``Silence`` (their length).

        The audio still has to go through the leg's segmenter (``Segmenter.take``): the processor does
        that for many legs at once (one VAD run for all of them).
        """
        return self.to_segmenter(self.push(seq, payload, produced_at_ms))

    def push(self, seq: int, payload: bytes, produced_at_ms: int) -> list[ReleasedFrame]:
        """Take one frame into the jitter buffer; the frames it lets through, in order, still encoded:
        ``to_segmenter`` of several pushes' frames decodes and resamples them in one go (the intake does that
        once per leg and batch, not once per message)."""
        if seq < self.resumed_from_seq:
            self.before_checkpoint += 1
            return []
        self.produced_at_ms[seq] = produced_at_ms
        if seq % 256 == 0:  # keep only what the longest possible segment can still reach
            keep_from = seq - self.keep_frames
            for k in [k for k in self.produced_at_ms if k < keep_from]:
                del self.produced_at_ms[k]
        return self.reorder.push(seq, payload)

    def finish(self, total_frames: int | None) -> list[SpeechSegment]:
        """End of the leg: release held frames (filling gaps up to ``total_frames``), close any segment."""
        if self.finished:
            return []
        self.finished = True
        segmenter = self.front_end.segmenter
        closed = [s for audio in self.to_segmenter(self.reorder.flush(total_frames)) for s in segmenter.take(audio)]
        return closed + self.front_end.finish()

    def produced_at(self, at_ms: int) -> int:
        """Producer time of the frame holding ``at_ms`` (or the nearest earlier one still known)."""
        idx = max(0, (at_ms - 1) // self.frame_ms)
        for k in range(idx, max(-1, idx - 50), -1):
            if k in self.produced_at_ms:
                return self.produced_at_ms[k]
        return 0

    def to_segmenter(self, released: list[ReleasedFrame]) -> list[np.ndarray | Silence]:
        """Released frames through the codec and the resampler, in order: each run of frames between long
        gaps decoded and resampled once (one numpy call each, however many messages it came in). A gap
        is filled with silence so the call's timing holds; at ``gap_boundary_ms`` and longer (a hold),
        its zeros are not made but counted (``LegFrontEnd.silence_to_segmenter``), and the segmenter skips
        them the same way."""
        out: list[np.ndarray | Silence] = []
        run: list[bytes | int] = []  # payloads, and short gaps as their sample counts
        width = codecs.bytes_per_sample(self.front_end.encoding)
        for frame in released:
            self.frames_released += frame.frames
            self.last_frame_short_ms = 0
            if frame.payload is not None:
                run.append(frame.payload)
                missing = self.frame_samples - len(frame.payload) // width
                self.last_frame_short_ms = max(0, missing) * 1000 // self.front_end.sample_rate
            elif frame.frames * self.frame_ms < self.gap_boundary_ms:
                run.append(frame.frames * self.frame_samples)
            else:
                if run:
                    out.append(self.front_end.to_segmenter(self._decode(run)))
                    run = []
                out.extend(self.front_end.silence_to_segmenter(frame.frames * self.frame_samples))
        if run:
            out.append(self.front_end.to_segmenter(self._decode(run)))
        return [a for a in out if isinstance(a, Silence) or a.size]

    def _decode(self, run: list[bytes | int]) -> np.ndarray:
        """Payloads and short gaps (sample counts) as one float32 array, the payloads decoded in one call.
        A gap is exact zeros, not encoded silence (A-law has no zero code; the segmenter's hold detection
        looks for digital silence)."""
        encoding = self.front_end.encoding
        decoded = codecs.decode(b"".join(p for p in run if isinstance(p, bytes)), encoding)
        if all(isinstance(p, bytes) for p in run):
            return decoded
        width, at, pieces = codecs.bytes_per_sample(encoding), 0, []
        for part in run:
            if isinstance(part, int):
                pieces.append(np.zeros(part, dtype=np.float32))
            else:
                pieces.append(decoded[at:at + len(part) // width])
                at += len(part) // width
        return np.concatenate(pieces)

    @property
    def gap_boundary_ms(self) -> int:
        """Gaps this long or longer are skipped unmade (0: never, every gap is made of zeros)."""
        boundary = self.front_end.segmenter.settings.gap_boundary_ms
        return boundary if boundary > 0 else 1 << 62
