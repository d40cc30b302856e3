"""HTTP byte ranges (RFC 9110 §14) for the recordings the API serves: a browser's <audio> asks for ``bytes=0-``
first and then seeks with ``bytes=N-``; Safari will not play a file served without ranges."""

from __future__ import annotations

import re
from dataclasses import dataclass

# ASCII digits only (``\d`` takes any script's), of any length: a position past what int() should parse is past
# the end of any file (_position).
_RANGE = re.compile(r"^\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*$", re.ASCII)
_MAX_DIGITS = 18  # 10**18 bytes: past any recording, and far inside int()'s limit on digits


class RangeNotSatisfiable(ValueError):
    """A range that starts past the end (416)."""


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # exclusive
    size: int  # of the whole

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end - 1}/{self.size}"


def byte_range(header: str | None, size: int) -> ByteRange | None:
    """The one range ``header`` asks of ``size`` bytes; None for the whole (no header, a form this does not
    serve: several ranges, other units, which a server may answer with the whole). RangeNotSatisfiable past
    the end."""
    m = _RANGE.match(header or "")
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:  # the last N bytes
        n = _position(last)
        if n == 0:
            raise RangeNotSatisfiable(f"bytes */{size}")
        return ByteRange(max(0, size - n), size, size)
    start = _position(first)
    if start >= size:
        raise RangeNotSatisfiable(f"bytes */{size}")
    end = size if not last else min(size, _position(last) + 1)
    if end <= start:
        return None
    return ByteRange(start, end, size)


def _position(digits: str) -> int:
    """A byte position or length as the header writes it; one too long to be a file's is 10**18 (leading zeros
    are not length)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS
