"""Which input offsets may be committed.

A call's frames are replayed from the call's first frame after a crash, so that the segmenter sees
exactly the audio it saw in the clean run and produces the same segments with the same ids. So an
input partition's committable offset is the first offset of the oldest call still open on it (or,
with no call open, one past the last offset consumed). Faust's own ack bookkeeping is not used: it has
known bugs with gaps and manual acks (faust-streaming #606, #527), and this rule needs none of it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class OffsetTracker:
    _consumed: dict[TopicPartition, int] = field(default_factory=dict)  # next offset after the last seen
    _held: dict[TopicPartition, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    _committed: dict[TopicPartition, int] = field(default_factory=dict)

    def consumed(self, tp: TopicPartition, offset: int, holder: str | None) -> None:
        """Record a consumed message; ``holder`` (a call id) keeps it uncommitted until released."""
        self._consumed[tp] = max(self._consumed.get(tp, 0), offset + 1)
        if holder is not None and holder not in self._held[tp]:
            self._held[tp][holder] = offset

    def release(self, holder: str) -> None:
        """The holder's work is durable (its transcripts produced and stored): stop holding its offsets."""
        for held in self._held.values():
            held.pop(holder, None)

    def committable(self) -> dict[TopicPartition, int]:
        """Offsets that may be committed now and are ahead of the last commit."""
        out = {}
        for tp, consumed in self._consumed.items():
            held = self._held.get(tp)
            offset = min(held.values()) if held else consumed
            if offset > self._committed.get(tp, -1):
                out[tp] = offset
        return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self._committed[tp] = max(offset, self._committed.get(tp, -1))

    def consumed_up_to(self, tp: TopicPartition) -> int | None:
        """One past the last offset consumed on ``tp`` (None before the first)."""
        return self._consumed.get(tp)

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._consumed)
