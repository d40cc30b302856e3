"""SDP for the recording server: reads the SRC's offer (RFC 4566) and writes our answer (RFC 3264).

A SIPREC offer carries one ``m=`` line per recorded stream, each ``a=sendonly`` and tagged with
``a=label`` so the metadata (RFC 7865) can say whose voice it carries. This module owns the parts of
SDP the recording server needs: media lines, payload-type maps, direction, label, connection address,
SDES crypto (RFC 4568) and ptime. Everything else an offer says is read past, never guessed at.

The offer comes off the network, so the parser is bounded (size, m= lines, attributes) and raises
nothing but :class:`SdpError`, whose message names the line and what is wrong with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MAX_SDP_BYTES = 16 * 1024
MAX_MEDIA = 32
MAX_ATTRIBUTES = 64  # per m= section, and at session level
DIRECTIONS = ("sendonly", "recvonly", "sendrecv", "inactive")

# RFC 3551's static audio payload types: an offer may list them without an a=rtpmap.
STATIC_PAYLOAD_TYPES: dict[int, tuple[str, int]] = {
    0: ("pcmu", 8000), 3: ("gsm", 8000), 4: ("g723", 8000), 5: ("dvi4", 8000), 6: ("dvi4", 16000),
    7: ("lpc", 8000), 8: ("pcma", 8000), 9: ("g722", 8000), 10: ("l16", 44100), 11: ("l16", 44100),
    12: ("qcelp", 8000), 13: ("cn", 8000), 14: ("mpa", 90000), 15: ("g728", 8000), 16: ("dvi4", 11025),
    17: ("dvi4", 22050), 18: ("g729", 8000),
}
# Encoding names are case-insensitive (RFC 4566 §6), but some peers compare them as written:
# answer in the spelling the RTP profiles use.
CANONICAL_NAMES = {"pcmu": "PCMU", "pcma": "PCMA", "g722": "G722", "cn": "CN", "g729": "G729", "gsm": "GSM"}

_LINE = re.compile(r"([a-z])=(.*)")
_TOKEN = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+")
_CRYPTO_SUITE = re.compile(r"[A-Za-z0-9_]+")


class SdpError(ValueError):
    """An SDP body we cannot use; the message names the line (1-based) and the problem."""


@dataclass(frozen=True)
class Crypto:
    """One ``a=crypto`` line (RFC 4568): ``key_params`` is kept whole (``inline:KEY|2^20|1:32``)."""

    tag: int
    suite: str
    key_params: str


@dataclass(frozen=True)
class MediaOffer:
    """One offered ``m=`` section, with the session-level defaults it inherits already applied."""

    index: int
    media: str
    port: int
    proto: str
    formats: tuple[int, ...]
    rtpmap: dict[int, tuple[str, int]]
    direction: str
    label: str | None
    connection: str | None
    crypto: tuple[Crypto, ...]
    ptime: int | None
    format_tokens: tuple[str, ...] = ()  # the m= line's formats as written (non-RTP protos name them freely)

    def payload_type(self, name: str) -> int | None:
        """The first offered payload type whose encoding is ``name`` (case-insensitive), if any."""
        wanted = name.lower()
        for pt in self.formats:
            mapped = self.rtpmap.get(pt)
            if mapped is not None and mapped[0] == wanted:
                return pt
        return None


@dataclass(frozen=True)
class SdpOffer:
    origin_user: str
    session_id: str
    session_version: str
    connection: str | None
    media: tuple[MediaOffer, ...]


@dataclass(frozen=True)
class MediaAnswer:
    """What we answer to one offered stream; ``port`` 0 refuses it."""

    port: int
    formats: tuple[int, ...]
    direction: str
    crypto: Crypto | None = None


@dataclass(frozen=True)
class OfferStream:
    """One stream of an offer we write (the project's own SIPREC client and the tests)."""

    port: int
    label: str
    formats: tuple[int, ...]
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)
    direction: str = "sendonly"
    crypto: Crypto | None = None
    media: str = "audio"
    ptime: int | None = None


# (port, label, payload types, rtpmap[, direction[, crypto]]): an OfferStream written as a tuple.
StreamTuple = (tuple[int, str, Sequence[int], Mapping[int, tuple[str, int]]]
               | tuple[int, str, Sequence[int], Mapping[int, tuple[str, int]], str]
               | tuple[int, str, Sequence[int], Mapping[int, tuple[str, int]], str, Crypto | None])


# --- parsing -------------------------------------------------------------------------------------------


@dataclass
class _Section:
    """An m= section (or the session level) while its lines are read."""

    line_no: int
    media: str = ""
    port: int = 0
    proto: str = ""
    format_tokens: tuple[str, ...] = ()
    formats: tuple[int, ...] = ()
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)
    direction: str | None = None
    label: str | None = None
    connection: str | None = None
    crypto: list[Crypto] = field(default_factory=list)
    ptime: int | None = None
    attributes: int = 0


def parse_sdp(text: str | bytes) -> SdpOffer:
    """Parse an SDP offer (LF or CRLF line ends); raises only :class:`SdpError`."""
    lines = _lines(text)
    session = _Section(line_no=0)
    sections: list[_Section] = []
    origin: tuple[str, str, str] | None = None
    seen_name = False
    for line_no, kind, value in lines:
        current = sections[-1] if sections else session
        if kind == "v":
            raise SdpError(f"SDP line {line_no}: a second v= line")
        if kind in "os" and sections:
            raise SdpError(f"SDP line {line_no}: {kind}= belongs before the first m= line")
        if kind == "o":
            if origin is not None:
                raise SdpError(f"SDP line {line_no}: a second o= line")
            origin = _origin(line_no, value)
        elif kind == "s":
            if seen_name:
                raise SdpError(f"SDP line {line_no}: a second s= line")
            seen_name = True
        elif kind == "c":
            current.connection = _connection(line_no, value)
        elif kind == "m":
            if len(sections) == MAX_MEDIA:
                raise SdpError(f"SDP line {line_no}: more than {MAX_MEDIA} m= lines")
            sections.append(_media_line(line_no, value))
        elif kind == "a":
            _attribute(current, line_no, value)
        # Every other single-letter line (t=, b=, i=, k=, ...) says nothing the recorder uses.
    if origin is None:
        raise SdpError("SDP: no o= line")
    if not seen_name:
        raise SdpError("SDP: no s= line")
    media = tuple(_media_offer(i, section, session) for i, section in enumerate(sections))
    return SdpOffer(origin[0], origin[1], origin[2], session.connection, media)


def _lines(text: str | bytes) -> list[tuple[int, str, str]]:
    """(line number, type letter, value) of each non-blank line, after checking size and v=0 first."""
    if isinstance(text, bytes):
        if len(text) > MAX_SDP_BYTES:
            raise SdpError(f"SDP: {len(text)} bytes, more than {MAX_SDP_BYTES}")
        # SDP is UTF-8 (RFC 4566 §5); a stray byte in s= or i= must not cost the whole call.
        text = text.decode("utf-8", errors="replace")
    elif len(text) > MAX_SDP_BYTES:
        raise SdpError(f"SDP: {len(text)} characters, more than {MAX_SDP_BYTES}")
    out: list[tuple[int, str, str]] = []
    for line_no, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if not line.strip():
            continue  # trailing blank lines are common; they carry nothing
        if "\r" in line or "\x00" in line:
            # RFC 4566 §5 forbids both inside a line; a label echoed into our answer must not carry them.
            raise SdpError(f"SDP line {line_no}: holds a CR or NUL inside the line")
        match = _LINE.fullmatch(line)
        if match is None:
            raise SdpError(f"SDP line {line_no}: expected '<letter>=<value>', got {line[:40]!r}")
        out.append((line_no, match.group(1), match.group(2)))
    if not out or out[0][1] != "v" or out[0][2].strip() != "0":
        where = out[0][0] if out else 1
        raise SdpError(f"SDP line {where}: must start with v=0")
    return out[1:]


def _origin(line_no: int, value: str) -> tuple[str, str, str]:
    fields = value.split()
    if len(fields) != 6:
        raise SdpError(f"SDP line {line_no}: o= needs 6 fields, got {len(fields)}")
    return fields[0], fields[1], fields[2]


def _connection(line_no: int, value: str) -> str:
    fields = value.split()
    if len(fields) != 3 or fields[0] != "IN" or fields[1] not in ("IP4", "IP6"):
        raise SdpError(f"SDP line {line_no}: c= must be 'IN IP4|IP6 <address>', got {value[:60]!r}")
    address = fields[2].split("/", 1)[0]  # multicast TTL / address count
    if not address:
        raise SdpError(f"SDP line {line_no}: c= has an empty address")
    return address


def _media_line(line_no: int, value: str) -> _Section:
    fields = value.split()
    if len(fields) < 4:
        raise SdpError(f"SDP line {line_no}: m= needs media, port, proto and a format, got {value[:60]!r}")
    media, port_field, proto, tokens = fields[0], fields[1], fields[2], tuple(fields[3:])
    if _TOKEN.fullmatch(media) is None:
        raise SdpError(f"SDP line {line_no}: m= media {media[:20]!r} is not a token")
    port_text = port_field.split("/", 1)[0]  # a port count (port/2) is read past
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise SdpError(f"SDP line {line_no}: m= needs a port, got {port_field[:20]!r}")
    if len(tokens) > MAX_ATTRIBUTES:
        raise SdpError(f"SDP line {line_no}: m= lists more than {MAX_ATTRIBUTES} formats")
    section = _Section(line_no=line_no, media=media, port=int(port_text), proto=proto, format_tokens=tokens)
    if "RTP/" in proto.upper():
        section.formats = tuple(_payload_type(line_no, token) for token in tokens)
    elif all(token.isascii() and token.isdigit() for token in tokens):
        section.formats = tuple(int(token) for token in tokens)
    return section


def _payload_type(line_no: int, token: str) -> int:
    if not token.isascii() or not token.isdigit() or int(token) > 127:
        raise SdpError(f"SDP line {line_no}: RTP payload type must be 0-127, got {token[:20]!r}")
    return int(token)


def _attribute(section: _Section, line_no: int, value: str) -> None:
    section.attributes += 1
    if section.attributes > MAX_ATTRIBUTES:
        raise SdpError(f"SDP line {line_no}: more than {MAX_ATTRIBUTES} attributes in one section")
    name, _, arg = value.partition(":")
    if name in DIRECTIONS:
        section.direction = name
    elif name == "label":
        section.label = arg.strip()
    elif name == "rtpmap":
        pt, encoding = _rtpmap(line_no, arg)
        if pt in section.formats:  # a map for a payload type not offered is meaningless (RFC 4566 §6)
            section.rtpmap[pt] = encoding
    elif name == "crypto":
        section.crypto.append(_crypto(line_no, arg))
    elif name == "ptime":
        section.ptime = _ptime(line_no, arg)


def _rtpmap(line_no: int, arg: str) -> tuple[int, tuple[str, int]]:
    fields = arg.split()
    if len(fields) != 2:
        raise SdpError(f"SDP line {line_no}: rtpmap must be '<pt> <name>/<rate>', got {arg[:60]!r}")
    pt = _payload_type(line_no, fields[0])
    parts = fields[1].split("/")
    if len(parts) < 2 or not parts[0] or not parts[1].isascii() or not parts[1].isdigit():
        raise SdpError(f"SDP line {line_no}: rtpmap encoding must be '<name>/<rate>', got {fields[1][:40]!r}")
    rate = int(parts[1])
    if not 0 < rate <= 1_000_000:
        raise SdpError(f"SDP line {line_no}: rtpmap clock rate {rate} is out of range")
    return pt, (parts[0].lower(), rate)


def _crypto(line_no: int, arg: str) -> Crypto:
    fields = arg.split()
    if len(fields) < 3:
        raise SdpError(f"SDP line {line_no}: crypto must be '<tag> <suite> <key-params>', got {len(fields)} fields")
    tag, suite, key_params = fields[0], fields[1], fields[2]
    if not tag.isascii() or not tag.isdigit() or len(tag) > 9:
        raise SdpError(f"SDP line {line_no}: crypto tag must be 1-9 digits, got {tag[:20]!r}")
    if _CRYPTO_SUITE.fullmatch(suite) is None:
        raise SdpError(f"SDP line {line_no}: crypto suite {suite[:40]!r} is not a suite name")
    if not key_params.startswith("inline:"):
        raise SdpError(f"SDP line {line_no}: crypto key-params must start with 'inline:'")
    return Crypto(int(tag), suite, key_params)


def _ptime(line_no: int, arg: str) -> int:
    text = arg.strip()
    # Some SBCs write ptime as a decimal ("20.0"); the integer part is what they mean.
    whole = text.split(".", 1)[0]
    if not whole.isascii() or not whole.isdigit() or not 0 < int(whole) <= 1000:
        raise SdpError(f"SDP line {line_no}: ptime must be 1-1000 ms, got {text[:20]!r}")
    return int(whole)


def _media_offer(index: int, section: _Section, session: _Section) -> MediaOffer:
    rtpmap: dict[int, tuple[str, int]] = {}
    if "RTP/" in section.proto.upper():  # the static table is the RTP profile's (RFC 3551)
        rtpmap = {pt: STATIC_PAYLOAD_TYPES[pt] for pt in section.formats if pt in STATIC_PAYLOAD_TYPES}
    rtpmap.update(section.rtpmap)
    return MediaOffer(
        index=index, media=section.media, port=section.port, proto=section.proto, formats=section.formats,
        rtpmap=rtpmap, direction=section.direction or session.direction or "sendrecv", label=section.label,
        connection=section.connection or session.connection, crypto=tuple(section.crypto), ptime=section.ptime,
        format_tokens=section.format_tokens,
    )


# --- writing -------------------------------------------------------------------------------------------


def build_answer(offer: SdpOffer, answers: Sequence[MediaAnswer], address: str, session_id: int,
                 version: int) -> str:
    """Our answer: one m= line per offered one, same order, media and proto (RFC 3264 §6).

    A stream answered with port 0 is refused and keeps one offered format, as RFC 3264 requires; a
    stream the offerer disabled (port 0) stays disabled whatever ``answers`` says.
    """
    if len(answers) != len(offer.media):
        raise SdpError(f"SDP answer: {len(answers)} answers for {len(offer.media)} offered m= lines")
    lines = _session_lines("callqa", session_id, version, address)
    for offered, answer in zip(offer.media, answers, strict=True):
        lines.extend(_answer_media(offered, answer))
    return "\r\n".join(lines) + "\r\n"


def _answer_media(offered: MediaOffer, answer: MediaAnswer) -> list[str]:
    if offered.port == 0 or answer.port == 0:
        kept = offered.format_tokens[:1] or tuple(str(pt) for pt in offered.formats[:1]) or ("0",)
        return [f"m={offered.media} 0 {offered.proto} {kept[0]}"]
    unoffered = [pt for pt in answer.formats if pt not in offered.formats]
    if not answer.formats or unoffered:
        raise SdpError(f"SDP answer: m= line {offered.index} must answer a subset of {offered.formats}, "
                       f"got {answer.formats}")
    _check_port(answer.port)
    _check_direction(answer.direction)
    formats = " ".join(str(pt) for pt in answer.formats)
    lines = [f"m={offered.media} {answer.port} {offered.proto} {formats}"]
    lines.extend(_rtpmap_lines(answer.formats, offered.rtpmap))
    if offered.label is not None:
        lines.append(f"a=label:{offered.label}")
    lines.append(f"a={answer.direction}")
    if answer.crypto is not None:
        lines.append(_crypto_line(answer.crypto))
    return lines


def build_offer(address: str, streams: Sequence[OfferStream | StreamTuple], session_id: int = 1, version: int = 1,
                origin_user: str = "callqa-src") -> str:
    """An offer as a SIPREC client sends it: RTP/AVP, or RTP/SAVP for a stream given a crypto line."""
    if not streams or len(streams) > MAX_MEDIA:
        raise SdpError(f"SDP offer: needs 1-{MAX_MEDIA} streams, got {len(streams)}")
    lines = _session_lines(origin_user, session_id, version, address)
    for spec in streams:
        stream = _offer_stream(spec)
        _check_port(stream.port)
        _check_direction(stream.direction)
        if not stream.formats:
            raise SdpError(f"SDP offer: stream labelled {stream.label!r} has no payload types")
        proto = "RTP/AVP" if stream.crypto is None else "RTP/SAVP"
        formats = " ".join(str(_checked_pt(pt)) for pt in stream.formats)
        lines.append(f"m={stream.media} {stream.port} {proto} {formats}")
        lines.extend(_rtpmap_lines(stream.formats, {**STATIC_PAYLOAD_TYPES, **stream.rtpmap}))
        if stream.ptime is not None:
            lines.append(f"a=ptime:{stream.ptime}")
        lines.append(f"a=label:{stream.label}")
        lines.append(f"a={stream.direction}")
        if stream.crypto is not None:
            lines.append(_crypto_line(stream.crypto))
    return "\r\n".join(lines) + "\r\n"


def _offer_stream(spec: OfferStream | StreamTuple) -> OfferStream:
    if isinstance(spec, OfferStream):
        return spec
    direction = spec[4] if len(spec) > 4 else "sendonly"
    crypto = spec[5] if len(spec) > 5 else None
    return OfferStream(spec[0], spec[1], tuple(spec[2]), dict(spec[3]), direction, crypto)


def _session_lines(user: str, session_id: int, version: int, address: str) -> list[str]:
    if not address or any(ch.isspace() for ch in address):
        raise SdpError(f"SDP: address {address!r} is not an address")
    family = "IP6" if ":" in address else "IP4"
    return ["v=0", f"o={user} {session_id} {version} IN {family} {address}", "s=callqa",
            f"c=IN {family} {address}", "t=0 0"]


def _rtpmap_lines(formats: Sequence[int], rtpmap: dict[int, tuple[str, int]]) -> list[str]:
    lines: list[str] = []
    for pt in formats:
        if pt not in rtpmap:
            continue
        name, rate = rtpmap[pt]
        lines.append(f"a=rtpmap:{pt} {CANONICAL_NAMES.get(name.lower(), name)}/{rate}")
        if name.lower() == "telephone-event":
            lines.append(f"a=fmtp:{pt} 0-15")  # the DTMF digits, * and # (RFC 4733 §2.4)
    return lines


def _crypto_line(crypto: Crypto) -> str:
    return f"a=crypto:{crypto.tag} {crypto.suite} {crypto.key_params}"


def _check_port(port: int) -> None:
    if not 0 < port <= 65535:
        raise SdpError(f"SDP: port {port} is out of range")


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise SdpError(f"SDP: direction {direction!r} is not one of {DIRECTIONS}")


def _checked_pt(pt: int) -> int:
    if not 0 <= pt <= 127:
        raise SdpError(f"SDP: payload type {pt} is out of range")
    return pt
