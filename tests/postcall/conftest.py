"""Fixtures of the post-call pass's tests: a library call as the frames a gateway sends, and its job."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.contracts.messages import AudioFrame, PostCallJob
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import ReplayOptions, load_recording

# A library call with a card number and rules that fire (the set-up builds the library).
CALL = LIBRARY_DIR / "02_card_payment.wav"
FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law


def frames_of(path: Path, call_id: str) -> list[AudioFrame]:
    """The call's legs cut into 20 ms mu-law frames, as `callqa replay` sends them."""
    rec = load_recording(path, ReplayOptions())
    frames = []
    for leg, data in rec.encoded.items():
        for seq, at in enumerate(range(0, len(data), FRAME_BYTES)):
            frames.append(AudioFrame(call_id, leg, seq, seq * 20, 8000, "mulaw", data[at: at + FRAME_BYTES]))  # type: ignore[arg-type]
    return frames


def job_for(call_id: str, frames: list[AudioFrame], **fields: object) -> PostCallJob:
    counts: dict[str, int] = {}
    for f in frames:
        counts[f.leg] = max(counts.get(f.leg, 0), f.seq + 1)
    job = PostCallJob(call_id=call_id, revision=1, model="moonshine-tiny", audio_topic="audio", audio_partition=0,
                      audio_from_ms=0, audio_end_offset=0, frame_counts=counts, started_at_ms=1_772_443_800_000,
                      ended_at_ms=1_772_443_900_000, end_reason="end", audio_ms=max(counts.values()) * 20,
                      requested_at_ms=1_772_443_900_000)
    for name, value in fields.items():
        setattr(job, name, value)
    return job


@pytest.fixture(scope="session")
def library_frames() -> list[AudioFrame]:
    return frames_of(CALL, "CA-pass")
