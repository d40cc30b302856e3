"""AudioFrame bodies in Avro binary, written directly instead of through fastavro's generic path.

Audio frames are most of what callqa produces (50 per second per leg: a gateway at a thousand legs writes
50,000 a second), and the generic path costs a ``dataclasses.asdict`` (a deep copy of the payload) plus
fastavro's schema walk per frame: about 10 µs, a quarter of a gateway's CPU per frame. The record is
fixed, so its encoding is a handful of varints and two length-prefixed byte strings. The writer is only
used when the schema on file is exactly the one it was written for (``matches``); the test suite checks
its bytes against fastavro's on many frames, and any other schema goes the generic way.
"""

from __future__ import annotations

from typing import Any

from pipeline.contracts.messages import AudioFrame

# The AudioFrame schema this writer encodes: field names and types in order (enums by their symbols).
FIELDS: tuple[tuple[str, Any], ...] = (
    ("call_id", "string"),
    ("leg", ("enum", ("agent", "customer"))),
    ("seq", "long"),
    ("start_ms", "long"),
    ("sample_rate", "int"),
    ("encoding", ("enum", ("pcm16", "mulaw", "alaw"))),
    ("payload", "bytes"),
    ("produced_at_ms", "long"),
)
_SMALL = 1 << 13  # non-negative longs below this are at most two bytes: a table of them
_LEGS = {name: i for i, name in enumerate(FIELDS[1][1][1])}
_ENCODINGS = {name: i for i, name in enumerate(FIELDS[5][1][1])}


def _shape(field_type: Any) -> Any:
    if isinstance(field_type, dict) and field_type.get("type") == "enum":
        return ("enum", tuple(field_type["symbols"]))
    return field_type


def matches(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` (an .avsc as loaded) is the record this writer encodes."""
    fields = schema.get("fields", [])
    return tuple((f.get("name"), _shape(f.get("type"))) for f in fields) == FIELDS


def long_bytes(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    if 0 <= n < _SMALL:
        return _SMALL_BYTES[n]
    return _varint((n << 1) ^ (n >> 63))


def _varint(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_BYTES = tuple(_varint(n << 1) for n in range(_SMALL))


class AudioFrameWriter:
    """Encodes ``AudioFrame`` bodies; keeps the encoded call ID of the calls it saw last (a frame's call ID
    repeats for every frame of the call)."""

    MAX_CACHED_CALLS = 4096

    def __init__(self) -> None:
        self._call_ids: dict[str, bytes] = {}

    def body(self, frame: AudioFrame) -> bytes:
        call = self._call_ids.get(frame.call_id)
        if call is None:
            raw = frame.call_id.encode()
            call = long_bytes(len(raw)) + raw
            if len(self._call_ids) >= self.MAX_CACHED_CALLS:
                self._call_ids.clear()
            self._call_ids[frame.call_id] = call
        try:
            leg, encoding = _LEGS[frame.leg], _ENCODINGS[frame.encoding]
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} is not a symbol of its enum") from None
        payload = frame.payload
        return b"".join((call, long_bytes(leg), long_bytes(frame.seq), long_bytes(frame.start_ms),
                         long_bytes(frame.sample_rate), long_bytes(encoding), long_bytes(len(payload)), payload,
                         long_bytes(frame.produced_at_ms)))
