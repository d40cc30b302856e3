"""The direct AudioFrame writer writes exactly fastavro's bytes, and refuses what fastavro refuses."""

from __future__ import annotations

import io
import json
import random

import pytest
from fastavro import parse_schema, schemaless_writer

from pipeline.contracts import ContractError, Serde
from pipeline.contracts.frame_codec import AudioFrameWriter, matches
from pipeline.contracts.messages import AudioFrame
from pipeline.contracts.serde import HEADER, SCHEMAS_DIR, load_schema_files

SCHEMA = load_schema_files()[AudioFrame.SCHEMA]


def fastavro_body(frame: AudioFrame) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(SCHEMA), frame.to_record())
    return buf.getvalue()


def random_frames(n: int) -> list[AudioFrame]:
    rng = random.Random(7)
    edges = [0, 1, 63, 64, 127, 128, 8191, 8192, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -1, -64, -65, -(2**63)]
    frames = []
    for i in range(n):
        call = rng.choice([f"CA{rng.getrandbits(128):032x}", "", "é-appel-ü", "x" * 300])
        frames.append(AudioFrame(
            call, rng.choice(["agent", "customer"]), edges[i % len(edges)] if i % 3 == 0 else rng.randrange(10**7),
            rng.randrange(10**9), rng.choice([8000, 16000, 0]), rng.choice(["pcm16", "mulaw", "alaw"]),
            rng.randbytes(rng.choice([0, 1, 160, 320, 5000])), rng.choice([1_764_000_000_000 + i, 0, 2**63 - 1])))
    return frames


def test_the_schema_on_file_is_the_one_the_writer_knows() -> None:
    assert matches(SCHEMA)
    changed = json.loads(json.dumps(SCHEMA))
    changed["fields"][4]["type"] = "long"
    assert not matches(changed)


def test_bytes_equal_fastavro_on_many_frames() -> None:
    writer = AudioFrameWriter()
    for frame in random_frames(600):
        assert writer.body(frame) == fastavro_body(frame), frame


def test_serde_uses_it_and_reads_back() -> None:
    serde = Serde.from_settings("", SCHEMAS_DIR)
    for frame in random_frames(50):
        data = serde.encode(frame)
        assert data[HEADER.size:] == fastavro_body(frame)
        assert serde.decode(data, AudioFrame) == frame


def test_a_bad_frame_is_a_contract_error_naming_the_message() -> None:
    serde = Serde.from_settings("", SCHEMAS_DIR)
    bad = AudioFrame("c1", "supervisor", 0, 0, 8000, "mulaw", b"\xff")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="AudioFrame.*supervisor"):
        serde.encode(bad)
    with pytest.raises(ContractError, match="AudioFrame"):
        serde.encode(AudioFrame("c1", "agent", "seven", 0, 8000, "mulaw", b"\xff"))  # type: ignore[arg-type]
