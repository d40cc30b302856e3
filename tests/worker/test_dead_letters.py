"""Dead letters are references (where, which call, why), bounded, with data only when debugging."""

from __future__ import annotations

import numpy as np

from pipeline.contracts.messages import AudioFrame
from pipeline.segmentation.segmenter import SpeechSegment
from pipeline.worker.dead_letters import (
    DEBUG_RAW_MAX_BYTES,
    describe_error,
    key_text,
    message_dead_letter,
    segment_dead_letter,
)


def test_describe_error_is_one_bounded_line() -> None:
    assert describe_error(ValueError("bad\n  rate\tzero")) == "ValueError: bad rate zero"
    assert describe_error(KeyError()) == "KeyError"
    assert describe_error(RuntimeError("x" * 500), limit=10) == "RuntimeError: " + "x" * 10


def test_a_garbage_key_stays_short_and_printable() -> None:
    assert key_text(None) == ""
    assert key_text(b"\xff" * 1000) == "\ufffd" * 128


def test_an_undecodable_message_is_named_by_its_key_without_its_bytes() -> None:
    letter = message_dead_letter(("audio", 3), 42, b"call-7", b"garbage", ValueError("no magic byte"),
                                 "w1", debug_raw=False)
    assert (letter.original_topic, letter.original_partition, letter.original_offset) == ("audio", 3, 42)
    assert letter.call_id == "call-7" and letter.error_type == "ValueError" and letter.worker_id == "w1"
    assert letter.reason == "audio[3]@42: ValueError: no magic byte"
    assert letter.raw is None and letter.key is None and letter.raw_kind == ""


def test_a_decoded_frame_gives_leg_and_time_range_even_when_its_rate_is_zero() -> None:
    frame = AudioFrame("c1", "agent", 5, 100, 8000, "pcm16", b"\0" * 320)
    letter = message_dead_letter(("audio", 0), 1, b"c1", b"raw", ValueError("x"), "w", False, frame)
    assert (letter.call_id, letter.leg, letter.start_ms, letter.end_ms) == ("c1", "agent", 100, 120)
    zero = AudioFrame("c1", "customer", 5, 100, 0, "mulaw", b"\0" * 160)
    letter = message_dead_letter(("audio", 0), 1, b"c1", b"raw", ValueError("x"), "w", False, zero)
    assert (letter.leg, letter.start_ms, letter.end_ms) == ("customer", 100, -1)


def test_debug_raw_carries_the_start_of_the_payload_only() -> None:
    raw = b"m" * (DEBUG_RAW_MAX_BYTES + 10)
    letter = message_dead_letter(("audio", 0), 1, b"k", raw, ValueError("x"), "w", debug_raw=True)
    assert letter.raw == raw[:DEBUG_RAW_MAX_BYTES] and letter.key == b"k" and letter.raw_kind == "message"
    seg = SpeechSegment(0, 16_000, 48_000, np.full(32_000, 0.5, np.float32), 2000, "endpoint")
    letter = segment_dead_letter("audio", 2, "c1", "agent", seg, "c1/agent/000001000", RuntimeError("oom"),
                                 "w", debug_raw=True)
    assert letter.raw_kind == "pcm16le_16k" and letter.raw is not None and len(letter.raw) == 64_000
    assert np.frombuffer(letter.raw, "<i2")[0] == int(0.5 * 32767)  # float samples as 16-bit PCM


def test_a_failed_segment_is_referenced_by_call_leg_and_time_range() -> None:
    seg = SpeechSegment(0, 16_000, 48_000, np.zeros(32_000, np.float32), 2000, "endpoint")
    letter = segment_dead_letter("audio", -1, "c1", "agent", seg, "c1/agent/000001000", RuntimeError("oom"),
                                 "w", debug_raw=False)
    assert (letter.original_topic, letter.original_partition, letter.original_offset) == ("audio", -1, -1)
    assert (letter.segment_id, letter.start_ms, letter.end_ms) == ("c1/agent/000001000", 1000, 3000)
    assert letter.reason == "segment c1/agent/000001000: inference failed: RuntimeError: oom"
    assert letter.raw is None
