"""Avro contracts: every schema round-trips in the Confluent framing; old messages stay readable."""

from __future__ import annotations

import copy
import io
import json
import struct
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer

from pipeline.contracts import (
    AudioFrame,
    CallEvent,
    CallQA,
    ContractError,
    DeadLetter,
    LatencyMetric,
    QaAlert,
    QaEvent,
    QaItem,
    Serde,
    TranscriptSegment,
)
from pipeline.contracts.messages import (
    ALL_MESSAGES,
    CallCheckpoint,
    CheckpointSegment,
    JobHold,
    LegCheckpoint,
    LiveCall,
    PostCallJob,
)
from pipeline.contracts.registry import FileSchemaRegistry
from pipeline.contracts.serde import SCHEMAS_DIR, load_schema_files

EXAMPLES = [
    AudioFrame("c1", "agent", 7, 140, 8000, "mulaw", b"\xff\x7f" * 80, produced_at_ms=1_700_000_000_000),
    CallEvent("c1", "end", tenant="t", agent_id="a7", queue="billing", direction="outbound",
              legs=["agent", "customer"], frame_counts={"agent": 10, "customer": 9}, at_ms=5),
    CallEvent("c2", "abort", reason="gateway hung up"),
    TranscriptSegment("c1:agent:140", "c1", "agent", 140, 2300, "hello there", True, 0.875, -0.125, 0.015625,
                      "tiny.en", 1, redactions=2, batch_size=8, batcher_wait_ms=12.5, inference_ms=80.25),
    LatencyMetric("c1:agent:140", "c1", "customer", False, 3.5, 12.0, 8, 80.0, 410.0, worker_id="w1"),
    CallQA("c1", 87.5, False, {"silence_pct": 12.5}, [QaItem("Greeted?", 10.0, True, "greeting at 1.2 s")],
           [QaEvent("greeting", "opening", "agent", "match", 1200, "hello")], tenant="t", agent_id="a7"),
    QaAlert("c1", "escalation", "intent", "customer", "alert", 31_000, "speak to a manager"),
    LiveCall("c1", 1_772_443_770_000, 1_772_443_800_000, tenant="t", agent_id="a7", queue="billing", call_ms=30_000,
             agent_talk_ms=12_000, customer_talk_ms=9_500, silence_ms=8_500, turns=9, customer_sentiment=-1.25,
             customer_trend="worsening", customer_scores=[0.5, -0.75, -2.0], alerts=1,
             last_alert_rule="escalation", last_alert_severity="warning", last_alert_ms=27_300, on_hold=True),
    DeadLetter("callqa.audio-frames", 3, 1234, "bad payload", b"\x01\x02", key=b"c1", error_type="ContractError",
               call_id="c1", raw_kind="message"),
    DeadLetter("callqa.audio-frames", 3, -1, "segment c1/agent/000000140: inference failed", call_id="c1",
               leg="agent", segment_id="c1/agent/000000140", start_ms=140, end_ms=2300),
    CallCheckpoint("c1", "open", taken_at_ms=5, resume_offset=812, has_start=True, tenant="t", agent_id="a7",
                   segments_done=1, segments=[CheckpointSegment("c1/agent/000000140", "agent", 140, 2300, "hello")],
                   legs=[LegCheckpoint("agent", 8000, "mulaw", 20, 120, 120, 19200, 37800, b"\x00" * 8, b"\x00" * 1024,
                                       b"\x00" * 256, b"", 75, 36000, 1, 33000, b"\x00" * 64)]),
    CallCheckpoint("c2", "finished"),
    PostCallJob("c1", 1, "moonshine-base", "callqa.audio-frames", 3, 1_772_443_770_000, 9_812,
                {"agent": 3000, "customer": 2990}, tenant="t", agent_id="a7", queue="billing", started_at_ms=5,
                ended_at_ms=60_005, end_reason="end", audio_ms=60_000, holds=[JobHold(10_000, 25_000)],
                live_score_pct=85.0, live_auto_failed=False, requested_at_ms=60_010),
]


@pytest.fixture(scope="module")
def serde() -> Serde:
    return Serde.from_settings()


def test_dead_letters_written_under_version_1_still_read(serde: Serde) -> None:
    """Version 1 always carried the raw bytes and had no reference fields: they read with their defaults."""
    registry = FileSchemaRegistry(SCHEMAS_DIR / "registry.json")
    v1_id = min(e["id"] for e in registry._entries if e["subject"] == DeadLetter.SCHEMA)
    v1 = registry.schema_for(v1_id)
    assert "call_id" not in {f["name"] for f in v1["fields"]} and v1_id != serde.schema_id(DeadLetter.SCHEMA)
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(v1), {
        "original_topic": "callqa.audio-frames", "original_partition": 3, "original_offset": 1234, "key": b"c1",
        "reason": "bad payload", "error_type": "ContractError", "raw": b"\x01\x02", "worker_id": "w1",
        "failed_at_ms": 5,
    })
    letter = serde.decode(struct.pack(">bI", 0, v1_id) + body.getvalue(), DeadLetter)
    assert letter == DeadLetter("callqa.audio-frames", 3, 1234, "bad payload", b"\x01\x02", key=b"c1",
                                error_type="ContractError", worker_id="w1", failed_at_ms=5)
    assert (letter.call_id, letter.leg, letter.start_ms, letter.end_ms) == ("", "", -1, -1)


def test_a_dead_letter_carries_no_payload_unless_given_one(serde: Serde) -> None:
    letter = serde.decode_any(serde.encode(DeadLetter("callqa.call-events", 0, 7, "undecodable", call_id="c9")))
    assert isinstance(letter, DeadLetter) and letter.raw is None and letter.key is None


def test_examples_cover_every_contract() -> None:
    assert {type(m) for m in EXAMPLES} == set(ALL_MESSAGES)
    assert {m.SCHEMA for m in ALL_MESSAGES} == set(load_schema_files())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_in_confluent_framing(serde: Serde, message) -> None:  # type: ignore[no-untyped-def]
    data = serde.encode(message)
    magic, schema_id = struct.unpack(">bI", data[:5])
    assert magic == 0
    assert schema_id == serde.schema_id(message.SCHEMA)
    assert serde.decode(data, type(message)) == message
    assert serde.decode_any(data) == message


def test_registry_file_matches_schema_files() -> None:
    """A changed .avsc without `callqa schemas register` would make every producer fail: catch it here."""
    registry = FileSchemaRegistry(SCHEMAS_DIR / "registry.json")
    ids = [registry.id_for(name, schema) for name, schema in load_schema_files().items()]
    assert len(set(ids)) == len(ids)


def test_reader_on_newer_schema_reads_old_messages(tmp_path: Path) -> None:
    """Write with today's TranscriptSegment, read with a v2 that adds a field with a default."""
    schemas_v1 = tmp_path / "v1"
    schemas_v1.mkdir()
    for path in SCHEMAS_DIR.glob("*.avsc"):
        (schemas_v1 / path.name).write_text(path.read_text())
    registry = FileSchemaRegistry(tmp_path / "registry.json")
    old = Serde(registry, schemas_v1)
    for name, schema in old.schemas.items():
        registry.register(name, schema)
    msg = EXAMPLES[3]
    data = old.encode(msg)

    schemas_v2 = tmp_path / "v2"
    schemas_v2.mkdir()
    for path in schemas_v1.glob("*.avsc"):
        (schemas_v2 / path.name).write_text(path.read_text())
    v2 = json.loads((schemas_v1 / "TranscriptSegment.avsc").read_text())
    v2["fields"].append({"name": "language", "type": "string", "default": "en"})
    (schemas_v2 / "TranscriptSegment.avsc").write_text(json.dumps(v2))
    new_id, created = registry.register("io.callqa.TranscriptSegment", v2)
    assert created and new_id != old.schema_id(msg.SCHEMA)

    new = Serde(FileSchemaRegistry(tmp_path / "registry.json"), schemas_v2)
    schema_id, _, writer = new._writer(data)
    record = new._body(data, schema_id, writer, new._parsed[msg.SCHEMA])
    assert record["language"] == "en"  # the new field's default fills in
    assert record["text"] == msg.text
    assert new.decode(data, TranscriptSegment) == msg
    # and a message written under v2 carries the new id
    assert struct.unpack(">bI", new.encode(msg)[:5])[1] == new_id


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x00\x00", "shorter than the 5-byte wire header"),
        (b"\x01\x00\x00\x00\x01abc", "magic byte is 1"),
        (b"\x00\x00\x00\x03\xe7abc", "schema id 999"),
        (b"\x00\x00\x00\x00\x01\x99", "corrupt Avro body"),
    ],
)
def test_bad_bytes_get_a_clear_error(serde: Serde, data: bytes, expected: str) -> None:
    with pytest.raises(ContractError, match=expected):
        serde.decode(data, AudioFrame)


def test_wrong_type_is_named(serde: Serde) -> None:
    data = serde.encode(EXAMPLES[0])
    with pytest.raises(ContractError, match="expected io.callqa.CallEvent, got a io.callqa.AudioFrame"):
        serde.decode(data, CallEvent)


def test_encode_rejects_a_message_that_breaks_its_schema(serde: Serde) -> None:
    bad = copy.copy(EXAMPLES[0])
    bad.leg = "supervisor"  # type: ignore[assignment]
    with pytest.raises(ContractError, match="AudioFrame"):
        serde.encode(bad)
