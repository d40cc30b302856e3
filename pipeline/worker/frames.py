"""Checks of one audio frame before it touches any call state: a bad frame is rejected alone.

A rejected frame goes to the dead-letter topic and its seq stays a gap, which the leg's jitter buffer
fills with silence, so the leg keeps its timeline and the rest of its batch is processed normally.
"""

from __future__ import annotations

from typing import NamedTuple

from pipeline.audio.codecs import ENCODINGS, bytes_per_sample
from pipeline.contracts.messages import LEGS, AudioFrame
from pipeline.worker.offsets import TopicPartition

# Rates gateways and recorders use; the front end resamples any of them to 16 kHz.
SUPPORTED_SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# Frames are 10-60 ms in practice; beyond a second a frame is a producer bug (and one gap-fill of
# silence per missing frame, sized by the leg's first frame, would be absurd).
MAX_FRAME_MS = 1000


class FrameError(ValueError):
    """A frame that cannot be used: names its call, leg, seq and what is wrong."""

    def __init__(self, frame: AudioFrame, problem: str) -> None:
        # Bounded: a garbage call id or leg stays a short one in dead letters and logs.
        super().__init__(f"call {frame.call_id[:128]!r} leg {str(frame.leg)[:32]!r} seq {frame.seq}: {problem}")
        self.problem = problem


class RejectedFrame(NamedTuple):
    """A frame ``on_frames`` did not take, and why: the caller sends it to the dead-letter topic."""

    tp: TopicPartition
    offset: int
    frame: AudioFrame
    error: FrameError


def check_frame(frame: AudioFrame) -> None:
    """Raise ``FrameError`` unless ``frame`` is usable on its own (before any call state is looked at)."""
    problem = frame_problem(frame)
    if problem is not None:
        raise FrameError(frame, problem)


def check_leg_format(frame: AudioFrame, sample_rate: int, encoding: str) -> None:
    """Raise ``FrameError`` unless ``frame`` has the rate and encoding of its leg's earlier frames (the
    leg's front end is built for them)."""
    if (frame.sample_rate, frame.encoding) != (sample_rate, encoding):
        raise FrameError(frame, f"{frame.sample_rate} Hz {frame.encoding} differs from the leg's earlier frames "
                                f"({sample_rate} Hz {encoding})")


def check_seq_jump(frame: AudioFrame, next_seq: int, max_gap_frames: int) -> None:
    """Raise ``FrameError`` when ``frame`` lies further ahead of its leg than any pause it may span:
    the gap would be filled with that much silence (a corrupt seq must not cost hours of VAD work)."""
    if frame.seq - next_seq > max_gap_frames:
        raise FrameError(frame, f"seq is {frame.seq - next_seq} frames ahead of the leg (next expected {next_seq}); "
                                f"more than the {max_gap_frames} a pause up to the inactivity timeout spans")


def frame_problem(frame: AudioFrame) -> str | None:
    """What is wrong with ``frame`` on its own (one short phrase), or None."""
    if frame.leg not in LEGS:
        return f"unknown leg (known: {', '.join(LEGS)})"
    if frame.seq < 0:
        return "negative seq"
    if frame.encoding not in ENCODINGS:
        return f"unknown encoding {str(frame.encoding)[:32]!r}"
    if frame.sample_rate not in SUPPORTED_SAMPLE_RATES:
        return f"unsupported sample rate {frame.sample_rate}"
    if not frame.payload:
        return "empty payload"
    width = bytes_per_sample(frame.encoding)
    if len(frame.payload) % width:
        return f"{len(frame.payload)} bytes is not a whole number of {frame.encoding} samples"
    if len(frame.payload) // width * 1000 > MAX_FRAME_MS * frame.sample_rate:
        return f"{len(frame.payload) // width} samples is longer than {MAX_FRAME_MS} ms"
    return None
