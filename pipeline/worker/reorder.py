"""Per-leg frame ordering: a small jitter buffer in front of the segmenter.

Telephony gateways resend, reorder and drop frames. The segmenter needs one continuous signal, so:
- a frame whose ``seq`` was already seen is a duplicate and is dropped;
- frames are held up to ``window`` frames to put them back in order;
- a gap older than the window is filled with silence (the call's timing must not shift), as one run
  however long (a hold's gap is thousands of frames: the leg's front end skips most of it, unmade);
- a frame that arrives after its place was filled with silence is late: counted, logged, dropped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReleasedFrame:
    seq: int
    payload: bytes | None  # None: silence filled in for missing frames
    frames: int = 1  # silence: the missing frames seq, seq + 1, ... it fills


@dataclass
class ReorderStats:
    frames_in: int = 0
    duplicates: int = 0
    late: int = 0
    gaps_filled: int = 0


class FrameReorderBuffer:
    def __init__(self, window: int = 10) -> None:
        self.window = window
        self.next_seq = 0
        self._pending: dict[int, bytes] = {}
        self._filled: set[int] = set()  # seqs replaced by silence, to tell late from duplicate
        self.stats = ReorderStats()

    def push(self, seq: int, payload: bytes) -> list[ReleasedFrame]:
        """Accept one frame; return the frames that can now be released, in order."""
        self.stats.frames_in += 1
        if seq < self.next_seq:
            if seq in self._filled:
                self._filled.discard(seq)
                self.stats.late += 1
            else:
                self.stats.duplicates += 1
            return []
        if seq in self._pending:
            self.stats.duplicates += 1
            return []
        self._pending[seq] = payload
        out = self._release_in_order()
        # Too far ahead: stop waiting for the missing frames (those more than a window behind the newest,
        # up to the next one held) and fill them with silence.
        while self._pending and max(self._pending) - self.next_seq >= self.window:
            out.append(self._fill_to(min(min(self._pending), max(self._pending) - self.window + 1)))
            out.extend(self._release_in_order())
        return out

    def flush(self, total_frames: int | None = None) -> list[ReleasedFrame]:
        """Release everything held, filling gaps; with ``total_frames``, also fill a missing tail."""
        out: list[ReleasedFrame] = []
        end = max([*self._pending, self.next_seq - 1, (total_frames or 0) - 1]) + 1
        while self.next_seq < end:
            out.extend(self._release_in_order())
            if self.next_seq < end:
                out.append(self._fill_to(min([*self._pending, end])))
        return out

    @property
    def held(self) -> int:
        return len(self._pending)

    def _release_in_order(self) -> list[ReleasedFrame]:
        out = []
        while self.next_seq in self._pending:
            out.append(ReleasedFrame(self.next_seq, self._pending.pop(self.next_seq)))
            self.next_seq += 1
        return out

    def _fill_to(self, end: int) -> ReleasedFrame:
        """Silence for the missing frames ``next_seq .. end - 1``, as one run."""
        seq, frames = self.next_seq, end - self.next_seq
        # Only recent fills can still turn up late: the last 4 windows of them are remembered.
        self._filled.update(range(max(seq, end - 4 * self.window), end))
        while len(self._filled) > 4 * self.window:
            self._filled.discard(min(self._filled))
        self.stats.gaps_filled += frames
        self.next_seq = end
        return ReleasedFrame(seq, None, frames)
