"""Secure pauses on the wire (CallEvent version 3, and the QA, checkpoint and post-call records that carry
them): a pause and its end round-trip with their call time; a reader of the version before reads them as
a repeated start, never as a hold; messages written before the field read as no pause."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

from fastavro import parse_schema, schemaless_reader

from pipeline.contracts import CallEvent, CallQA, Serde
from pipeline.contracts.messages import CallCheckpoint, CallHold, HoldSpan, JobHold, PostCallJob
from pipeline.contracts.serde import HEADER, SCHEMAS_DIR


def newest_without(subject: str, field: str) -> dict:  # type: ignore[type-arg]
    entries = json.loads((SCHEMAS_DIR / "registry.json").read_text())["schemas"]
    older = [e for e in entries if e["subject"] == subject and field not in {f["name"] for f in e["schema"]["fields"]}]
    return max(older, key=lambda e: e["version"])


def test_pause_and_unpause_round_trip_with_their_call_time_and_are_not_holds() -> None:
    serde = Serde.from_settings()
    pause = CallEvent("c1", "pause", tenant="t", agent_id="a7", offset_ms=61_200, at_ms=17)
    unpause = CallEvent("c1", "unpause", tenant="t", agent_id="a7", offset_ms=83_400, at_ms=40,
                        reason="call ended")
    for event in (pause, unpause):
        back = serde.decode(serde.encode(event), CallEvent)
        assert back == event and back.is_pause_change and not back.is_hold_change
    # On the wire: a start carrying the pause field, with the resume symbol for the pause's end.
    assert (pause.to_record()["event_type"], pause.to_record()["pause"], pause.to_record()["hold"]) == (
        "start", "pause", None)
    assert unpause.to_record()["pause"] == "resume"
    assert CallEvent("c1", "resume", offset_ms=5).to_record()["pause"] is None  # a hold's resume is not a pause's


def test_a_reader_of_the_version_before_reads_a_pause_as_a_repeated_start() -> None:
    serde = Serde.from_settings()
    data = serde.encode(CallEvent("c1", "pause", tenant="t", agent_id="a7", queue="billing", offset_ms=4200, at_ms=17))
    _, writer_id = HEADER.unpack_from(data)
    writer = parse_schema(serde.registry.schema_for(writer_id))
    old_reader = parse_schema(newest_without("io.callqa.CallEvent", "pause")["schema"])
    record = schemaless_reader(io.BytesIO(data[HEADER.size:]), writer, old_reader)
    assert (record["event_type"], record["hold"], record["tenant"], record["agent_id"]) == ("start", None, "t", "a7")
    assert "pause" not in record


def test_records_written_before_pauses_read_as_none(written_before: Callable[..., bytes]) -> None:
    serde = Serde.from_settings()
    event = serde.decode(written_before(CallEvent.SCHEMA, "pause", {
        **CallEvent("c1", "start", at_ms=3).to_record()} | {"event_type": "start"}), CallEvent)
    assert event.event_type == "start" and not event.is_pause_change
    qa = serde.decode(written_before(CallQA.SCHEMA, "pauses", {
        "call_id": "c", "score_pct": 90.0, "auto_failed": False, "metrics": {}, "items": [], "events": [],
        "computed_at_ms": 5, "hold_ms": 0, "holds": []}), CallQA)
    assert (qa.paused_ms, qa.pauses) == (0, [])


def test_qa_checkpoint_and_post_call_job_keep_the_pauses() -> None:
    serde = Serde.from_settings()
    qa = CallQA("c", 80.0, False, {"paused_ms": 22_000.0}, [], [], computed_at_ms=5, paused_ms=22_000,
                pauses=[CallHold(40_000, 62_000)])
    assert serde.decode_any(serde.encode(qa)) == qa
    checkpoint = CallCheckpoint("c", "open", taken_at_ms=5, pauses=[HoldSpan(1_000, 4_000)], paused_from_ms=9_000)
    back = serde.decode(serde.encode(checkpoint), CallCheckpoint)
    assert (back.pauses, back.paused_from_ms) == ([HoldSpan(1_000, 4_000)], 9_000)
    job = PostCallJob("c", 1, "m", "audio", 0, 0, 10, {"agent": 5}, requested_at_ms=5,
                      pauses=[JobHold(1_000, 4_000)])
    back_job = serde.decode(serde.encode(job), PostCallJob)
    assert back_job.pause_intervals() == [(1_000, 4_000)] and back_job.hold_intervals() == []
