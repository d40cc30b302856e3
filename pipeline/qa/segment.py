"""The unit of input of call QA: one transcribed utterance of one leg of a call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Leg = Literal["agent", "customer"]
LEGS: tuple[Leg, ...] = ("agent", "customer")


@dataclass(frozen=True)
class Segment:
    """A final transcript segment; times are milliseconds from the start of the call."""

    call_id: str
    leg: Leg
    segment_id: str
    start_ms: int
    end_ms: int
    text: str

    def __post_init__(self) -> None:
        if self.leg not in LEGS:
            raise ValueError(f"leg must be one of {LEGS}, got {self.leg!r}")
        if self.end_ms < self.start_ms:
            raise ValueError(f"segment {self.segment_id}: end_ms {self.end_ms} < start_ms {self.start_ms}")

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms

    def with_text(self, text: str) -> Segment:
        """The same segment (same timing) carrying other text, e.g. after redaction."""
        return replace(self, text=text)
