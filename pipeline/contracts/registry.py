"""Schema ids for the Confluent wire format: from a Schema Registry, or from schemas/registry.json.

Subjects follow the record-name strategy (``io.callqa.AudioFrame``) because one topic (QA) carries
more than one record type. The file registry keeps every version ever registered, with its full
schema, so messages written under an old id stay readable after the .avsc file moves on.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from fastavro.schema import fingerprint, to_parsing_canonical_form


class RegistryError(RuntimeError):
    """A schema id could not be found or registered; the message names the subject or id."""


def schema_fingerprint(schema: dict[str, Any]) -> str:
    return str(fingerprint(to_parsing_canonical_form(schema), "SHA-256"))


class SchemaRegistry(Protocol):
    def id_for(self, subject: str, schema: dict[str, Any]) -> int: ...

    def schema_for(self, schema_id: int) -> dict[str, Any]: ...


class FileSchemaRegistry:
    """Schema ids kept in a JSON file in the repository (the default: no registry server needed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        if path.exists():
            self._entries = json.loads(path.read_text())["schemas"]

    def id_for(self, subject: str, schema: dict[str, Any]) -> int:
        fp = schema_fingerprint(schema)
        for entry in self._entries:
            if entry["subject"] == subject and entry["fingerprint"] == fp:
                return int(entry["id"])
        raise RegistryError(
            f"schema {subject} (fingerprint {fp[:12]}) is not in {self.path}; run `callqa schemas register`"
        )

    def schema_for(self, schema_id: int) -> dict[str, Any]:
        for entry in self._entries:
            if entry["id"] == schema_id:
                return dict(entry["schema"])
        raise RegistryError(f"schema id {schema_id} is not in {self.path}")

    def register(self, subject: str, schema: dict[str, Any]) -> tuple[int, bool]:
        """Return (id, created): an unchanged schema keeps its id, a changed one gets the next id."""
        with self._lock:
            try:
                return self.id_for(subject, schema), False
            except RegistryError:
                pass
            new_id = max((e["id"] for e in self._entries), default=0) + 1
            version = 1 + sum(1 for e in self._entries if e["subject"] == subject)
            self._entries.append(
                {"id": new_id, "subject": subject, "version": version,
                 "fingerprint": schema_fingerprint(schema), "schema": schema}
            )
            self.save()
            return new_id, True

    def save(self) -> None:
        doc = {
            "doc": "Schema ids for the Confluent wire format when no Schema Registry is configured. "
                   "Written by `callqa schemas register`; every version is kept so old messages stay readable.",
            "schemas": self._entries,
        }
        self.path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")


class ConfluentSchemaRegistry:
    """A Confluent-compatible Schema Registry over its REST API (stdlib HTTP, cached)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, dict[str, Any]] = {}

    def id_for(self, subject: str, schema: dict[str, Any]) -> int:
        key = (subject, schema_fingerprint(schema))
        if key not in self._ids:
            body = json.dumps({"schema": json.dumps(schema)}).encode()
            reply = self._call("POST", f"/subjects/{subject}/versions", body)
            self._ids[key] = int(reply["id"])
        return self._ids[key]

    def schema_for(self, schema_id: int) -> dict[str, Any]:
        if schema_id not in self._schemas:
            reply = self._call("GET", f"/schemas/ids/{schema_id}", None)
            self._schemas[schema_id] = json.loads(reply["schema"])
        return self._schemas[schema_id]

    def _call(self, method: str, path: str, body: bytes | None) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path, data=body, method=method,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - configured URL
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryError(f"schema registry {self.url}{path}: {exc}") from exc
