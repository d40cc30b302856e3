"""Frames of partitions whose checkpoints are still being read, held back so that such a partition
stalls only itself.

On an assignment the worker reads each new audio partition's checkpoints before any of its calls opens
(registry.py). The audio agent is one loop over all partitions: a frame of such a partition used to wait
there for the read, and every other partition's frames waited behind it. Now its frames are held here, in
order, while the others go on; once the read is done they go first, before any newer frame of theirs.
They are not consumed while held (no offset moves past them). A rebalance that moves the partition drops
them: its next owner reads them from the last commit. One that keeps it keeps them, in order: newer frames
of the partition fetched before the rebalance may still come, and must not overtake them (a call opened
at a later frame would take its earlier audio, read again from the commit, as late: silence).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from pipeline.contracts.messages import AudioFrame
from pipeline.worker.offsets import TopicPartition

Frame = tuple[TopicPartition, int, AudioFrame]


class WaitingFrames:
    def __init__(self) -> None:
        self._held: dict[int, list[Frame]] = {}

    def admit(self, frames: Sequence[Frame], loading: Set[int]) -> list[Frame]:
        """The frames to take now, in order: those held for partitions no longer ``loading`` (their
        checkpoints read), then ``frames`` but those of partitions still loading (or with frames held
        before them), which are held."""
        if not self._held and not loading:  # the usual case: nothing to hold back
            return list(frames)
        out: list[Frame] = []
        for partition in [p for p in self._held if p not in loading]:
            out += self._held.pop(partition)
        for frame in frames:
            partition = frame[0][1]
            if partition in self._held or partition in loading:
                self._held.setdefault(partition, []).append(frame)
            else:
                out.append(frame)
        return out

    def ready(self, loading: Set[int]) -> bool:
        """Some held frames may be taken now."""
        return any(p not in loading for p in self._held)

    def drop(self, partitions: Iterable[int]) -> None:
        """Partitions moved to another worker: their held frames are its to read, from the last commit."""
        for partition in partitions:
            self._held.pop(partition, None)

    def __len__(self) -> int:
        return sum(len(held) for held in self._held.values())
