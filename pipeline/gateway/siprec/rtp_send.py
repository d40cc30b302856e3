"""The project's own RTP sender, standing in for a SIPREC client's media in the simulator, the tests and the
benchmark: a leg's samples cut into RTP packets, network impairment (loss, reordering), RFC 4733
telephone-event packets, and a UDP sender that paces several streams in real time (or faster).

What the recording server must survive is made here deliberately: sequence numbers and timestamps start
wherever the caller says (near their wrap, to test it), packets go missing or out of order
deterministically per seed, and digits arrive as telephone-events.
"""

from __future__ import annotations

import heapq
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from pipeline.gateway.siprec.payloads import encoder_for
from pipeline.gateway.siprec.rtp import build_rtp

SAMPLE_RATE = 8000  # the RTP clock of all three codecs (G.722's too, RFC 3551)
# RFC 4733 §3.2: event codes of the DTMF digits.
DTMF_EVENT_CODES = {**{str(d): d for d in range(10)}, "*": 10, "#": 11, "A": 12, "B": 13, "C": 14, "D": 15}
# RFC 4733 §2.5.1.4: the end packet is sent three times so a lost one does not lose the event's end.
DTMF_END_REPEATS = 3
# A paced sender sleeps only when the next packet is at least this far off, so many interleaved streams
# do not cost one sleep per packet (and the OS's sleep granularity does not accumulate as drift).
_MIN_SLEEP_S = 0.002
_TIMESTAMP = struct.Struct("!I")


def packetize(samples_8k: np.ndarray, encoding: str, payload_type: int, ssrc: int, first_sequence: int = 0,
              first_timestamp: int = 0, packet_ms: int = 20) -> list[bytes]:
    """RTP packets of a whole leg (int16 samples at 8 kHz) in ``encoding``; sequence and timestamp count on
    from the first values and wrap at 16 and 32 bits. The first packet has the marker (a talkspurt's start).
    The last packet is shorter when the leg is not a whole number of packets."""
    if packet_ms <= 0:
        raise ValueError(f"packet_ms must be positive, got {packet_ms}")
    encode = encoder_for(encoding)  # a new one: G.722's encoder carries state along the leg
    step = SAMPLE_RATE * packet_ms // 1000
    if not np.issubdtype(np.asarray(samples_8k).dtype, np.integer):
        # float samples in [-1, 1] cast to int16 would all be 0: silence sent without a word
        raise ValueError(f"packetize takes int16 samples, got {np.asarray(samples_8k).dtype}")
    samples = np.asarray(samples_8k, dtype=np.int16)
    packets: list[bytes] = []
    for index, start in enumerate(range(0, len(samples), step)):
        payload = encode(samples[start:start + step])
        packets.append(build_rtp(payload_type, first_sequence + index, first_timestamp + start, ssrc, payload,
                                 marker=index == 0))
    return packets


def impair(packets: list[bytes], loss: float, reorder: float, seed: int) -> list[bytes]:
    """``packets`` as a network might deliver them: a fraction ``loss`` dropped, then a fraction ``reorder``
    swapped with a packet 1-3 places later. Each packet moves at most once, so none ends up more than
    3 places late (within a jitter buffer of depth 4). The same seed gives the same result."""
    rng = random.Random(seed)
    kept = [packet for packet in packets if rng.random() >= loss]
    moved: set[int] = set()
    for index in range(len(kept)):
        if index in moved or rng.random() >= reorder:
            continue
        other = index + rng.randint(1, 3)
        if other < len(kept) and other not in moved:
            kept[index], kept[other] = kept[other], kept[index]
            moved.update((index, other))
    return kept


def dtmf_packets(digit: str, timestamp: int, first_sequence: int, ssrc: int, payload_type: int = 101,
                 duration_ms: int = 100, packet_ms: int = 20, volume: int = 10) -> list[bytes]:
    """RFC 4733 telephone-event packets of one key press starting at ``timestamp``: an update every
    ``packet_ms`` with the duration so far (the first with the marker), then the end packet three times.
    All carry the event's start timestamp; each has its own sequence number."""
    if digit not in DTMF_EVENT_CODES:
        raise ValueError(f"not a DTMF key: {digit[:8]!r} (expected one of {''.join(DTMF_EVENT_CODES)})")
    if not 0 <= volume <= 63:
        raise ValueError(f"telephone-event volume {volume} is outside 0..63 (-dBm0)")
    step = SAMPLE_RATE * packet_ms // 1000
    total = min(SAMPLE_RATE * duration_ms // 1000, 0xFFFF)
    updates = list(range(step, total, step)) if step > 0 else []
    code = DTMF_EVENT_CODES[digit]
    packets: list[bytes] = []
    sequence = first_sequence
    for duration in updates:
        payload = bytes((code, volume)) + duration.to_bytes(2, "big")
        packets.append(build_rtp(payload_type, sequence, timestamp, ssrc, payload, marker=sequence == first_sequence))
        sequence += 1
    end = bytes((code, 0x80 | volume)) + total.to_bytes(2, "big")
    for _ in range(DTMF_END_REPEATS):
        packets.append(build_rtp(payload_type, sequence, timestamp, ssrc, end, marker=sequence == first_sequence))
        sequence += 1
    return packets


class RtpSender:
    """Sends RTP streams from one UDP socket. ``send`` is a blocking call (run it in a thread to send while
    doing other work; ``stop`` from another thread ends it early): simple to reason about in tests, and the
    pacing is one loop over all streams, not a thread each.

    ``sock`` is the UDP socket to send from (a client's bound RTP socket, whose port its SDP offer named);
    without one the sender binds its own on 127.0.0.1 and closes it on ``close``; a given one is left open.
    ``speed`` 1.0 paces in real time by the packets' timestamps, 2.0 twice as fast, 0 sends as fast as the
    socket takes them (the receiver's positions must come out the same either way)."""

    def __init__(self, sock: socket.socket | None = None, speed: float = 1.0) -> None:
        if speed < 0:
            raise ValueError(f"RtpSender speed {speed} is negative")
        self.speed = speed
        self._owns_socket = sock is None
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
        self._socket = sock
        self._stop = threading.Event()

    @property
    def local_address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return host, port

    def send(self, streams: Sequence[tuple[tuple[str, int], list[bytes]]]) -> int:
        """Send each ``(address, packets)`` stream to its address, all interleaved on one schedule; returns
        how many packets went. A packet is due at its timestamp's offset from its stream's first packet
        (a running maximum, so the list order survives: ``impair``'s reordering is sent as reordered,
        while silence with no packets still takes its time)."""
        schedule = heapq.merge(*(_schedule(index, address, packets) for index, (address, packets)
                                 in enumerate(streams)))
        started = time.monotonic()
        sent = 0
        for offset_s, _stream, _order, address, packet in schedule:
            if self._stop.is_set():
                break
            if self.speed > 0:
                wait = started + offset_s / self.speed - time.monotonic()
                if wait >= _MIN_SLEEP_S:
                    self._stop.wait(wait)
                    if self._stop.is_set():
                        break
            self._socket.sendto(packet, address)
            sent += 1
        return sent

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._owns_socket:
            self._socket.close()

    def __enter__(self) -> RtpSender:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _schedule(stream: int, address: tuple[str, int],
              packets: list[bytes]) -> Iterator[tuple[float, int, int, tuple[str, int], bytes]]:
    """(due seconds, stream, order, address, packet) in list order, due times never decreasing."""
    first: int | None = None
    extended = 0
    due = 0
    for order, packet in enumerate(packets):
        if len(packet) >= 8:
            timestamp = _TIMESTAMP.unpack_from(packet, 4)[0]
            if first is None:
                first = extended = timestamp
            else:
                # Extended past the 32-bit wrap as the nearest value to the previous packet's.
                extended += ((timestamp - extended + 0x80000000) & 0xFFFFFFFF) - 0x80000000
            due = max(due, extended - first)
        yield due / SAMPLE_RATE, stream, order, address, packet
