"""Dead letters: references to what could not be processed (where it is, which call, why), no data.

With ``debug_raw_audio`` a dead letter also carries the start of its payload (``raw``).
"""

from __future__ import annotations

import numpy as np

from pipeline.contracts.messages import AudioFrame, DeadLetter
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.worker.offsets import TopicPartition

# With debug_raw_audio a dead letter carries at most this much of its payload (the start of it): Kafka
# refuses messages over 1 MiB by default, and 512 KiB holds a whole default-length segment (15 s of PCM).
DEBUG_RAW_MAX_BYTES = 512 * 1024


def describe_error(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one bounded line, for dead letters and logs (never a traceback's worth)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def key_text(key: bytes | None) -> str:
    """The call ID a message key names (keys are call IDs), bounded: a garbage key stays a short one."""
    return key.decode("utf-8", errors="replace")[:128] if key else ""


def bytes_per_ms(frame: AudioFrame) -> float:
    per_sample = 2 if frame.encoding == "pcm16" else 1
    return frame.sample_rate * per_sample / 1000


def message_dead_letter(tp: TopicPartition, offset: int, key: bytes | None, raw: bytes, exc: BaseException,
                        worker_id: str, debug_raw: bool, frame: AudioFrame | None = None) -> DeadLetter:
    """A reference to an input message that could not be processed (``frame``: it was decoded)."""
    letter = DeadLetter(
        tp[0], tp[1], offset, f"{tp[0]}[{tp[1]}]@{offset}: {describe_error(exc)}",
        error_type=type(exc).__name__, worker_id=worker_id,
        # Input topics are keyed by call ID: the key names the call even when the value is garbage.
        call_id=frame.call_id[:128] if frame is not None else key_text(key),
    )
    if frame is not None:
        letter.leg, letter.start_ms = str(frame.leg)[:32], frame.start_ms  # the leg may be what was wrong
        # The frame may be what failed (a zero sample rate): building its reference must not raise too.
        if frame.sample_rate > 0:
            letter.end_ms = frame.start_ms + round(len(frame.payload) / bytes_per_ms(frame))
    if debug_raw:
        letter.raw, letter.key, letter.raw_kind = raw[:DEBUG_RAW_MAX_BYTES], key, "message"
    return letter


def segment_dead_letter(audio_topic: str, partition: int, call_id: str, leg: str, seg: SpeechSegment,
                        segment_id: str, exc: BaseException, worker_id: str, debug_raw: bool) -> DeadLetter:
    """A reference to a segment whose inference failed: its call, leg and time range on the audio topic
    (``partition`` -1 when unknown; offset -1: a segment spans many frames)."""
    letter = DeadLetter(
        audio_topic, partition, -1, f"segment {segment_id}: inference failed: {describe_error(exc)}",
        error_type=type(exc).__name__, worker_id=worker_id, call_id=call_id,
        leg=leg, segment_id=segment_id, start_ms=seg.start_ms, end_ms=seg.end_ms,
    )
    if debug_raw:
        letter.raw, letter.raw_kind = pcm16(seg.audio[:DEBUG_RAW_MAX_BYTES // 2]), "pcm16le_16k"
    return letter


def pcm16(audio: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian 16-bit PCM."""
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
