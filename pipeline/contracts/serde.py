"""Avro (fastavro) in the Confluent wire format: magic byte 0, 4-byte big-endian schema id, body.

Any Confluent-compatible consumer can read what callqa writes, given the same registry.
"""

from __future__ import annotations

import io
import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from pipeline.contracts import frame_codec
from pipeline.contracts.messages import ALL_MESSAGES, AudioFrame, Message
from pipeline.contracts.registry import (
    ConfluentSchemaRegistry,
    FileSchemaRegistry,
    RegistryError,
    SchemaRegistry,
)

MAGIC = 0
HEADER = struct.Struct(">bI")
M = TypeVar("M", bound=Message)

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"


class ContractError(ValueError):
    """A message does not match its contract; the message says what and where."""


def load_schema_files(schemas_dir: Path = SCHEMAS_DIR) -> dict[str, dict[str, Any]]:
    """Full record name -> schema dict, for every .avsc in the folder."""
    out = {}
    for path in sorted(schemas_dir.glob("*.avsc")):
        schema = json.loads(path.read_text())
        out[f"{schema['namespace']}.{schema['name']}"] = schema
    return out


class Serde:
    """Encodes and decodes contract messages; one per process is plenty (it caches parsed schemas)."""

    def __init__(self, registry: SchemaRegistry, schemas_dir: Path = SCHEMAS_DIR) -> None:
        self.registry = registry
        self.schemas = load_schema_files(schemas_dir)
        self._parsed = {name: parse_schema(s) for name, s in self.schemas.items()}
        self._ids: dict[str, int] = {}
        # Writer schema by id: an id names one schema for good (registries never change what an id
        # means), and parsing it again for every 20 ms audio frame cost a JSON dump per message.
        self._writers: dict[int, tuple[str, Any]] = {}
        self._by_name = {cls.SCHEMA: cls for cls in ALL_MESSAGES}
        # Audio frames are most messages: written directly when the schema on file is the one the direct
        # writer knows (else the generic path, which any schema change falls back to).
        frames = self.schemas.get(AudioFrame.SCHEMA)
        self._frames = frame_codec.AudioFrameWriter() if frames and frame_codec.matches(frames) else None

    @classmethod
    def from_settings(cls, schema_registry_url: str = "", schemas_dir: Path = SCHEMAS_DIR) -> Serde:
        registry: SchemaRegistry
        if schema_registry_url:
            registry = ConfluentSchemaRegistry(schema_registry_url)
        else:
            registry = FileSchemaRegistry(schemas_dir / "registry.json")
        return cls(registry, schemas_dir)

    def schema_id(self, name: str) -> int:
        if name not in self._ids:
            self._ids[name] = self.registry.id_for(name, self.schemas[name])
        return self._ids[name]

    def encode(self, message: Message) -> bytes:
        name = message.SCHEMA
        if self._frames is not None and type(message) is AudioFrame:
            try:
                return HEADER.pack(MAGIC, self.schema_id(name)) + self._frames.body(message)
            except (ValueError, TypeError, AttributeError) as exc:
                raise ContractError(f"{name}: cannot encode: {exc}") from exc
        buf = io.BytesIO()
        buf.write(HEADER.pack(MAGIC, self.schema_id(name)))
        try:
            schemaless_writer(buf, self._parsed[name], message.to_record())
        except (ValueError, TypeError, KeyError) as exc:
            raise ContractError(f"{name}: cannot encode: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes, cls: type[M]) -> M:
        """Decode a message written under any registered version of ``cls``'s schema."""
        schema_id, writer_name, writer = self._writer(data)
        if writer_name != cls.SCHEMA:
            raise ContractError(f"expected {cls.SCHEMA}, got a {writer_name} message (schema id {schema_id})")
        return cls.from_record(self._body(data, schema_id, writer, self._parsed[cls.SCHEMA]))

    def decode_any(self, data: bytes) -> Message:
        """Decode whichever contract message the header's schema id names."""
        schema_id, writer_name, writer = self._writer(data)
        cls = self._by_name.get(writer_name)
        if cls is None:
            raise ContractError(f"schema {writer_name} (id {schema_id}) is not a callqa message")
        return cls.from_record(self._body(data, schema_id, writer, self._parsed.get(writer_name)))

    def _writer(self, data: bytes) -> tuple[int, str, Any]:
        if len(data) < HEADER.size:
            raise ContractError(f"message of {len(data)} bytes is shorter than the 5-byte wire header")
        magic, schema_id = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ContractError(f"magic byte is {magic}, not 0: not Confluent wire format")
        known = self._writers.get(schema_id)
        if known is None:
            try:
                writer_raw = self.registry.schema_for(schema_id)
            except RegistryError as exc:  # not cached: a later registration may still make it known
                raise ContractError(str(exc)) from exc
            name = f"{writer_raw['namespace']}.{writer_raw['name']}"
            known = self._writers[schema_id] = (name, _parse_cached(json.dumps(writer_raw, sort_keys=True)))
        return schema_id, known[0], known[1]

    @staticmethod
    def _body(data: bytes, schema_id: int, writer: Any, reader: Any) -> dict[str, Any]:
        try:
            record = schemaless_reader(io.BytesIO(data[HEADER.size:]), writer, reader)
        except Exception as exc:  # noqa: BLE001 - fastavro raises many types on corrupt input
            detail = str(exc)[:160]
            raise ContractError(f"schema id {schema_id}: corrupt Avro body: {type(exc).__name__}: {detail}") from exc
        if not isinstance(record, dict):
            raise ContractError(f"schema id {schema_id}: body is not a record")
        return record


@lru_cache(maxsize=256)
def _parse_cached(schema_json: str) -> Any:
    return parse_schema(json.loads(schema_json))
