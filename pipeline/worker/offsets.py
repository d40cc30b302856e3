"""Which input offsets may be committed.

After a crash or a rebalance a call is resumed from its newest checkpoint (pipeline/worker/checkpoints.py),
or, without one, replayed from its first frame, so that the segmenter sees exactly the audio it saw in
the clean run and produces the same segments with the same ids. So each open call holds, on each input
partition, the first offset it still needs: its first message, moved up (``hold_from``) as checkpoints
become durable. A partition's committable offset is the lowest hold on it (or, with no call open, one
past the last offset consumed). Faust's own ack bookkeeping is not used: it has
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

    def hold_from(self, tp: TopicPartition, holder: str, offset: int) -> None:
        """The holder needs ``tp`` only from ``offset`` on (a durable checkpoint covers what is before)."""
        held = self._held[tp]
        held[holder] = max(held.get(holder, offset), offset)

    def release_on(self, tp: TopicPartition, holder: str) -> None:
        """The holder needs nothing more of ``tp`` that it has consumed."""
        self._held.get(tp, {}).pop(holder, None)

    def forget(self, tps: set[TopicPartition]) -> None:
        """Partitions no longer assigned: their positions, holds and commits start afresh if they come back."""
        for tp in tps:
            self._consumed.pop(tp, None)
            self._held.pop(tp, None)
            self._committed.pop(tp, None)

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

    def committed_at(self, tp: TopicPartition) -> int:
        """The last offset committed on ``tp`` by this process (-1: none)."""
        return self._committed.get(tp, -1)

    def consumed_up_to(self, tp: TopicPartition) -> int | None:
        """One past the last offset consumed on ``tp`` (None before the first)."""
        return self._consumed.get(tp)

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._consumed)
