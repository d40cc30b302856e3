"""Final transcripts matched to the turns they transcribe; latency from the end of speech; pure.

A final is matched to the turn of its leg it overlaps most. Its speech ended when that turn's last
frame was due: the wall time of traffic time 0 + the call's arrival + the turn's end. When the
segmenter split a turn at a pause inside it, each final but the turn's last ends before the turn does:
their speech ended at their own end (the segmenter's, which includes its 150 ms post-roll), not at the
turn's, which has not been spoken yet. Latency = when the transcript was written to its topic (the
record's Kafka timestamp) - when its speech ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.bench.traffic import CallPlan, Turn

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class FinalSeen:
    """A final transcript as read from the transcripts topic."""

    call_id: str
    leg: str
    segment_id: str
    start_ms: int
    end_ms: int
    text: str
    written_s: float  # Kafka timestamp of the record (wall clock, s)
    received_s: float  # when the benchmark read it (wall clock, s)
    batch_size: int
    # The worker's own timings (wall clock, s): what the latency is made of (see ``stages``).
    closed_s: float | None = None  # the segmenter closed the segment
    wait_s: float = 0.0  # in the batcher before its batch ran
    inference_s: float = 0.0  # its batch's encoder + decoder
    produced_s: float | None = None  # the worker produced the transcript record

    @property
    def audio_s(self) -> float:
        return (self.end_ms - self.start_ms) / 1000


@dataclass(frozen=True)
class MatchedFinal:
    final: FinalSeen
    turn: Turn | None  # None: it overlaps no turn of its leg (noise taken for speech)
    speech_end_s: float | None  # wall clock
    split: bool = False  # the segmenter closed it inside its turn

    @property
    def latency_s(self) -> float | None:
        return None if self.speech_end_s is None else self.final.written_s - self.speech_end_s


def _overlap(turn: Turn, final: FinalSeen) -> int:
    return min(turn.end_ms, final.end_ms) - max(turn.start_ms, final.start_ms)


def unique_finals(finals: Iterable[FinalSeen]) -> list[FinalSeen]:
    """One final per segment id (at-least-once delivery may write one twice: the first counts)."""
    first: dict[tuple[str, str], FinalSeen] = {}
    for f in sorted(finals, key=lambda f: f.written_s):
        first.setdefault((f.call_id, f.segment_id), f)
    return list(first.values())


def match_finals(finals: Iterable[FinalSeen], plans: Mapping[str, CallPlan], started_wall_s: float) -> list[MatchedFinal]:
    """Every final of a planned call, matched to its turn (finals of other calls are left out)."""
    by_turn: dict[tuple[str, int], list[FinalSeen]] = {}
    unmatched: list[MatchedFinal] = []
    for final in unique_finals(finals):
        plan = plans.get(final.call_id)
        if plan is None:
            continue
        overlaps = [(_overlap(t, final), i) for i, t in enumerate(plan.turns) if t.leg == final.leg]
        best = max(overlaps, default=(0, -1))
        if best[0] <= 0:
            unmatched.append(MatchedFinal(final, None, None))
        else:
            by_turn.setdefault((final.call_id, best[1]), []).append(final)
    matched: list[MatchedFinal] = []
    for (call_id, index), group in by_turn.items():
        plan = plans[call_id]
        turn = plan.turns[index]
        at = started_wall_s + plan.arrival_s
        group.sort(key=lambda f: f.start_ms)
        for f in group[:-1]:
            end_ms = min(f.end_ms, turn.end_ms)
            matched.append(MatchedFinal(f, turn, at + end_ms / 1000, split=True))
        matched.append(MatchedFinal(group[-1], turn, at + turn.end_ms / 1000))
    return matched + unmatched


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    max_s: float | None
    mean_s: float | None

    def as_json(self) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {"finals": self.count, "p50_s": r(self.p50_s), "p95_s": r(self.p95_s), "p99_s": r(self.p99_s),
                "max_s": r(self.max_s), "mean_s": r(self.mean_s)}


def summarize(latencies: Sequence[float]) -> LatencySummary:
    if not latencies:
        return LatencySummary(0, None, None, None, None, None)
    values = np.asarray(latencies, dtype=float)
    p50, p95, p99 = (float(np.percentile(values, q)) for q in PERCENTILES)
    return LatencySummary(len(values), p50, p95, p99, float(values.max()), float(values.mean()))


def window_latency(matched: Iterable[MatchedFinal], from_s: float, to_s: float) -> LatencySummary:
    """Latency of the finals whose speech ended in [from_s, to_s) (wall clock)."""
    return summarize([m.latency_s for m in matched
                      if m.speech_end_s is not None and m.latency_s is not None and from_s <= m.speech_end_s < to_s])


def window_visible_latency(matched: Iterable[MatchedFinal], from_s: float, to_s: float) -> LatencySummary:
    """From the end of speech to when a read_committed consumer read the final (the benchmark's own tap):
    with exactly once, the latency above plus the wait for the transaction's commit."""
    return summarize([m.final.received_s - m.speech_end_s for m in matched
                      if m.speech_end_s is not None and from_s <= m.speech_end_s < to_s])


STAGES = ("endpoint", "after_close", "batcher_wait", "inference", "kafka_write")
STAGE_DOC = (
    "a final's latency split by the worker's own timings: endpoint = speech end -> the segmenter closed the "
    "segment (trailing silence, VAD windows, frames queued before the event loop took them); after_close = "
    "closed -> transcript produced; kafka_write = produced -> the record's Kafka timestamp (the three add up "
    "to the latency). batcher_wait and inference (its batch's encoder + decoder) are inside after_close, "
    "except for a segment decoded early (CALLQA_EARLY_DECODE), whose decode began before it closed"
)


def stages(matched: Iterable[MatchedFinal], from_s: float, to_s: float) -> dict[str, object]:
    """P50/P99 of each stage over the window's finals, and the mean stage mix of the slowest 5 % (where the
    tail's time goes). Finals without the worker's timings are left out."""
    rows: list[tuple[float, tuple[float, ...], FinalSeen]] = []
    for m in matched:
        f, latency = m.final, m.latency_s
        if (m.speech_end_s is None or latency is None or f.closed_s is None or f.produced_s is None
                or not from_s <= m.speech_end_s < to_s):
            continue
        rows.append((latency, (f.closed_s - m.speech_end_s, f.produced_s - f.closed_s, f.wait_s, f.inference_s,
                               f.written_s - f.produced_s), f))
    if not rows:
        return {"finals": 0}
    parts = np.asarray([r[1] for r in rows])
    latencies = np.asarray([r[0] for r in rows])
    slow = parts[latencies >= np.percentile(latencies, 95)]
    slowest = sorted(rows, key=lambda r: -r[0])[:5]
    return {
        "finals": len(rows),
        "p50_s": {name: round(float(np.percentile(parts[:, i], 50)), 3) for i, name in enumerate(STAGES)},
        "p99_s": {name: round(float(np.percentile(parts[:, i], 99)), 3) for i, name in enumerate(STAGES)},
        "slowest_5pct_mean_s": {name: round(float(slow[:, i].mean()), 3) for i, name in enumerate(STAGES)},
        "slowest": [{"latency_s": round(latency, 3), "audio_s": round(f.audio_s, 2), "batch_size": f.batch_size,
                     **{name: round(v, 3) for name, v in zip(STAGES, split, strict=True)}}
                    for latency, split, f in slowest],
    }


def written_in(finals: Iterable[FinalSeen], from_s: float, to_s: float) -> list[FinalSeen]:
    """Finals whose transcript was written in [from_s, to_s) (wall clock)."""
    return [f for f in finals if from_s <= f.written_s < to_s]


def batch_sizes(finals: Sequence[FinalSeen]) -> dict[str, object]:
    """Batch sizes from the finals' own ``batch_size`` (exact): segments per size, and the batches that makes
    (a batch of b segments holds b of them; batches cut by the window's edges make this an estimate)."""
    by_size: dict[int, int] = {}
    for f in finals:
        by_size[f.batch_size] = by_size.get(f.batch_size, 0) + 1
    batches = sum(n / size for size, n in by_size.items() if size > 0)
    return {
        "segments": len(finals), "batches": round(batches, 1),
        "mean_size": round(len(finals) / batches, 2) if batches else None,  # per batch
        "mean_size_per_segment": round(sum(s * n for s, n in by_size.items()) / len(finals), 2) if finals else None,
        "segments_by_size": {str(size): by_size[size] for size in sorted(by_size)},
    }


def turns_in_window(plans: Sequence[CallPlan], matched: Sequence[MatchedFinal], wall0: float, from_s: float,
                    to_s: float) -> tuple[int, int]:
    """Turns whose speech ended in [from_s, to_s) (wall clock), and how many of them no final was matched to."""
    heard = {(m.final.call_id, id(m.turn)) for m in matched if m.turn is not None}
    ending = [(p.call_id, t) for p in plans for t in p.turns if from_s <= wall0 + p.arrival_s + t.end_ms / 1000 < to_s]
    return len(ending), sum(1 for call_id, t in ending if (call_id, id(t)) not in heard)
