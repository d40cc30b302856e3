"""RTP packets: what build_rtp makes parse_rtp reads back, the optional header parts a real client may
send (CSRCs, an extension, padding), RTCP on the RTP port, and that no datagram raises anything but RtpError."""

from __future__ import annotations

import random
import struct

import pytest

from pipeline.gateway.siprec.rtp import RtpError, RtpPacket, build_rtp, is_rtcp, parse_rtp


def test_built_packets_parse_back_to_their_fields() -> None:
    cases = [
        (0, 0, 0, 0, b"", False),
        (8, 65535, 0xFFFFFFFF, 0xFFFFFFFF, bytes(range(160)), True),
        (9, 12345, 1_000_000, 0xDEADBEEF, b"\xff" * 160, False),
        (101, 1, 8000, 1, b"\x07\x0a\x00\xa0", True),
        (127, 40000, 2**31, 0x80000000, bytes(1200), False),
    ]
    for payload_type, sequence, timestamp, ssrc, payload, marker in cases:
        packet = parse_rtp(build_rtp(payload_type, sequence, timestamp, ssrc, payload, marker=marker))
        assert packet == RtpPacket(payload_type, marker, sequence, timestamp, ssrc, payload)


def test_build_wraps_sequence_and_timestamp_to_their_widths() -> None:
    packet = parse_rtp(build_rtp(0, 65536 + 5, 2**32 + 160, 7, b"x"))
    assert (packet.sequence, packet.timestamp) == (5, 160)


def test_csrc_list_extension_and_padding_are_stripped() -> None:
    payload = bytes(range(1, 161))
    csrcs = struct.pack("!III", 11, 22, 33)
    extension = struct.pack("!HH", 0xBEDE, 2) + bytes(8)  # one-byte header extensions, 2 words
    padding = bytes(3) + b"\x04"
    first = 0x80 | 0x20 | 0x10 | 3  # version 2, padding, extension, 3 CSRCs
    header = struct.pack("!BBHII", first, 0x80 | 8, 999, 123456, 42)
    packet = parse_rtp(header + csrcs + extension + payload + padding)
    assert packet == RtpPacket(8, True, 999, 123456, 42, payload)


def test_malformed_packets_name_what_is_wrong() -> None:
    good = build_rtp(0, 1, 2, 3, bytes(160))
    cases = {
        "shorter than the 12-byte": good[:11],
        "version 1": bytes([0x40]) + good[1:],
        "CSRC identifiers need": bytes([0x80 | 15]) + good[1:20],
        "header extension flagged": bytes([0x90]) + good[1:12],
        "header extension of": bytes([0x90]) + good[1:12] + struct.pack("!HH", 0, 100) + bytes(8),
        "padding of 0 bytes": bytes([0xA0]) + good[1:-1] + b"\x00",
        "padding of 200 bytes": bytes([0xA0]) + good[1:-1] + bytes([200]),
        "longer than a UDP datagram": good + bytes(65535),
    }
    for expected, data in cases.items():
        with pytest.raises(RtpError, match=expected):
            parse_rtp(data)


def test_whole_packet_of_padding_gives_an_empty_payload() -> None:
    header = struct.pack("!BBHII", 0xA0, 0, 1, 2, 3)
    assert parse_rtp(header + b"\x00\x00\x00\x04").payload == b""


def test_build_refuses_values_outside_their_fields() -> None:
    with pytest.raises(RtpError, match="payload type 128"):
        build_rtp(128, 0, 0, 0, b"")
    with pytest.raises(RtpError, match="SSRC"):
        build_rtp(0, 0, 0, 2**32, b"")


def test_rtcp_on_the_rtp_port_is_recognised() -> None:
    sender_report = struct.pack("!BBH", 0x80, 200, 6) + bytes(24)
    receiver_report = struct.pack("!BBH", 0x81, 201, 7) + bytes(28)
    bye = struct.pack("!BBHI", 0x81, 203, 1, 42)
    extended_report = struct.pack("!BBH", 0x80, 207, 1) + bytes(4)
    for rtcp in (sender_report, receiver_report, bye, extended_report):
        assert is_rtcp(rtcp)
    # RTP packets, with and without the marker, are not RTCP ...
    for payload_type in (0, 8, 9, 13, 101, 127):
        for marker in (False, True):
            assert not is_rtcp(build_rtp(payload_type, 1, 2, 3, bytes(160), marker=marker))
    # ... but "payload type 72 with the marker" is the second byte 200, which on a muxed port is RTCP.
    assert is_rtcp(build_rtp(72, 1, 2, 3, bytes(20), marker=True))
    assert not is_rtcp(b"") and not is_rtcp(b"\x80")
    assert not is_rtcp(bytes([0x40, 200]) + bytes(6))  # not version 2


def test_repr_never_shows_the_payload() -> None:
    dtmf_payload = b"\x05\x8a\x03\x20"
    text = repr(parse_rtp(build_rtp(101, 1, 2, 3, dtmf_payload)))
    assert "4 bytes" in text and repr(dtmf_payload) not in text and "\\x05" not in text


def test_fuzz_random_and_mutated_datagrams_raise_only_rtp_error() -> None:
    rng = random.Random(7866)
    valid = [
        build_rtp(0, 1, 2, 3, bytes(160)),
        bytes([0x80 | 0x20 | 0x10 | 2]) + bytes(11) + bytes(8) + struct.pack("!HH", 1, 1) + bytes(4) + b"ab\x02",
    ]
    parsed = errors = 0
    for round_ in range(20000):
        if round_ % 2:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 40)))
        else:
            mutated = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
            data = bytes(mutated[: rng.randrange(len(mutated) + 1)])
        try:
            packet = parse_rtp(data)
        except RtpError:
            errors += 1
            continue
        parsed += 1
        assert len(packet.payload) <= len(data) - 12
        is_rtcp(data)
    assert parsed and errors
