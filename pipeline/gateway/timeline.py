"""One leg's audio on the call's clock, cut into μ-law messages of one length (``audio_message_ms``, 20 ms
and up), as replay sends them.

Message ``seq`` k covers samples [k * n, (k + 1) * n) of the call (n samples a message): seq is the leg's
time, as in replay, so the worker places messages by it. Audio arrives at a sample position (Twilio's ``timestamp``,
AudioHook's running count); what lies between is either filled with μ-law silence (a gap in the
stream: the frames exist, they were just not sent) or skipped (a pause: no frames at all, the seq
jumps as replay's holds do, and the worker fills the gap when frames resume).
"""

from __future__ import annotations

from dataclasses import dataclass

SAMPLE_RATE = 8000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # μ-law: one byte per sample, so also bytes per frame
MULAW_SILENCE = 0xFF
# Twilio's ms timestamps and chunking jitter by a sample or so: a chunk this close to where the previous
# one ended continues it (half a 20 ms chunk, so a real lost chunk is still filled).
JITTER_SAMPLES = FRAME_SAMPLES // 2
# A gap up to this long is filled with silence frames; a longer one is skipped as a pause (no frames, the
# seq jumps; the worker fills it by its length). One Twilio message with a timestamp a day ahead used to
# fill 690 MB of silence on the event loop; the worker refuses a jump longer than any pause may be.
MAX_FILLED_GAP_SAMPLES = SAMPLE_RATE


@dataclass(frozen=True)
class LegFrame:
    seq: int
    payload: bytes


@dataclass
class TimelineCounts:
    silence_samples: int = 0  # filled into gaps of the stream
    overlap_samples: int = 0  # arrived for a time already written (late or duplicate audio), dropped
    skipped_samples: int = 0  # a pause: no frames sent for them


class LegTimeline:
    def __init__(self, frame_samples: int = FRAME_SAMPLES) -> None:
        self.frame_samples = frame_samples  # one message's samples (μ-law: its bytes)
        self.next_seq = 0
        self._pending = bytearray()  # the samples of frame `next_seq` received so far
        self.counts = TimelineCounts()

    @property
    def position(self) -> int:
        """The sample after the last one written (the leg's clock)."""
        return self.next_seq * self.frame_samples + len(self._pending)

    def write(self, at: int, payload: bytes) -> list[LegFrame]:
        """Place ``payload`` at sample ``at``: a gap before it is filled with silence (a long one skipped as
        a pause), audio for a time already written is dropped; returns the frames it completed."""
        gap = at - self.position
        if gap > MAX_FILLED_GAP_SAMPLES:
            return self.skip(gap) + self._extend(payload)
        if gap > JITTER_SAMPLES:
            self.counts.silence_samples += gap
            frames = self._extend(bytes([MULAW_SILENCE]) * gap)
            return frames + self._extend(payload)
        if gap < -JITTER_SAMPLES:
            overlap = min(-gap, len(payload))
            self.counts.overlap_samples += overlap
            payload = payload[overlap:]
        return self._extend(payload)

    def append(self, payload: bytes) -> list[LegFrame]:
        """Audio that follows the last written sample (a stream with no timestamps of its own)."""
        return self._extend(payload)

    def skip(self, samples: int) -> list[LegFrame]:
        """Advance the clock by ``samples`` with no frames for them (a pause). A frame that had begun is
        completed with silence and sent (it holds real audio); a frame the pause ends inside begins
        with silence up to the pause's end."""
        if samples <= 0:
            return []
        self.counts.skipped_samples += samples
        target = self.position + samples
        frames: list[LegFrame] = []
        if self._pending:
            fill = min(self.frame_samples - len(self._pending), samples)
            frames = self._extend(bytes([MULAW_SILENCE]) * fill)
        if self.position < target:
            self.next_seq, into = divmod(target, self.frame_samples)
            self._pending = bytearray([MULAW_SILENCE]) * into
        return frames

    def flush(self) -> list[LegFrame]:
        """The end of the leg: a frame that had begun is sent short, as replay sends a leg's last frame."""
        if not self._pending:
            return []
        frame = LegFrame(self.next_seq, bytes(self._pending))
        self.next_seq += 1
        self._pending.clear()
        return [frame]

    def _extend(self, payload: bytes) -> list[LegFrame]:
        frames = []
        view = memoryview(payload)
        while len(view):
            take = self.frame_samples - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) == self.frame_samples:
                frames.append(LegFrame(self.next_seq, bytes(self._pending)))
                self.next_seq += 1
                self._pending.clear()
        return frames
