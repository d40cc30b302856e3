"""SIP messages (RFC 3261 §7): parsing what arrives, building what the recording server answers.

Bounded and strict where a wrong guess would cost a call or the server: a message of at most
``MAX_MESSAGE_BYTES``, at most ``MAX_HEADERS`` header lines, a request must carry the five headers a
transaction is matched by (Via, From, To, Call-ID, CSeq) and a CSeq whose method is the request's. What
cannot be parsed raises ``SipError``; when enough was read to address a reply (those five headers), the
error carries the partial message so the server answers 400 instead of staying silent (an SBC would
otherwise retransmit it for 32 s). Compact header forms (RFC 3261 §7.3.3) are expanded on the way in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 64 * 1024  # an INVITE with SDP and metadata is 2-5 KB; more is an attack or a bug
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100
COMPACT = {"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact", "l": "content-length",
           "c": "content-type", "k": "supported", "s": "subject", "e": "content-encoding", "x": "session-expires"}
CANONICAL = {"call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate"}
REQUIRED = ("via", "from", "to", "call-id", "cseq")
_TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")
_STATUS_LINE = re.compile(r"^SIP/2\.0 ([0-9]{3}) (.*)$")
MAX_NUMBER_DIGITS = 10  # CSeq (< 2**31) and Content-Length (<= 64 KB) both fit; more is hostile
_REQUEST_LINE = re.compile(r"^([A-Za-z0-9.!%*_+`'~-]+) (\S+) SIP/2\.0$")
REASONS = {100: "Trying", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 415: "Unsupported Media Type", 420: "Bad Extension",
           481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 486: "Busy Here",
           487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending",
           500: "Server Internal Error", 503: "Service Unavailable", 513: "Message Too Large"}


class SipError(ValueError):
    """A message that cannot be taken: ``status`` is the answer's, ``partial`` the message as far as it
    was read when it holds what a reply needs (else None: the datagram is dropped)."""

    def __init__(self, detail: str, status: int = 400, partial: SipMessage | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.partial = partial


@dataclass
class SipMessage:
    """A request (``method``, ``uri``) or a response (``status``, ``reason``) with its headers in order
    (lower-case names) and body."""

    method: str = ""
    uri: str = ""
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return bool(self.method)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for n, v in self.headers if n == name), None)

    def all(self, name: str) -> list[str]:
        """Every value of header ``name``, comma-separated lists split (Via, Require, Supported, ...)."""
        name = name.lower()
        return [item for n, v in self.headers if n == name for item in split_list(v)]

    @property
    def call_id(self) -> str:
        return self.header("call-id") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        written, _, method = (self.header("cseq") or "").partition(" ")
        return number(written) or 0, method.strip().upper()  # a request's CSeq was checked by parse()

    @property
    def branch(self) -> str:
        """The top Via's branch: what a request's transaction is matched by (RFC 3261 §17.2.3)."""
        via = self.all("via")
        return param(via[0], "branch") or "" if via else ""

    def to_bytes(self) -> bytes:
        first = f"{self.method} {self.uri} SIP/2.0" if self.is_request else f"SIP/2.0 {self.status} {self.reason}"
        lines = [first]
        lines += [f"{_canonical(n)}: {v}" for n, v in self.headers if n != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


def _canonical(name: str) -> str:
    return CANONICAL.get(name) or "-".join(part.capitalize() for part in name.split("-"))


def split_list(value: str) -> list[str]:
    """A header value's comma-separated items, commas inside quotes or <> kept."""
    items: list[str] = []
    current: list[str] = []
    quoted = angle = False
    escaped = False
    for ch in value:
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "<" and not quoted:
            angle = True
        elif ch == ">" and not quoted:
            angle = False
        elif ch == "," and not quoted and not angle:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    items.append("".join(current).strip())
    return [i for i in items if i]


def unquote_at(text: str, pos: int) -> tuple[str, int] | None:
    """The unescaped text of the quoted string whose opening quote is just before ``pos`` and the position
    after its closing quote; None when it is never closed (each caller refuses that with its own error)."""
    out: list[str] = []
    while pos < len(text):
        char = text[pos]
        if char == "\\" and pos + 1 < len(text):
            out.append(text[pos + 1])
            pos += 2
        elif char == '"':
            return "".join(out), pos + 1
        else:
            out.append(char)
            pos += 1
    return None


def param(value: str, name: str) -> str | None:
    """A ``;name=value`` parameter of a header value (outside its <URI>), or None."""
    tail = value.rsplit(">", 1)[-1] if ">" in value else value
    for part in tail.split(";")[1:]:
        key, _, val = part.partition("=")
        if key.strip().lower() == name:
            return val.strip().strip('"')
    return None


def uri_of(value: str) -> str:
    """The URI in a From/To/Contact value: inside <> if present, else up to its first parameter."""
    if "<" in value and ">" in value:
        return value[value.index("<") + 1:value.index(">")]
    return value.split(";", 1)[0].strip()


def user_of(uri: str) -> str:
    """The user part of ``sip:user@host`` (empty when it has none)."""
    rest = uri.split(":", 1)[1] if ":" in uri else uri
    return rest.split("@", 1)[0] if "@" in rest else ""


def parse(data: bytes, stream: bool = False) -> SipMessage:
    """One message. ``stream`` (TCP/TLS): Content-Length is required and the data is exactly one message."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipError(f"message of {len(data)} bytes, more than {MAX_MESSAGE_BYTES}", 513)
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = data.partition(b"\n\n")
    if len(head) > MAX_HEADER_BYTES:
        raise SipError(f"headers of {len(head)} bytes, more than {MAX_HEADER_BYTES}", 513)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipError("headers are not UTF-8") from None
    lines = _unfold(text.replace("\r\n", "\n").split("\n"))
    if not lines or not lines[0]:
        raise SipError("empty message")
    msg = _start_line(lines[0])
    if len(lines) - 1 > MAX_HEADERS:
        raise SipError(f"more than {MAX_HEADERS} header lines", 513)
    problems = []
    for i, line in enumerate(lines[1:], start=2):
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not _TOKEN.match(name):
            problems.append(f"line {i} is not a header: {line[:40]!r}")
            continue
        msg.headers.append((COMPACT.get(name, name), value.strip()))
    msg.body = _body(msg, body, stream, problems)
    _check(msg, problems)
    return msg


def _unfold(lines: list[str]) -> list[str]:
    """Header lines with their continuation lines (starting with space or tab) joined (RFC 3261 §7.3.1)."""
    out: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def _start_line(line: str) -> SipMessage:
    status = _STATUS_LINE.match(line)
    if status:
        return SipMessage(status=int(status.group(1)), reason=status.group(2))
    request = _REQUEST_LINE.match(line)
    if request is None:
        raise SipError(f"not a SIP request or status line: {line[:60]!r}")
    return SipMessage(method=request.group(1).upper(), uri=request.group(2))


def _body(msg: SipMessage, body: bytes, stream: bool, problems: list[str]) -> bytes:
    length = msg.header("content-length")
    if length is None:
        if stream:
            problems.append("Content-Length is required over TCP/TLS")
        return body
    n = number(length)
    if n is None:
        problems.append(f"Content-Length is not a number: {length[:20]!r}")
        return b""
    if n > len(body):
        problems.append(f"Content-Length {n} but {len(body)} body bytes")
        return body
    return body[:n]


def number(text: str | bytes, max_digits: int = MAX_NUMBER_DIGITS) -> int | None:
    """A decimal number written in ASCII digits (at most ``max_digits`` of them), else None: ``str.isdigit``
    also takes Unicode digits that ``int`` refuses, and ``int`` refuses thousands of digits, so checking
    with one and converting with the other lets a ValueError escape."""
    text = text.strip()
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def _check(msg: SipMessage, problems: list[str]) -> None:
    if msg.is_request:
        missing = [h for h in REQUIRED if msg.header(h) is None]
        if missing:
            raise SipError(f"{msg.method} without {', '.join(missing)}")  # no reply can be addressed
        written, _, method = (msg.header("cseq") or "").partition(" ")
        cseq = number(written)
        if cseq is None or cseq >= 2**31:
            problems.append(f"CSeq number is not a number below 2**31: {written[:20]!r}")
        elif method.strip().upper() != msg.method:
            problems.append(f"CSeq method {method.strip()[:20]!r} is not the request's {msg.method}")
        if not msg.branch:
            problems.append("the top Via has no branch parameter")
    if problems:
        raise SipError("; ".join(problems), partial=msg if msg.is_request else None)


class StreamFramer:
    """Cuts SIP messages out of a TCP/TLS byte stream by their Content-Length (RFC 3261 §18.3). A framing
    error is fatal for the connection: the stream has no way back to a message boundary."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        out: list[bytes] = []
        while True:
            while self._buffer[:2] == b"\r\n":  # keep-alive CRLFs (RFC 5626) between messages
                del self._buffer[:2]
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEADER_BYTES:
                    raise SipError(f"no end of headers within {MAX_HEADER_BYTES} bytes", 513)
                return out
            length = _content_length(bytes(self._buffer[:end]))
            total = end + 4 + length
            if total > MAX_MESSAGE_BYTES:
                raise SipError(f"message of {total} bytes, more than {MAX_MESSAGE_BYTES}", 513)
            if len(self._buffer) < total:
                return out
            out.append(bytes(self._buffer[:total]))
            del self._buffer[:total]


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() in (b"content-length", b"l"):
            length = number(value)
            if length is None:
                raise SipError("Content-Length is not a number")
            return length
    raise SipError("Content-Length is required over TCP/TLS")


def response(request: SipMessage, status: int, to_tag: str = "", headers: Iterable[tuple[str, str]] = (),
             body: bytes = b"", reason: str = "") -> SipMessage:
    """The answer to ``request`` (RFC 3261 §8.2.6): its Via headers, From, Call-ID and CSeq copied, To with
    ``to_tag`` added unless it has one (and not on 100 Trying)."""
    copied = [(n, v) for n, v in request.headers if n in ("via", "from", "call-id", "cseq", "record-route")]
    to = request.header("to") or ""
    if to_tag and status > 100 and param(to, "tag") is None:
        to = f"{to};tag={to_tag}"
    out = SipMessage(status=status, reason=reason or REASONS.get(status, "Unknown"),
                     headers=[*copied, ("to", to), *headers], body=body)
    order = {"via": 0, "record-route": 1, "from": 2, "to": 3, "call-id": 4, "cseq": 5}
    out.headers.sort(key=lambda h: order.get(h[0], 9))  # stable: the Via headers keep their order
    return out
