"""The post-call pass's core, without Kafka: a call's frames in, its revision 1 out, equal to what
`callqa analyze --final-model` scores for the same recording. Real models."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.config import get_settings
from pipeline.contracts.messages import AudioFrame
from pipeline.postcall.audio import assemble
from pipeline.postcall.final_pass import PostCallError, transcribe_call
from pipeline.qa.call import QaConfig
from pipeline.segmentation import SpeechSegment
from tests.postcall.conftest import CALL, job_for


@pytest.fixture(scope="module")
def engines() -> tuple[Engine, Engine]:
    return Engine.load(), Engine.load("moonshine-tiny")


def test_the_pass_over_the_calls_frames_equals_the_offline_final_pass(
        engines: tuple[Engine, Engine], library_frames: list[AudioFrame]) -> None:
    live, final = engines
    config = QaConfig.from_settings(get_settings())
    frames = list(library_frames)
    random.Random(7).shuffle(frames)  # the topic interleaves legs; order by seq is the pass's job
    frames += frames[:40]  # and a producer's retries repeat some
    job = job_for("CA-pass", library_frames)
    chunks: list[int] = []

    async def decode(segments: Sequence[SpeechSegment]) -> list[TranscriptResult | Exception]:
        chunks.append(len(segments))
        return final.recognizer.recognize(list(segments))

    outcome = asyncio.run(transcribe_call(job, assemble(job, frames), live, final.model_label, decode, config, 4))
    (offline,) = analyze_recordings([CALL], live, config, final_engine=final)

    assert offline.revision == 1 and outcome.analysis.revision == 1
    assert len(offline.segments) >= 4 and max(chunks) == 4 and sum(chunks) >= len(offline.segments)
    assert [(s.leg, s.start_ms, s.end_ms, s.text) for s in outcome.analysis.segments] == [
        (s.leg, s.start_ms, s.end_ms, s.text) for s in offline.segments]
    assert (outcome.analysis.qa.score_pct, outcome.analysis.qa.auto_failed) == (offline.qa.score_pct,
                                                                                offline.qa.auto_failed)
    assert outcome.analysis.rule_verdicts() == offline.rule_verdicts()

    rows = outcome.rows
    assert {r["revision"] for r in rows.segments} == {1} and rows.calls["revision"] == rows.call_qa["revision"] == 1
    assert [r["segment_id"] for r in rows.segments] == [s.segment_id.replace(CALL.stem, "CA-pass") for s in offline.segments]
    assert {r["model_name"] for r in rows.segments} == {"moonshine-tiny"}
    assert rows.calls["segments"] == len(offline.segments) and rows.calls["audio_ms"] == job.audio_ms
    assert sorted((e["rule"], e["kind"]) for e in rows.qa_events) == sorted(
        (e.rule, e.kind) for e in offline.qa.events) and {e["revision"] for e in rows.qa_events} <= {1}
    assert any("[PAN]" in r["text"] for r in rows.segments)  # redaction ran on the new words


def test_a_segment_the_model_fails_on_fails_the_pass_naming_call_and_segment(
        engines: tuple[Engine, Engine], library_frames: list[AudioFrame]) -> None:
    live, _ = engines
    job = job_for("CA-pass", library_frames)

    async def decode(segments: Sequence[SpeechSegment]) -> list[TranscriptResult | Exception]:
        return [RuntimeError("out of memory") for _ in segments]

    with pytest.raises(PostCallError, match=r"call CA-pass: (agent|customer) segment at \d+ ms: out of memory"):
        asyncio.run(transcribe_call(job, assemble(job, library_frames), live, "m@1/fp32", decode,
                                    QaConfig.from_settings(get_settings())))
