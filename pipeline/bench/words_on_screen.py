"""When each spoken word first reached the screen: pure.

A word of a planned turn ends at the wall time of traffic time 0 + the call's arrival + the turn's start + the
word's end in its library turn (``word_times``). The desk's stream carries the call's turns as the worker
releases them: partials of an open segment, then its final. A turn event shows the words of the planned turn
of its call and leg that it transcribes: its normalised text aligned (longest common blocks) with the
turn's words spoken inside the audio the event covers (its start to its end, give or take ``SLACK_MS`` for
the aligner's error). A word is on screen from the first event that shows it; words no event shows (the
recogniser heard them otherwise) are counted, not timed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import numpy as np

from pipeline.bench.traffic import CallPlan, Turn
from pipeline.bench.word_times import TurnKey, WordTime, words_of
from pipeline.eval.wer import normalize_text

SLACK_MS = 200


@dataclass(frozen=True)
class ShownTurn:
    """A turn event as a stream client read it."""

    call_id: str
    leg: str
    start_ms: int
    end_ms: int
    text: str
    final: bool
    received_s: float  # wall clock

    @classmethod
    def from_event(cls, turn: Mapping[str, Any], received_s: float) -> ShownTurn:
        return cls(turn["call_id"], turn["leg"], int(turn["start_ms"]), int(turn["end_ms"]), turn["text"],
                   bool(turn["final"]), received_s)


@dataclass(frozen=True)
class WordShown:
    call_id: str
    leg: str
    word: str
    spoken_s: float  # wall clock of the word's end
    shown_s: float | None  # the first event showing it (None: none did)
    by_partial: bool = False

    @property
    def latency_s(self) -> float | None:
        return None if self.shown_s is None else self.shown_s - self.spoken_s


def words_shown(plans: Sequence[CallPlan], times: Mapping[TurnKey, tuple[WordTime, ...]],
                shown: Sequence[ShownTurn], started_wall_s: float) -> list[WordShown]:
    """Every word of the planned calls' turns, when it was spoken and when it was first shown."""
    events: dict[tuple[str, str], list[ShownTurn]] = {}
    for event in sorted(shown, key=lambda e: e.received_s):
        events.setdefault((event.call_id, event.leg), []).append(event)
    out: list[WordShown] = []
    for plan in plans:
        at = started_wall_s + plan.arrival_s
        for turn in plan.turns:
            words = words_of(times, turn.source)
            first = _first_shown(turn, words, events.get((plan.call_id, str(turn.leg)), []))
            out.extend(WordShown(plan.call_id, str(turn.leg), w.word, at + (turn.start_ms + w.end_ms) / 1000,
                                 *(first[i] or (None, False)))
                       for i, w in enumerate(words) if turn.start_ms + w.end_ms >= 0)
    return out


def _first_shown(turn: Turn, words: tuple[WordTime, ...],
                 events: Sequence[ShownTurn]) -> list[tuple[float, bool] | None]:
    first: list[tuple[float, bool] | None] = [None] * len(words)
    for event in events:  # in the order they arrived
        if event.end_ms < turn.start_ms or event.start_ms > turn.end_ms:
            continue
        inside = [i for i, w in enumerate(words)
                  if event.start_ms - SLACK_MS <= turn.start_ms + w.end_ms <= event.end_ms + SLACK_MS]
        if not inside:
            continue
        heard = normalize_text(event.text).split()
        matcher = SequenceMatcher(None, [words[i].word for i in inside], heard, autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                i = inside[block.a + k]
                if first[i] is None:
                    first[i] = (event.received_s, not event.final)
    return first


def summary(words: Sequence[WordShown], from_s: float, to_s: float) -> dict[str, Any]:
    """Words spoken in the window [from_s, to_s) (wall clock): how many were shown, and the delay from
    each one's end to its first showing (any event; and of those a partial showed first)."""
    spoken = [w for w in words if from_s <= w.spoken_s < to_s]
    timed = [w for w in spoken if w.latency_s is not None]
    by_partial = [w for w in timed if w.by_partial]

    def percentiles(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50_s": None, "p95_s": None, "p99_s": None, "max_s": None}
        a = np.asarray(values)
        return {"p50_s": round(float(np.percentile(a, 50)), 3), "p95_s": round(float(np.percentile(a, 95)), 3),
                "p99_s": round(float(np.percentile(a, 99)), 3), "max_s": round(float(a.max()), 3)}

    return {
        "words_spoken": len(spoken), "words_shown": len(timed),
        "first_by_partial": len(by_partial),
        "first_shown": percentiles([w.latency_s for w in timed if w.latency_s is not None]),
        "first_shown_by_partial": percentiles([w.latency_s for w in by_partial if w.latency_s is not None]),
    }
