"""One received RTP stream to ordered 8 kHz μ-law audio at sample positions on the stream's own clock,
which the gateway writes into the leg's ``LegTimeline``.

This module owns what happens between the socket and the timeline: putting reordered packets back in
sequence order, counting loss, lateness and duplicates, following the stream across the 16-bit sequence
and 32-bit timestamp wraps, a change of source (SSRC) and a restart of its numbering, and turning
RFC 4733 telephone-events and comfort noise into counts and positions rather than audio.

Positions come from RTP timestamps, never from arrival times: a burst after a network stall, or a
sender replaying faster than real time, gives the same positions as a paced one. Arrival time (``now``)
only bounds how long a packet may wait for a missing predecessor.

It runs once per packet for every recorded stream (50 a second, ~1,000 streams per core), so the PCMU and
PCMA paths use no numpy and the reordering buffer is a short sorted list.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from pipeline.gateway.siprec.payloads import PayloadDecoder
from pipeline.gateway.siprec.rtp import RtpPacket
from pipeline.gateway.timeline import JITTER_SAMPLES, SAMPLE_RATE

# RFC 3550 A.1: a sequence number up to MAX_DROPOUT ahead of the highest seen is the same stream after a
# loss; up to MAX_MISORDER behind, a late or duplicate packet of it. Anything further is a jump: the
# sender restarted its numbering, or the packet is a stray; it is believed only once a second packet
# follows it (MIN_SEQUENTIAL), as A.1's probation does for a new source.
MAX_DROPOUT = 3000
MAX_MISORDER = 100
MIN_SEQUENTIAL = 2
# How far back released sequence numbers are remembered, to tell a duplicate (released before) from a
# late packet (skipped over as lost): covers MAX_MISORDER, the furthest back a packet is still accepted.
RELEASED_WINDOW = 128
_RELEASED_MASK = (1 << RELEASED_WINDOW) - 1
# The worker closes a call after 20 minutes (stream time) with no audio (call_inactivity_timeout_s), so
# within one source a timestamp jump further ahead than that is no silence but a renumbered clock (some
# SBCs re-randomise the timestamp on a re-INVITE and keep the SSRC): it continues at ``position``.
MAX_TIMESTAMP_JUMP = 1200 * SAMPLE_RATE
# Audio stepping back in time by more than the timeline's own slack is likewise a renumbered clock: left
# alone the timeline would drop all of it as already written.
MAX_TIMESTAMP_STEP_BACK = JITTER_SAMPLES


@dataclass
class StreamCounts:
    packets: int = 0  # every packet pushed
    audio_packets: int = 0  # released and decoded to audio
    lost: int = 0  # sequence numbers never received (counted when skipped over; taken back if one comes late)
    late: int = 0  # arrived after their place was released: dropped
    duplicates: int = 0  # a sequence number already held or released: dropped
    reordered: int = 0  # received after a later sequence number, released in order
    ssrc_changes: int = 0  # a new source confirmed (transfer, SBC failover): continued at `position`
    dtmf_events: int = 0  # RFC 4733 telephone-events begun (the digit itself is never read)
    comfort_noise: int = 0  # comfort-noise packets (no audio: the timeline fills the time with silence)
    unknown_payload: int = 0  # a payload type with no decoder: dropped
    restarts: int = 0  # the same source renumbered its sequence or its timestamps: continued at `position`
    strays: int = 0  # a packet of another source or numbering that no second packet confirmed: dropped


@dataclass(frozen=True, slots=True)
class Released:
    position: int  # 8 kHz sample on the stream's clock (0 = its first packet's timestamp)
    ulaw: bytes

    def __repr__(self) -> str:
        return f"Released(position={self.position}, ulaw=<{len(self.ulaw)} bytes>)"


@dataclass
class _Candidate:
    """The first packet of what may be a new source or a renumbered one, waiting for a second to confirm it."""

    packet: RtpPacket
    arrived: float
    age: int = 0  # packets of the current stream pushed since it came


@dataclass
class _Epoch:
    """One run of consistent numbering (one SSRC, no restart): how its sequence numbers and timestamps
    extend past their wraps, and where its clock sits on the stream's."""

    max_sequence: int  # highest extended sequence received
    last_released: int | None = None  # extended sequence released last
    first_released: int | None = None  # loss is counted from here on
    released_bits: int = 0  # bit i: sequence last_released - i was released (a duplicate if it comes again)
    last_timestamp: int | None = None  # extended timestamp released last
    timestamp_base: int = 0  # the extended timestamp that lies at position_base
    position_base: int = 0


class JitterBuffer:
    def __init__(self, decoders: dict[int, PayloadDecoder], telephone_event_pt: int | None = None,
                 comfort_noise_pt: int = 13, depth: int = 4, max_wait_s: float = 0.06) -> None:
        if not 0 <= depth <= MAX_MISORDER:
            raise ValueError(f"jitter buffer depth {depth} is outside 0..{MAX_MISORDER}")
        if max_wait_s < 0:
            raise ValueError(f"jitter buffer max_wait_s {max_wait_s} is negative")
        self._decoders = decoders  # one object per stream: G.722 decoders hold state
        self._telephone_event_pt = telephone_event_pt
        self._comfort_noise_pt = comfort_noise_pt
        self.depth = depth
        self.max_wait_s = max_wait_s
        self.counts = StreamCounts()
        self.position = 0  # end of the audio released so far
        # Where each telephone-event began. Only the position: the event code (the digit) is never read, since
        # card numbers are typed as DTMF and nothing here may hold them.
        self.dtmf_positions: list[int] = []
        self._ssrc: int | None = None
        self._epoch: _Epoch | None = None
        self._held: list[tuple[int, float, RtpPacket]] = []  # (extended sequence, arrival, packet), sorted
        self._candidate: _Candidate | None = None
        self._event_position: int | None = None  # where the current telephone-event began

    def __repr__(self) -> str:
        return (f"JitterBuffer(ssrc={self._ssrc}, position={self.position}, held={len(self._held)}, "
                f"counts={self.counts})")

    def push(self, packet: RtpPacket, now: float) -> list[Released]:
        """Take one received packet (``now``: its arrival, on any monotonic clock); returns the audio this lets
        go, in order."""
        self.counts.packets += 1
        epoch = self._epoch
        if epoch is None or self._ssrc is None:
            # The first packet on the stream's port starts it: no probation (nothing to tell it from).
            self._start_epoch(packet)
            return self._admit(packet, now)
        if packet.ssrc == self._ssrc:
            delta = ((packet.sequence - epoch.max_sequence + 0x8000) & 0xFFFF) - 0x8000
            if -MAX_MISORDER <= delta <= MAX_DROPOUT:
                return self._accept(packet, epoch.max_sequence + delta, now)
        return self._probation(packet, now)

    def expire(self, now: float) -> list[Released]:
        """What has waited ``max_wait_s`` for a missing predecessor: called on the gateway's tick so a real-time
        stream's last packets are not held until the next one comes."""
        return self._release_due(now)

    def flush(self) -> list[Released]:
        """The stream ended: everything held, in order (what is missing before it counted as lost)."""
        released = self._drain()
        if self._candidate is not None:
            self.counts.strays += 1
            self._candidate = None
        return released

    # Arrival: which stream a packet belongs to, and whether it still has a place.

    def _admit(self, packet: RtpPacket, now: float) -> list[Released]:
        """``packet`` in the current epoch (just started, or confirmed by probation)."""
        assert self._epoch is not None
        max_sequence = self._epoch.max_sequence
        delta = ((packet.sequence - max_sequence + 0x8000) & 0xFFFF) - 0x8000
        return self._accept(packet, max_sequence + delta, now)

    def _accept(self, packet: RtpPacket, sequence: int, now: float) -> list[Released]:
        """Hold ``packet`` (extended ``sequence``) in order unless its place is gone; release what is due."""
        epoch = self._epoch
        assert epoch is not None
        candidate = self._candidate
        if candidate is not None:
            # A would-be new source that the current stream keeps outrunning was a stray (e.g. a late
            # packet of the previous source after a change): it must not flip the stream back.
            candidate.age += 1
            if candidate.age > self.depth:
                self.counts.strays += 1
                self._candidate = None
        last = epoch.last_released
        if last is not None and sequence <= last:
            back = last - sequence
            if epoch.released_bits >> back & 1:
                self.counts.duplicates += 1
            else:
                # Its place was released without it and counted lost; it did arrive, so it is late instead.
                self.counts.late += 1
                if epoch.first_released is not None and sequence > epoch.first_released:
                    self.counts.lost -= 1
            return self._release_due(now)
        held = self._held
        at = bisect_left(held, (sequence,))
        if at < len(held) and held[at][0] == sequence:
            self.counts.duplicates += 1
            return self._release_due(now)
        if sequence < epoch.max_sequence:
            self.counts.reordered += 1
        else:
            epoch.max_sequence = sequence
        held.insert(at, (sequence, now, packet))
        return self._release_due(now)

    def _probation(self, packet: RtpPacket, now: float) -> list[Released]:
        """A packet of another source, or of this one far from its numbering: a new source or a restart once a
        second packet close to it confirms it (RFC 3550 A.1), a stray until then. A lone straggler of the
        previous source after a change thus cannot flip the stream back."""
        candidate = self._candidate
        if candidate is not None and candidate.packet.ssrc == packet.ssrc:
            delta = ((packet.sequence - candidate.packet.sequence + 0x8000) & 0xFFFF) - 0x8000
            if delta == 0:
                self.counts.duplicates += 1
                return []
            if abs(delta) <= self.depth + MIN_SEQUENTIAL - 1:
                return self._switch(candidate, packet, now)
            self.counts.strays += 1
        elif candidate is not None:
            self.counts.strays += 1
        self._candidate = _Candidate(packet, now)
        return []

    def _switch(self, candidate: _Candidate, packet: RtpPacket, now: float) -> list[Released]:
        """A confirmed new source or restart: the old one's held packets go first (it will send no more), then
        the new numbering starts afresh and its clock continues at ``position`` (its timestamps mean nothing
        relative to the old ones)."""
        self._candidate = None
        released = self._drain()
        if candidate.packet.ssrc == self._ssrc:
            self.counts.restarts += 1
        else:
            self.counts.ssrc_changes += 1
        self._start_epoch(candidate.packet)
        released += self._admit(candidate.packet, candidate.arrived)
        released += self._admit(packet, now)
        return released

    def _start_epoch(self, packet: RtpPacket) -> None:
        self._ssrc = packet.ssrc
        self._epoch = _Epoch(max_sequence=packet.sequence, position_base=self.position)

    # Release: in sequence order, each packet to audio, an event or a count.

    def _release_due(self, now: float) -> list[Released]:
        held = self._held
        released: list[Released] = []
        deadline = now - self.max_wait_s
        epoch = self._epoch
        # The oldest goes at once when it follows the last one released (nothing can come before it any more:
        # an in-order stream waits for nothing), else while more than `depth` are held (its predecessor is
        # presumed lost), or while any held packet has waited max_wait_s (a real-time stream must not hold
        # audio for a packet that never comes).
        while held:
            last = epoch.last_released if epoch is not None else None
            if (last is None or held[0][0] != last + 1) and len(held) <= self.depth \
                    and min(entry[1] for entry in held) > deadline:
                break
            out = self._release(held.pop(0))
            if out is not None:
                released.append(out)
        return released

    @property
    def waiting(self) -> bool:
        """Packets are held for a missing predecessor (``expire`` has something to do)."""
        return bool(self._held)

    def _drain(self) -> list[Released]:
        released: list[Released] = []
        for entry in self._held:
            out = self._release(entry)
            if out is not None:
                released.append(out)
        self._held.clear()
        return released

    def _release(self, entry: tuple[int, float, RtpPacket]) -> Released | None:
        sequence, _arrived, packet = entry
        epoch = self._epoch
        assert epoch is not None
        last = epoch.last_released
        if last is None:
            epoch.first_released = sequence
            epoch.released_bits = 1
        else:
            if sequence - last > 1:
                # Not spliced: the next packet's position comes from its timestamp, so the gap stays a gap and the
                # timeline fills it with silence (audio after a loss keeps its true time).
                self.counts.lost += sequence - last - 1
            epoch.released_bits = ((epoch.released_bits << (sequence - last)) | 1) & _RELEASED_MASK
        epoch.last_released = sequence
        payload_type = packet.payload_type
        decoder = self._decoders.get(payload_type)
        if decoder is not None:
            return self._audio(epoch, packet, decoder)
        if payload_type == self._telephone_event_pt:
            self._telephone_event(epoch, packet)
        elif payload_type == self._comfort_noise_pt:
            # No audio: the time it covers is a gap the timeline fills with silence (or skips as a pause).
            self.counts.comfort_noise += 1
            self._extend_timestamp(epoch, packet.timestamp)
        else:
            # An unknown payload type may run a different clock, so its timestamp is not followed either.
            self.counts.unknown_payload += 1
        return None

    def _audio(self, epoch: _Epoch, packet: RtpPacket, decoder: PayloadDecoder) -> Released | None:
        timestamp = self._extend_timestamp(epoch, packet.timestamp)
        at = epoch.position_base + timestamp - epoch.timestamp_base
        if at < self.position - MAX_TIMESTAMP_STEP_BACK or at > self.position + MAX_TIMESTAMP_JUMP:
            # Same source, renumbered clock: continue where the audio is rather than drop it all as already
            # written, or jump hours ahead.
            self.counts.restarts += 1
            epoch.position_base = at = self.position
            epoch.timestamp_base = timestamp
        self.counts.audio_packets += 1
        ulaw = decoder.to_ulaw(packet.payload)
        if not ulaw:
            return None
        end = at + len(ulaw)
        if end > self.position:
            self.position = end
        return Released(at, ulaw)

    def _telephone_event(self, epoch: _Epoch, packet: RtpPacket) -> None:
        """RFC 4733: every packet of one event repeats its start timestamp (the duration grows and the end packet
        is sent three times), so an event is new when its start is; a marker on a repeated start is the same
        event. The payload (event code = the digit) is not read."""
        timestamp = self._extend_timestamp(epoch, packet.timestamp)
        at = epoch.position_base + timestamp - epoch.timestamp_base
        if at != self._event_position:
            self._event_position = at
            self.counts.dtmf_events += 1
            self.dtmf_positions.append(at)

    def _extend_timestamp(self, epoch: _Epoch, timestamp: int) -> int:
        """``timestamp`` extended past the 32-bit wrap: the nearest value to the last released one. The first
        in an epoch sets its clock's origin (position_base: 0 for the stream's first, ``position`` after a
        change of source)."""
        last = epoch.last_timestamp
        if last is None:
            epoch.timestamp_base = timestamp
            extended = timestamp
        else:
            extended = last + (((timestamp - last + 0x80000000) & 0xFFFFFFFF) - 0x80000000)
        epoch.last_timestamp = extended
        return extended

