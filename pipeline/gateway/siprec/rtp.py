"""RTP packets (RFC 3550): parsing what a SIPREC client sends to the recording server, and building the
packets the project's own sender emits.

This module owns the wire format only: version, marker, payload type, sequence number, timestamp, SSRC
and the payload with the CSRC list, header extension and padding stripped. Ordering, loss and timing
belong to ``jitter.py``. Parsing runs for every packet of every recorded stream (50 a second per stream,
~1,000 streams per core), so the fixed header is read with one ``struct.unpack_from`` and the rest with
plain index arithmetic.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

RTP_VERSION = 2
HEADER_BYTES = 12
# A UDP datagram cannot be longer; anything claiming more did not come off a socket.
MAX_PACKET_BYTES = 65535
# RFC 5761 §4: with RTP and RTCP on one port, a second octet of 192..223 is RTCP (SR 200, RR 201, SDES
# 202, BYE 203, APP 204, RTPFB 205, PSFB 206, XR 207 all fall inside; as RTP they would be marker + PT
# 64..95, which RFC 5761 forbids for RTP on a muxed port), so the whole range is recognised, not only 200..204.
RTCP_SECOND_BYTE = range(192, 224)

_FIXED_HEADER = struct.Struct("!BBHII")
_EXTENSION_HEADER = struct.Struct("!HH")


class RtpError(ValueError):
    """A datagram that is not a well-formed RTP packet; the message says what is wrong and at which byte."""


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    marker: bool
    sequence: int  # 16-bit, as sent (jitter.py extends it across the wrap)
    timestamp: int  # 32-bit, as sent
    ssrc: int
    payload: bytes

    def __repr__(self) -> str:
        # The payload may be a telephone-event (a typed card digit): a repr never shows payload bytes.
        return (f"RtpPacket(payload_type={self.payload_type}, marker={self.marker}, sequence={self.sequence}, "
                f"timestamp={self.timestamp}, ssrc={self.ssrc:#010x}, payload=<{len(self.payload)} bytes>)")


def is_rtcp(data: bytes) -> bool:
    """Whether ``data`` is an RTCP packet arriving on the RTP port (rtcp-mux): the caller ignores it rather
    than counting it as a malformed or unknown RTP packet."""
    return len(data) >= 2 and data[0] >> 6 == RTP_VERSION and data[1] in RTCP_SECOND_BYTE


def parse_rtp(data: bytes) -> RtpPacket:
    """The RTP packet in ``data``; ``RtpError`` (naming the field and byte offset) for anything else."""
    size = len(data)
    if size < HEADER_BYTES:
        raise RtpError(f"RTP packet of {size} bytes is shorter than the {HEADER_BYTES}-byte fixed header")
    if size > MAX_PACKET_BYTES:
        raise RtpError(f"RTP packet of {size} bytes is longer than a UDP datagram ({MAX_PACKET_BYTES})")
    first, second, sequence, timestamp, ssrc = _FIXED_HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(f"RTP byte 0: version {first >> 6}, expected {RTP_VERSION}")
    start = HEADER_BYTES + 4 * (first & 0x0F)  # CSRC identifiers: mixer contributors, not needed to record
    if start > size:
        raise RtpError(f"RTP byte 0: {first & 0x0F} CSRC identifiers need {start} bytes, packet has {size}")
    if first & 0x10:
        if start + 4 > size:
            raise RtpError(f"RTP byte {start}: header extension flagged but only {size - start} bytes remain")
        _profile, words = _EXTENSION_HEADER.unpack_from(data, start)
        length_at = start + 2
        start += 4 + 4 * words
        if start > size:
            raise RtpError(f"RTP byte {length_at}: header extension of {words} words runs past the packet's "
                           f"{size} bytes")
    end = size
    if first & 0x20:
        padding = data[-1]  # counts itself, so 0 is malformed
        if padding == 0 or padding > size - start:
            raise RtpError(f"RTP byte {size - 1}: padding of {padding} bytes does not fit the "
                           f"{size - start} bytes after the header")
        end -= padding
    return RtpPacket(second & 0x7F, second >= 0x80, sequence, timestamp, ssrc, bytes(data[start:end]))


def build_rtp(payload_type: int, sequence: int, timestamp: int, ssrc: int, payload: bytes,
              marker: bool = False) -> bytes:
    """One RTP packet (no CSRCs, extension or padding); sequence and timestamp wrap to their field widths,
    so a sender can count past the wrap."""
    if not 0 <= payload_type <= 0x7F:
        raise RtpError(f"RTP payload type {payload_type} is outside 0..127")
    if not 0 <= ssrc <= 0xFFFFFFFF:
        raise RtpError(f"RTP SSRC {ssrc} is outside 32 bits")
    if HEADER_BYTES + len(payload) > MAX_PACKET_BYTES:
        raise RtpError(f"RTP payload of {len(payload)} bytes does not fit a UDP datagram")
    second = payload_type | (0x80 if marker else 0)
    header = _FIXED_HEADER.pack(RTP_VERSION << 6, second, sequence & 0xFFFF, timestamp & 0xFFFFFFFF, ssrc)
    return header + payload
