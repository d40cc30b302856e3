"""multipart/mixed SIP bodies (RFC 2046 §5.1): a SIPREC INVITE carries its SDP offer and its recording
metadata (RFC 7866 §6.1) as two parts of one body, told apart by Content-Type and Content-Disposition.

This module owns splitting such a body into its parts and writing one (for the project's own SIPREC
client). Bodies come off the network: the split is bounded (size, parts, part headers), refuses nested
multiparts (SIPREC never needs them and they multiply the work), and raises only :class:`BodyError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.gateway.siprec.message import unquote_at

MAX_BODY_BYTES = 128 * 1024  # an SDP (<= 16 KB) and metadata (<= 64 KB), with room to spare
MAX_PARTS = 8
MAX_PART_HEADER_BYTES = 4096
MAX_PART_HEADERS = 32
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1
DEFAULT_PART_TYPE = "text/plain"  # RFC 2046 §5.1: a part without Content-Type

_TOKEN = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+")
_MEDIA_TYPE = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+/[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+")
_BOUNDARY_CHARS = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]*[0-9A-Za-z'()+_,\-./:=?]")
_HEADER_END = re.compile(rb"\r?\n\r?\n")


class BodyError(ValueError):
    """A body we cannot split into parts; the message says which part and what is wrong."""


@dataclass(frozen=True)
class BodyPart:
    content_type: str  # lower-case, no parameters ("application/sdp")
    disposition: str  # lower-case disposition type ("recording-session"), "" when none
    body: bytes


def body_parts(content_type: str, body: bytes) -> list[BodyPart]:
    """The parts of a SIP body: one for a single-type body, each part of a multipart/mixed one."""
    if len(body) > MAX_BODY_BYTES:
        raise BodyError(f"body: {len(body)} bytes, more than {MAX_BODY_BYTES}")
    media_type, params = parse_content_type(content_type)
    if not media_type.startswith("multipart/"):
        return [BodyPart(media_type, "", body)]
    if media_type != "multipart/mixed":
        raise BodyError(f"body: {media_type} is not supported, only multipart/mixed")
    boundary = params.get("boundary")
    if boundary is None:
        raise BodyError("body: multipart/mixed without a boundary parameter")
    _check_boundary(boundary)
    return [_part(number, raw) for number, raw in enumerate(_split(body, boundary.encode("latin-1")), start=1)]


def multipart(parts: Sequence[BodyPart], boundary: str) -> tuple[str, bytes]:
    """(Content-Type header value, body) of a multipart/mixed body holding ``parts`` in order."""
    _check_boundary(boundary)
    if not 0 < len(parts) <= MAX_PARTS:
        raise BodyError(f"body: needs 1-{MAX_PARTS} parts, got {len(parts)}")
    delimiter = b"--" + boundary.encode("ascii")
    chunks: list[bytes] = []
    for number, part in enumerate(parts, start=1):
        if _MEDIA_TYPE.fullmatch(part.content_type) is None:
            raise BodyError(f"body part {number}: content type {part.content_type!r} is not type/subtype")
        if part.disposition and _TOKEN.fullmatch(part.disposition) is None:
            raise BodyError(f"body part {number}: disposition {part.disposition!r} is not a token")
        if _delimiter_pattern(delimiter).search(b"\r\n" + part.body) is not None:
            raise BodyError(f"body part {number}: contains the boundary")
        headers = f"Content-Type: {part.content_type}\r\n"
        if part.disposition:
            headers += f"Content-Disposition: {part.disposition}\r\n"
        chunks.append(delimiter + b"\r\n" + headers.encode("ascii") + b"\r\n" + part.body + b"\r\n")
    body = b"".join(chunks) + delimiter + b"--\r\n"
    quoted = boundary if _TOKEN.fullmatch(boundary) else '"' + boundary + '"'
    return f"multipart/mixed;boundary={quoted}", body


def parse_content_type(value: str) -> tuple[str, dict[str, str]]:
    """(lower-case type/subtype, parameters by lower-case name) of a Content-Type value."""
    media_type, _, rest = value.partition(";")
    media_type = media_type.strip().lower()
    if _MEDIA_TYPE.fullmatch(media_type) is None:
        raise BodyError(f"body: content type {media_type[:40]!r} is not type/subtype")
    return media_type, _parameters(rest)


def _parameters(text: str) -> dict[str, str]:
    """``name=value`` pairs separated by ';', a value a token or a quoted string (with \\ escapes)."""
    params: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        if text[pos] in " \t;":
            pos += 1
            continue
        name_match = _TOKEN.match(text, pos)
        if name_match is None:
            raise BodyError(f"body: bad parameter in content type at character {pos}")
        name = name_match.group().lower()
        pos = _skip_space(text, name_match.end())
        if pos >= len(text) or text[pos] != "=":
            raise BodyError(f"body: content type parameter {name[:20]!r} has no value")
        pos = _skip_space(text, pos + 1)
        value, pos = _parameter_value(text, pos, name)
        params.setdefault(name, value)
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] != ";":
            raise BodyError(f"body: content type parameter {name[:20]!r} is followed by {text[pos]!r}")
    return params


def _parameter_value(text: str, pos: int, name: str) -> tuple[str, int]:
    if pos < len(text) and text[pos] == '"':
        quoted = unquote_at(text, pos + 1)
        if quoted is None:
            raise BodyError(f"body: content type parameter {name[:20]!r} has an unclosed quote")
        return quoted
    value_match = _TOKEN.match(text, pos)
    if value_match is None:
        raise BodyError(f"body: content type parameter {name[:20]!r} has an empty value")
    return value_match.group(), value_match.end()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _check_boundary(boundary: str) -> None:
    if not 0 < len(boundary) <= MAX_BOUNDARY or _BOUNDARY_CHARS.fullmatch(boundary) is None:
        raise BodyError(f"body: boundary {boundary[:80]!r} is not 1-{MAX_BOUNDARY} boundary characters")


def _delimiter_pattern(delimiter: bytes) -> re.Pattern[bytes]:
    # A delimiter line starts a line (the CRLF before it belongs to it, RFC 2046 §5.1.1), may end in
    # "--" (the close delimiter) and in transport padding. Peers that write bare LF are read too.
    return re.compile(rb"(?:\A|\r?\n)" + re.escape(delimiter) + rb"(--)?[ \t]*(?:\r?\n|\Z)")


def _split(body: bytes, boundary: bytes) -> list[bytes]:
    """The raw parts between the delimiters (preamble and epilogue dropped)."""
    parts: list[bytes] = []
    start: int | None = None
    for match in _delimiter_pattern(b"--" + boundary).finditer(body):
        if start is not None:
            if len(parts) == MAX_PARTS:
                raise BodyError(f"body: more than {MAX_PARTS} parts")
            parts.append(body[start:match.start()])
        if match.group(1) is not None:
            if not parts:
                raise BodyError("body: multipart/mixed with no parts")
            return parts
        start = match.end()
    if start is None:
        raise BodyError("body: the boundary never appears")
    raise BodyError("body: no closing delimiter")


def _part(number: int, raw: bytes) -> BodyPart:
    end = _HEADER_END.search(b"\n" + raw)
    if end is None:
        raise BodyError(f"body part {number}: no blank line after its headers")
    header_block = raw[: max(end.start() - 1, 0)]
    if len(header_block) > MAX_PART_HEADER_BYTES:
        raise BodyError(f"body part {number}: headers longer than {MAX_PART_HEADER_BYTES} bytes")
    headers = _part_headers(number, header_block.decode("latin-1"))
    content_type = DEFAULT_PART_TYPE
    if "content-type" in headers:
        try:
            content_type = parse_content_type(headers["content-type"])[0]
        except BodyError as error:
            raise BodyError(f"body part {number}: {error}") from None
    if content_type.startswith("multipart/"):
        raise BodyError(f"body part {number}: nested {content_type} is refused")
    disposition = headers.get("content-disposition", "").partition(";")[0].strip().lower()
    return BodyPart(content_type, disposition, raw[end.end() - 1:])


def _part_headers(number: int, block: str) -> dict[str, str]:
    """Part headers by lower-case name; folded lines (leading space) continue the previous one."""
    headers: dict[str, str] = {}
    last = ""
    lines = block.replace("\r\n", "\n").split("\n") if block else []
    if len(lines) > MAX_PART_HEADERS:
        raise BodyError(f"body part {number}: more than {MAX_PART_HEADERS} header lines")
    for line in lines:
        if line[:1] in (" ", "\t") and last:
            headers[last] += " " + line.strip()
            continue
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or _TOKEN.fullmatch(name) is None:
            raise BodyError(f"body part {number}: header line {line[:40]!r} is not 'Name: value'")
        headers.setdefault(name, value.strip())
        last = name
    return headers
