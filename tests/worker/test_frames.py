"""A frame is checked on its own before it touches any call state."""

from __future__ import annotations

import pytest

from pipeline.contracts.messages import AudioFrame
from pipeline.worker.frames import FrameError, check_frame, check_leg_format, check_seq_jump

GOOD = {"call_id": "c1", "leg": "agent", "seq": 7, "start_ms": 140, "sample_rate": 8000, "encoding": "mulaw",
        "payload": b"\xff" * 160}


def _frame(**changes: object) -> AudioFrame:
    return AudioFrame(**{**GOOD, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("changes, problem", [
    ({"sample_rate": 0}, "unsupported sample rate 0"),
    ({"sample_rate": 7999}, "unsupported sample rate 7999"),
    ({"encoding": "opus"}, "unknown encoding 'opus'"),
    ({"payload": b""}, "empty payload"),
    ({"encoding": "pcm16", "payload": b"\0" * 321}, "321 bytes is not a whole number of pcm16 samples"),
    ({"payload": b"\xff" * 8001}, "8001 samples is longer than 1000 ms"),
    ({"leg": "supervisor"}, "unknown leg (known: agent, customer)"),
    ({"seq": -1}, "negative seq"),
])  # fmt: skip
def test_each_kind_of_bad_frame_is_named_with_its_call_leg_and_seq(changes: dict[str, object], problem: str) -> None:
    frame = _frame(**changes)
    with pytest.raises(FrameError) as caught:
        check_frame(frame)
    assert caught.value.problem == problem
    assert str(caught.value) == f"call 'c1' leg {str(frame.leg)!r} seq {frame.seq}: {problem}"


def test_good_frames_pass_at_every_supported_shape() -> None:
    check_frame(_frame())
    check_frame(_frame(encoding="pcm16", sample_rate=16000, payload=b"\0" * 640))
    check_frame(_frame(encoding="alaw", sample_rate=8000, payload=b"\xd5" * 8000))  # exactly one second


def test_a_frame_must_keep_its_legs_rate_and_encoding() -> None:
    check_leg_format(_frame(), 8000, "mulaw")
    with pytest.raises(FrameError, match=r"16000 Hz pcm16 differs from the leg's earlier frames \(8000 Hz mulaw\)"):
        check_leg_format(_frame(encoding="pcm16", sample_rate=16000, payload=b"\0" * 640), 8000, "mulaw")


def test_a_garbage_call_id_stays_short_in_the_error() -> None:
    with pytest.raises(FrameError) as caught:
        check_frame(_frame(call_id="x" * 10_000, payload=b""))
    assert len(str(caught.value)) < 200


def test_a_seq_far_beyond_any_pause_is_refused() -> None:
    frame = AudioFrame("c1", "agent", 10**8, 0, 8000, "mulaw", b"\xff" * 160)
    check_seq_jump(AudioFrame("c1", "agent", 9000, 0, 8000, "mulaw", b"\xff" * 160), 0, 9000)  # a 3-minute pause
    with pytest.raises(FrameError, match="ahead of the leg"):
        check_seq_jump(frame, 0, 120_000)
