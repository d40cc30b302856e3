"""Fixtures of the contract tests: messages as producers of an earlier schema version wrote them."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from pipeline.contracts.registry import FileSchemaRegistry
from pipeline.contracts.serde import SCHEMAS_DIR

WrittenBefore = Callable[[str, str, dict[str, Any]], bytes]


@pytest.fixture
def written_before() -> WrittenBefore:
    """``written_before(subject, field, record)``: ``record`` encoded, in the Confluent framing, under the
    newest registered version of ``subject`` that does not have ``field`` yet."""
    registry = FileSchemaRegistry(SCHEMAS_DIR / "registry.json")

    def write(subject: str, field: str, record: dict[str, Any]) -> bytes:
        ids = [e["id"] for e in registry._entries if e["subject"] == subject]
        schema_id = max(i for i in ids if field not in {f["name"] for f in registry.schema_for(i)["fields"]})
        body = io.BytesIO()
        schemaless_writer(body, parse_schema(registry.schema_for(schema_id)), record)
        return struct.pack(">bI", 0, schema_id) + body.getvalue()

    return write
