"""CallEvent version 2 (hold and resume): new readers read the hold change, version 1 readers still decode it."""

from __future__ import annotations

import io
import json

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from pipeline.contracts import CallEvent, Serde
from pipeline.contracts.serde import HEADER, SCHEMAS_DIR


def registered(subject: str, version: int) -> dict:  # type: ignore[type-arg]
    entries = json.loads((SCHEMAS_DIR / "registry.json").read_text())["schemas"]
    return next(e for e in entries if e["subject"] == subject and e["version"] == version)


def test_hold_and_resume_round_trip_with_their_call_time() -> None:
    serde = Serde.from_settings()
    for kind in ("hold", "resume"):
        event = CallEvent("c1", kind, tenant="t", agent_id="a7", queue="billing", offset_ms=4200, at_ms=17)  # type: ignore[arg-type]
        back = serde.decode(serde.encode(event), CallEvent)
        assert back == event and back.is_hold_change


def test_a_start_is_not_a_hold_and_keeps_no_offset() -> None:
    serde = Serde.from_settings()
    back = serde.decode(serde.encode(CallEvent("c1", "start", at_ms=5)), CallEvent)
    assert back.event_type == "start" and not back.is_hold_change and back.offset_ms == -1


def test_a_version_1_reader_reads_a_hold_as_a_repeated_start_with_the_same_call_fields() -> None:
    serde = Serde.from_settings()
    data = serde.encode(CallEvent("c1", "hold", tenant="t", agent_id="a7", queue="billing", legs=["agent", "customer"],
                                  offset_ms=4200, at_ms=17))
    _, writer_id = HEADER.unpack_from(data)
    writer = parse_schema(serde.registry.schema_for(writer_id))
    old_reader = parse_schema(registered("io.callqa.CallEvent", 1)["schema"])
    # fastavro's schema resolution, as a consumer built against version 1 does it: the writer's new
    # fields are skipped, and the enum symbol it sees is one version 1 knows
    record = schemaless_reader(io.BytesIO(data[HEADER.size:]), writer, old_reader)
    assert record["event_type"] == "start"
    assert (record["call_id"], record["tenant"], record["agent_id"], record["queue"], record["at_ms"]) == (
        "c1", "t", "a7", "billing", 17)
    assert "hold" not in record and "offset_ms" not in record


def test_a_version_1_event_reads_as_no_hold() -> None:
    v1 = registered("io.callqa.CallEvent", 1)
    serde = Serde.from_settings()
    entries = json.loads((SCHEMAS_DIR / "registry.json").read_text())["schemas"]
    newest = max(e["version"] for e in entries if e["subject"] == "io.callqa.CallEvent")
    assert newest >= 2 and serde.schema_id("io.callqa.CallEvent") == registered("io.callqa.CallEvent", newest)["id"]
    # encode with the version 1 schema and its id, decode with today's class
    buf = io.BytesIO()
    buf.write(HEADER.pack(0, v1["id"]))
    schemaless_writer(buf, parse_schema(v1["schema"]), {**CallEvent("c1", "end", at_ms=3).to_record(),
                                                       "event_type": "end"})
    back = serde.decode(buf.getvalue(), CallEvent)
    assert back.event_type == "end" and back.offset_ms == -1 and not back.is_hold_change
