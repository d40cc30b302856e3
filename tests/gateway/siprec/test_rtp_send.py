"""The project's RTP sender: packets of a leg (numbering and wraps), deterministic impairment,
RFC 4733 telephone-events, and real UDP sending of two interleaved legs into a jitter buffer."""

from __future__ import annotations

import socket
import threading
from collections import Counter

import numpy as np
import pytest

from pipeline.audio.codecs import decode, encode
from pipeline.gateway.siprec.jitter import JitterBuffer, Released
from pipeline.gateway.siprec.payloads import decoder_for
from pipeline.gateway.siprec.rtp import parse_rtp
from pipeline.gateway.siprec.rtp_send import DTMF_END_REPEATS, RtpSender, dtmf_packets, impair, packetize


def _leg(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0, 3000, int(seconds * 8000)), -32768, 32767).astype(np.int16)


def test_packetize_numbers_packets_across_both_wraps() -> None:
    samples = _leg(1.01)  # 50 whole packets and a 80-sample one
    packets = [parse_rtp(p) for p in packetize(samples, "pcmu", 0, ssrc=77, first_sequence=65530,
                                               first_timestamp=2**32 - 480)]
    assert len(packets) == 51
    assert [p.sequence for p in packets] == [(65530 + i) % 65536 for i in range(51)]
    assert [p.timestamp for p in packets] == [(2**32 - 480 + 160 * i) % 2**32 for i in range(51)]
    assert [p.marker for p in packets] == [True] + [False] * 50
    assert {p.ssrc for p in packets} == {77} and {p.payload_type for p in packets} == {0}
    assert [len(p.payload) for p in packets] == [160] * 50 + [80]
    assert b"".join(p.payload for p in packets) == encode(samples.astype(np.float32) / 32768, "mulaw")


def test_packetize_g722_and_other_packet_lengths() -> None:
    packets = [parse_rtp(p) for p in packetize(_leg(1.0), "g722", 9, ssrc=1, packet_ms=30)]
    assert [len(p.payload) for p in packets] == [240] * 33 + [80]
    assert [p.timestamp for p in packets][:3] == [0, 240, 480]
    with pytest.raises(ValueError, match="packet_ms"):
        packetize(_leg(0.1), "pcmu", 0, ssrc=1, packet_ms=0)


def test_impair_is_deterministic_and_moves_packets_at_most_three_places() -> None:
    packets = packetize(_leg(200.0), "pcmu", 0, ssrc=1)  # 10,000 packets
    once, again = impair(packets, 0.05, 0.1, seed=42), impair(packets, 0.05, 0.1, seed=42)
    assert once == again and impair(packets, 0.05, 0.1, seed=43) != once
    assert 0.04 < 1 - len(once) / len(packets) < 0.06
    kept = sorted(once, key=lambda p: parse_rtp(p).sequence)
    assert Counter(kept) == Counter(once) and len(set(once)) == len(once)
    displacement = [abs(at - kept.index(p)) for at, p in enumerate(once)]
    assert sum(1 for d in displacement if d) > 0 and max(displacement) <= 3
    assert impair(packets, 0.0, 0.0, seed=1) == packets


def test_dtmf_packets_follow_rfc_4733() -> None:
    packets = [parse_rtp(p) for p in dtmf_packets("#", timestamp=2**32 - 10, first_sequence=65535, ssrc=5,
                                                  payload_type=101, duration_ms=100)]
    assert [p.sequence for p in packets] == [(65535 + i) % 65536 for i in range(len(packets))]
    assert {p.timestamp for p in packets} == {2**32 - 10} and {p.payload_type for p in packets} == {101}
    assert [p.marker for p in packets] == [True] + [False] * (len(packets) - 1)
    events = [p.payload[0] for p in packets]
    ends = [bool(p.payload[1] & 0x80) for p in packets]
    durations = [int.from_bytes(p.payload[2:4], "big") for p in packets]
    assert set(events) == {11}
    assert ends == [False] * (len(packets) - DTMF_END_REPEATS) + [True] * DTMF_END_REPEATS
    assert durations == sorted(durations) and durations[-1] == 800
    with pytest.raises(ValueError, match="not a DTMF key"):
        dtmf_packets("x", 0, 0, 1)


def test_two_legs_sent_unpaced_over_udp_arrive_interleaved_and_decode_exactly() -> None:
    caller, agent = _leg(4.0, seed=1), _leg(4.0, seed=2)
    legs = [packetize(caller, "pcmu", 0, ssrc=1, first_timestamp=2**32 - 8000),
            packetize(agent, "pcma", 8, ssrc=2, first_sequence=65000)]
    receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in legs]
    merged = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for receiver in [*receivers, merged]:
        receiver.bind(("127.0.0.1", 0))
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        receiver.settimeout(5.0)
    try:
        with RtpSender(speed=0) as sender:
            assert sender.local_address[1] > 0
            # Both legs to one socket first: the arrival order is the legs interleaved by timestamp.
            sent = sender.send([(merged.getsockname(), legs[0][:10]), (merged.getsockname(), legs[1][:10])])
            assert sent == 20
            arrived = [parse_rtp(merged.recv(2048)).ssrc for _ in range(20)]
            assert arrived == [1, 2] * 10

            received: list[list[bytes]] = [[], []]
            threads = [threading.Thread(target=_receive, args=(r, len(leg), out))
                       for r, leg, out in zip(receivers, legs, received, strict=True)]
            for thread in threads:
                thread.start()
            sender.send([(r.getsockname(), leg) for r, leg in zip(receivers, legs, strict=True)])
            for thread in threads:
                thread.join()
    finally:
        for receiver in [*receivers, merged]:
            receiver.close()
    assert received == legs
    for samples, datagrams, payload_type, encoding in ((caller, received[0], 0, "pcmu"),
                                                       (agent, received[1], 8, "pcma")):
        buffer = JitterBuffer({payload_type: decoder_for(encoding)})
        released: list[Released] = []
        for datagram in datagrams:
            released += buffer.push(parse_rtp(datagram), 0.0)
        released += buffer.flush()
        assert [item.position for item in released] == list(range(0, len(samples), 160))
        sent_codes = encode(samples.astype(np.float32) / 32768, "mulaw" if encoding == "pcmu" else "alaw")
        expected = sent_codes if encoding == "pcmu" else encode(decode(sent_codes, "alaw"), "mulaw")
        assert b"".join(item.ulaw for item in released) == expected


def _receive(receiver: socket.socket, count: int, out: list[bytes]) -> None:
    for _ in range(count):
        out.append(receiver.recv(2048))


def test_a_paced_send_stops_when_asked() -> None:
    packets = packetize(_leg(10.0), "pcmu", 0, ssrc=1)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    try:
        with RtpSender(speed=1.0) as sender:
            stopper = threading.Timer(0.2, sender.stop)
            stopper.start()
            sent = sender.send([(sink.getsockname(), packets)])
            stopper.join()
    finally:
        sink.close()
    assert 0 < sent < len(packets)


def test_sender_sends_from_a_given_socket_and_leaves_it_open() -> None:
    own, sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    own.bind(("127.0.0.1", 0))
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(5.0)
    try:
        with RtpSender(own, speed=0) as sender:
            assert sender.local_address == own.getsockname()
            assert sender.send([(sink.getsockname(), packetize(_leg(0.02), "pcmu", 0, ssrc=1))]) == 1
        _data, source = sink.recvfrom(2048)
        assert source == own.getsockname()
        own.sendto(b"still open", sink.getsockname())
    finally:
        own.close()
        sink.close()


def test_sender_refuses_a_negative_speed() -> None:
    with pytest.raises(ValueError, match="speed"):
        RtpSender(speed=-1)
