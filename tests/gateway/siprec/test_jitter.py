"""The jitter buffer on real packet streams: a leg packetized, impaired and pushed comes out of the
gateway's LegTimeline as the original with only the lost packets silent; positions follow timestamps
(so pacing does not matter) across the sequence and timestamp wraps, a change of source and renumbering;
telephone-events leave a position and never their digit."""

from __future__ import annotations

import gc
import timeit
from collections.abc import Iterable

import numpy as np
import pytest

from pipeline.audio.codecs import encode
from pipeline.gateway.siprec.jitter import JitterBuffer, Released
from pipeline.gateway.siprec.payloads import decoder_for
from pipeline.gateway.siprec.rtp import RtpPacket, build_rtp, parse_rtp
from pipeline.gateway.siprec.rtp_send import dtmf_packets, impair, packetize
from pipeline.gateway.timeline import MULAW_SILENCE, LegTimeline

PCMU, PCMA, G722_PT, EVENT_PT, CN_PT = 0, 8, 9, 101, 13
PACKET = 160


def _leg(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-band noise with a slow envelope: every packet differs, so a misplaced one shows."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 8000)
    noise = np.convolve(rng.normal(0, 4000, n), np.ones(3) / 3, "same")
    envelope = 0.5 + 0.5 * np.sin(np.arange(n) * 2 * np.pi / 4000)
    return np.clip(noise * envelope, -32768, 32767).astype(np.int16)


def _ulaw(samples: np.ndarray) -> bytes:
    return encode(samples.astype(np.float32) / 32768, "mulaw")


def _buffer(**kwargs: object) -> JitterBuffer:
    return JitterBuffer({PCMU: decoder_for("pcmu"), PCMA: decoder_for("pcma"), G722_PT: decoder_for("g722")},
                        telephone_event_pt=EVENT_PT, **kwargs)  # type: ignore[arg-type]


def _push_all(buffer: JitterBuffer, datagrams: Iterable[bytes], now: float = 0.0) -> list[Released]:
    released: list[Released] = []
    for datagram in datagrams:
        released += buffer.push(parse_rtp(datagram), now)
    return released + buffer.flush()


def _through_timeline(released: list[Released]) -> bytes:
    timeline = LegTimeline()
    frames = []
    for item in released:
        frames += timeline.write(item.position, item.ulaw)
    frames += timeline.flush()
    assert [frame.seq for frame in frames] == list(range(len(frames)))
    return b"".join(frame.payload for frame in frames)


def test_impaired_leg_comes_out_as_the_original_except_the_lost_packets() -> None:
    samples = _leg(60.0)
    original = _ulaw(samples)
    first_sequence, first_timestamp = 65536 - 1000, 2**32 - 1200 * PACKET  # both wrap mid-leg
    packets = packetize(samples, "pcmu", PCMU, ssrc=0x1234, first_sequence=first_sequence,
                        first_timestamp=first_timestamp)
    delivered = impair(packets, loss=0.01, reorder=0.03, seed=11)
    sent = {parse_rtp(p).sequence for p in packets}
    received = {parse_rtp(p).sequence for p in delivered}
    lost = sent - received
    assert lost and len(lost) < 60
    assert parse_rtp(packets[0]).sequence in received and parse_rtp(packets[-1]).sequence in received

    buffer = _buffer()
    audio = _through_timeline(_push_all(buffer, delivered))

    expected = bytearray(original)
    for index, packet in enumerate(packets):
        if parse_rtp(packet).sequence in lost:
            expected[index * PACKET:(index + 1) * PACKET] = bytes([MULAW_SILENCE]) * PACKET
    assert audio == bytes(expected)
    counts = buffer.counts
    assert counts.lost == len(lost)
    assert counts.reordered > 0 and counts.late == 0 and counts.duplicates == 0
    assert counts.packets == counts.audio_packets == len(delivered)
    assert buffer.position == len(original)


def test_positions_come_from_timestamps_whatever_the_pacing() -> None:
    # Loss but no reordering, so a real-time buffer's 60 ms wait never gives up on a packet that comes.
    packets = impair(packetize(_leg(10.0), "pcma", PCMA, ssrc=5, first_timestamp=77), 0.02, 0.0, seed=3)

    unpaced = _push_all(_buffer(), packets)

    real_time, buffer = [], _buffer()
    for index, datagram in enumerate(packets):
        now = index * 0.02
        real_time += buffer.push(parse_rtp(datagram), now)
        real_time += buffer.expire(now + 0.01)  # the gateway's tick between packets
    real_time += buffer.expire(len(packets) * 0.02 + 1.0)
    assert buffer.flush() == []

    stalled, buffer = [], _buffer()
    for index, datagram in enumerate(packets):
        # Real time for a while, then a 3 s network stall and everything at once.
        now = index * 0.02 if index < 200 else 200 * 0.02 + 3.0
        stalled += buffer.push(parse_rtp(datagram), now)
    stalled += buffer.flush()

    assert len(unpaced) == len(packets) and unpaced[0].position == 0
    assert unpaced == real_time == stalled


def test_sequence_and_timestamp_wrap_mid_stream() -> None:
    samples = _leg(1.0)
    packets = packetize(samples, "pcmu", PCMU, ssrc=9, first_sequence=65530, first_timestamp=2**32 - 800)
    sequences = [parse_rtp(p).sequence for p in packets]
    assert 65535 in sequences and 0 in sequences
    buffer = _buffer()
    released = _push_all(buffer, packets)
    assert [item.position for item in released] == list(range(0, 8000, PACKET))
    assert b"".join(item.ulaw for item in released) == _ulaw(samples)
    assert buffer.counts.lost == 0 and buffer.counts.restarts == 0


def test_a_new_source_continues_where_the_audio_is() -> None:
    first, second = _leg(2.0, seed=1), _leg(2.0, seed=2)
    before = packetize(first, "pcmu", PCMU, ssrc=111, first_sequence=100, first_timestamp=5000)
    after = packetize(second, "pcmu", PCMU, ssrc=222, first_sequence=40000, first_timestamp=123456789)
    # A transfer's packets overlap in flight: the old source's last packet arrives after the new one's first.
    delivered = before[:-1] + [after[0], before[-1]] + after[1:]
    buffer = _buffer()
    released = _push_all(buffer, delivered)
    assert _through_timeline(released) == _ulaw(first) + _ulaw(second)
    assert buffer.counts.ssrc_changes == 1 and buffer.counts.lost == 0 and buffer.counts.strays == 0
    assert released[len(before)].position == len(first)


def test_a_lone_packet_of_another_source_is_a_stray_not_a_change() -> None:
    samples = _leg(1.0)
    packets = packetize(samples, "pcmu", PCMU, ssrc=1)
    stray = build_rtp(PCMU, 60000, 999999, 0xBAD, b"\x00" * PACKET)
    buffer = _buffer()
    audio = _through_timeline(_push_all(buffer, packets[:20] + [stray] + packets[20:]))
    assert audio == _ulaw(samples)
    assert buffer.counts.strays == 1 and buffer.counts.ssrc_changes == 0


def test_renumbered_sequence_and_clock_in_one_source_continue_where_the_audio_is() -> None:
    first, second = _leg(1.0, seed=4), _leg(1.0, seed=5)
    # Same SSRC: the sequence jumps far ahead and the timestamp goes back (an SBC re-originating the stream).
    packets = (packetize(first, "pcmu", PCMU, ssrc=7, first_sequence=500, first_timestamp=900000)
               + packetize(second, "pcmu", PCMU, ssrc=7, first_sequence=20000, first_timestamp=1000))
    buffer = _buffer()
    assert _through_timeline(_push_all(buffer, packets)) == _ulaw(first) + _ulaw(second)
    assert buffer.counts.restarts == 1 and buffer.counts.lost == 0 and buffer.counts.ssrc_changes == 0

    # Sequence continuous, clock renumbered backwards: audio still continues.
    packets = (packetize(first, "pcmu", PCMU, ssrc=7, first_sequence=500, first_timestamp=900000)
               + packetize(second, "pcmu", PCMU, ssrc=7, first_sequence=550, first_timestamp=1000))
    buffer = _buffer()
    assert _through_timeline(_push_all(buffer, packets)) == _ulaw(first) + _ulaw(second)
    assert buffer.counts.restarts == 1 and buffer.counts.lost == 0


def test_silence_suppression_gap_is_kept_as_time() -> None:
    samples = _leg(1.0)
    packets = packetize(samples, "pcmu", PCMU, ssrc=3)
    # The sender stops for 400 ms of silence: the timestamp jumps, the sequence continues.
    later = [build_rtp(PCMU, 50 + i, 8000 + 3200 + i * PACKET, 3, b"\x10" * PACKET) for i in range(5)]
    buffer = _buffer()
    released = _push_all(buffer, packets + later)
    assert released[50].position == 8000 + 3200
    assert _through_timeline(released) == _ulaw(samples) + bytes([MULAW_SILENCE]) * 3200 + b"\x10" * 800
    assert buffer.counts.lost == 0


def test_late_and_duplicate_packets_are_dropped_and_counted() -> None:
    samples = _leg(1.0)
    packets = packetize(samples, "pcmu", PCMU, ssrc=3)
    # Packet 10 arrives 8 places late (past a depth-4 buffer): its place was released and counted lost,
    # then it comes: late, not lost. Packet 30 comes twice, the second time after release.
    delivered = packets[:10] + packets[11:19] + [packets[10]] + packets[19:31] + [packets[30]] + packets[31:]
    delivered.insert(5, packets[4])  # a duplicate while still held
    buffer = _buffer()
    audio = _through_timeline(_push_all(buffer, delivered))
    expected = bytearray(_ulaw(samples))
    expected[10 * PACKET:11 * PACKET] = bytes([MULAW_SILENCE]) * PACKET
    assert audio == bytes(expected)
    assert (buffer.counts.late, buffer.counts.lost, buffer.counts.duplicates) == (1, 0, 2)


def test_expire_releases_a_real_time_streams_last_packets() -> None:
    """The first packet waits max_wait_s (one before it may still come); those that follow it in order go
    with it, and from then on each in-order packet goes as it arrives: a gap only is waited for."""
    packets = packetize(_leg(0.2), "pcmu", PCMU, ssrc=3)
    buffer = _buffer()
    for index, datagram in enumerate(packets[:3]):
        assert buffer.push(parse_rtp(datagram), 10.0 + index * 0.02) == []
    assert buffer.expire(10.05) == []
    assert [item.position for item in buffer.expire(10.07)] == [0, PACKET, 2 * PACKET]
    assert [r.position for r in buffer.push(parse_rtp(packets[3]), 10.08)] == [3 * PACKET]  # in order: at once
    assert buffer.push(parse_rtp(packets[4 + 1]), 10.12) == []  # packet 4 missing: 5 waits
    assert buffer.waiting and buffer.expire(10.15) == []
    assert [item.position for item in buffer.expire(10.19)] == [5 * PACKET]
    assert not buffer.waiting and buffer.counts.lost == 1


def _reachable(*roots: object) -> list[object]:
    """Every object reachable from ``roots`` through project instances and containers (not modules or classes)."""
    seen: dict[int, object] = {}
    stack = list(roots)
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen[id(item)] = item
        module = type(item).__module__
        if isinstance(item, (list, tuple, dict, set)) or module.startswith("pipeline."):
            stack.extend(gc.get_referents(item))
            if hasattr(type(item), "__slots__"):
                stack.extend(getattr(item, slot) for slot in type(item).__slots__ if hasattr(item, slot))
    return list(seen.values())


def test_a_dtmf_digit_leaves_one_position_and_is_kept_nowhere() -> None:
    head, tail = _leg(1.0, seed=6), _leg(1.0, seed=7)
    audio_before = packetize(head, "pcmu", PCMU, ssrc=8, first_sequence=1000, first_timestamp=4000)
    event = dtmf_packets("7", timestamp=4000 + 8000, first_sequence=1051, ssrc=8, payload_type=EVENT_PT,
                         duration_ms=100)
    # The start packet sent again under its own sequence number (with its marker), once more as a duplicate,
    # and the end packet's three repeats: all one event.
    start_again = build_rtp(EVENT_PT, 1050, 4000 + 8000, 8, parse_rtp(event[0]).payload, marker=True)
    audio_after = packetize(tail, "pcmu", PCMU, ssrc=8, first_sequence=1051 + len(event),
                            first_timestamp=4000 + 8000 + 800)
    datagrams = audio_before + [start_again] + [event[0]] + event + audio_after
    event_payloads = {parse_rtp(p).payload for p in event}

    buffer = _buffer()
    released: list[Released] = []
    for index, datagram in enumerate(datagrams):
        released += buffer.push(parse_rtp(datagram), 0.0)
        if index == len(audio_before) + len(event) + 12:  # the event is released, the call goes on
            _assert_no_digit(buffer, released, event_payloads)
    released += buffer.flush()
    assert buffer.dtmf_positions == [8000]
    assert buffer.counts.dtmf_events == 1 and buffer.counts.duplicates == 1 and buffer.counts.lost == 0
    audio = _through_timeline(released)
    assert audio == _ulaw(head) + bytes([MULAW_SILENCE]) * 800 + _ulaw(tail)
    _assert_no_digit(buffer, released, event_payloads)


def _assert_no_digit(buffer: JitterBuffer, released: list[Released], event_payloads: set[bytes]) -> None:
    reachable = _reachable(buffer, released)
    assert any(isinstance(item, Released) for item in reachable)  # the walk does reach into the objects
    for item in reachable:
        if isinstance(item, RtpPacket):
            assert item.payload_type != EVENT_PT
        if isinstance(item, (bytes, bytearray)):
            assert bytes(item) not in event_payloads
        if isinstance(item, str):
            assert item != "7"
    text = repr(buffer) + repr(released)
    assert all(repr(payload)[2:-1] not in text for payload in event_payloads)


def test_comfort_noise_and_unknown_payloads_are_counted_not_played() -> None:
    samples = _leg(0.4)
    packets = packetize(samples, "pcmu", PCMU, ssrc=4)
    comfort = build_rtp(CN_PT, len(packets), len(packets) * PACKET, 4, b"\x40")
    unknown = build_rtp(96, len(packets) + 1, len(packets) * PACKET + 800, 4, b"opus?")
    resumed = build_rtp(PCMU, len(packets) + 2, len(packets) * PACKET + 1600, 4, b"\x22" * PACKET)
    buffer = _buffer()
    released = _push_all(buffer, packets + [comfort, unknown, resumed])
    assert buffer.counts.comfort_noise == 1 and buffer.counts.unknown_payload == 1 and buffer.counts.lost == 0
    assert released[-1] == Released(len(packets) * PACKET + 1600, b"\x22" * PACKET)
    assert _through_timeline(released) == _ulaw(samples) + bytes([MULAW_SILENCE]) * 1600 + b"\x22" * PACKET


def test_g722_stream_releases_one_ulaw_byte_per_payload_byte() -> None:
    packets = impair(packetize(_leg(2.0), "g722", G722_PT, ssrc=2, first_sequence=65500), 0.02, 0.05, seed=5)
    buffer = _buffer()
    released = _push_all(buffer, packets)
    assert all(len(item.ulaw) == PACKET and item.position % PACKET == 0 for item in released)
    assert len(released) == len(packets) and buffer.counts.lost == 100 - len(packets)


def test_constructor_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="depth"):
        _buffer(depth=-1)
    with pytest.raises(ValueError, match="max_wait_s"):
        _buffer(max_wait_s=-0.1)


def test_push_cost_per_packet_is_printed() -> None:
    for encoding, payload_type in (("pcmu", PCMU), ("g722", G722_PT)):
        packets = [parse_rtp(p) for p in packetize(_leg(60.0), encoding, payload_type, ssrc=1)]
        buffer = _buffer()
        push = buffer.push
        iterator = iter(packets)

        def step() -> None:
            push(next(iterator), 0.0)  # noqa: B023 (timed in this iteration only)

        seconds = timeit.timeit(step, number=len(packets))
        print(f"JitterBuffer.push {encoding}: {seconds / len(packets) * 1e6:.1f} µs a packet "
              f"(parse_rtp not included)")
    datagram = packetize(_leg(0.02), "pcmu", PCMU, ssrc=1)[0]
    seconds = timeit.timeit(lambda: parse_rtp(datagram), number=100000)
    print(f"parse_rtp: {seconds / 100000 * 1e6:.2f} µs a packet")
