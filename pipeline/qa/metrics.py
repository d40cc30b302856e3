"""Conversation metrics of one call, computed from the final segments of both legs.

Names follow AWS Contact Lens (talk time, non-talk time, interruptions, talk speed) and Google CCAI
Insights (silencePercentage, agentSpeakingPercentage, turnCount) where they have one. All times are
milliseconds from the start of the call; a call starts at 0.

Definitions (the why behind each choice is in the comments of the function that computes it):

- duration_ms: from 0 to the call end given by the caller, or to the end of the last segment.
- talk time of a leg: the union of that leg's segment intervals (overlapping segments of one leg count once).
- non_talk_ms: duration minus the union of both legs' speech (leading, trailing and inner gaps).
- silences: gaps between consecutive speech of either party, longer than ``silence_threshold_ms``;
  the lead-in before the first word and the tail after the last word are not silences (ringing, hang-up).
- overtalk: the periods where both legs speak at once (count of periods, total duration).
- interruption of leg Y by leg X: an X speech interval starts strictly inside a Y speech interval and
  the two overlap for at least ``interruption_min_overlap_ms``; shorter overlaps are backchannels
  ("mhm") or turn-taking jitter, not interruptions.
- agent_talk_share_pct: agent talk / (agent talk + customer talk).
- words per minute of a leg: words spoken by the leg / the leg's talk time in minutes.
- first_agent_response_ms: from the end of the customer's first segment to the start of the first agent
  segment that starts after it; None when the customer never speaks or the agent never answers.
  agent_first_speech_ms is the plain offset of the agent's first word from the call start.
- turn_count: the number of runs of consecutive segments of the same leg, in order of start time.
- longest monologue of a leg: the longest stretch that leg holds the floor alone: from the start of one
  of its speech intervals to the end of a later one, through its own pauses, as long as the other leg says
  nothing between them and no pause is longer than ``silence_threshold_ms``. The other leg talking over
  it ("mhm", an attempt to interrupt) does not end it; the other leg speaking in one of its pauses, or a
  silence, does. longest_monologue_ms is the longer of the two legs'.
- hold_ms, holds: the call's holds (PCI pauses, on-hold music: the telephony sent no audio), from the
  hold and resume call events; total duration (overlapping holds count once) and count. The hold's time
  stays in duration_ms and non_talk_ms: the call lasted that long, and the clock of the audio ran on.
- paused_ms, pauses: the call's secure pauses (an operator paused its capture during payment: the gateway
  dropped its audio), from the pause and unpause call events; total (overlapping ones once) and count. Not
  holds: nobody was on hold, the talk was just not captured. So a paused span is neither talk nor silence:
  it stays in duration_ms, but non_talk_ms and the talk and non-talk percentages are of the time that was
  captured (duration less paused_ms), and a gap between speech is cut at the pause's edges, each part a
  silence on its own if it is longer than the threshold (a 20 s payment does not make a 20 s silence).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from pipeline.qa.segment import Leg, Segment

Interval = tuple[int, int]


@dataclass(frozen=True)
class ConversationMetrics:
    duration_ms: int
    agent_talk_ms: int
    customer_talk_ms: int
    talk_ms: int
    non_talk_ms: int
    non_talk_pct: float
    agent_talk_pct: float
    customer_talk_pct: float
    agent_talk_share_pct: float
    longest_silence_ms: int
    silence_count: int
    silence_avg_ms: float
    overtalk_count: int
    overtalk_ms: int
    agent_interruptions: int
    customer_interruptions: int
    agent_wpm: float
    customer_wpm: float
    agent_words: int
    customer_words: int
    first_agent_response_ms: int | None
    agent_first_speech_ms: int | None
    turn_count: int
    hold_ms: int = 0
    holds: int = 0
    paused_ms: int = 0
    pauses: int = 0
    agent_longest_monologue_ms: int = 0
    customer_longest_monologue_ms: int = 0
    longest_monologue_ms: int = 0

    def as_dict(self) -> dict[str, float]:
        """Every defined metric as a float (the map<string,double> of the CallQA message); None is left out."""
        return {name: float(value) for name, value in asdict(self).items() if value is not None}


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted union of half-open intervals; touching intervals merge."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect_intervals(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted unions of disjoint intervals."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_intervals(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The parts of the sorted disjoint intervals ``a`` outside the sorted disjoint intervals ``b``."""
    out: list[Interval] = []
    for start, end in a:
        cursor = start
        for b_start, b_end in b:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                out.append((cursor, b_start))
            cursor = max(cursor, b_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def total_ms(intervals: Iterable[Interval]) -> int:
    return sum(end - start for start, end in intervals)


def gaps_between(intervals: Sequence[Interval]) -> list[int]:
    """Lengths of the gaps between consecutive disjoint sorted intervals."""
    return [nxt[0] - cur[1] for cur, nxt in zip(intervals, intervals[1:], strict=False) if nxt[0] > cur[1]]


def count_interruptions(by: Sequence[Interval], of: Sequence[Interval], min_overlap_ms: int) -> int:
    """How many speech intervals of ``by`` start strictly inside one of ``of`` and overlap it enough.

    Measured on merged speech, so a leg's continuing speech split over several segments is not counted
    as interrupting again.
    """
    count = 0
    for start, end in by:
        for o_start, o_end in of:
            if o_start < start < o_end and min(end, o_end) - start >= min_overlap_ms:
                count += 1
                break
    return count


def count_words(segments: Iterable[Segment]) -> int:
    return sum(len(s.text.split()) for s in segments)


def words_per_minute(words: int, talk_ms: int) -> float:
    return words * 60_000 / talk_ms if talk_ms > 0 else 0.0


def first_agent_response(segments: Sequence[Segment]) -> int | None:
    """Delay from the end of the customer's first segment to the next agent segment start.

    Measured from the customer's first words rather than the call start because agents usually open with
    a greeting before the customer says anything; what QA wants is how fast the customer got an answer.
    """
    customer = [s for s in segments if s.leg == "customer"]
    if not customer:
        return None
    first_end = min(customer, key=lambda s: (s.start_ms, s.end_ms)).end_ms
    later = [s.start_ms for s in segments if s.leg == "agent" and s.start_ms >= first_end]
    return min(later) - first_end if later else None


def longest_monologue(own: Sequence[Interval], other: Sequence[Interval], max_pause_ms: int) -> int:
    """Longest stretch of ``own`` speech (merged, sorted) that ``other`` does not speak into (module doc).

    Only the other leg's speech in one of the pauses ends a monologue: a monologue is about who holds the
    floor, and talking over someone who goes on talking does not take it from them.
    """
    longest = 0
    start = end = None
    for s, e in own:
        if start is None or end is None or s - end > max_pause_ms or intersect_intervals([(end, s)], other):
            start = s
        end = e
        longest = max(longest, end - start)
    return longest


def turn_count(segments: Sequence[Segment]) -> int:
    turns = 0
    previous: Leg | None = None
    for segment in sorted(segments, key=lambda s: (s.start_ms, s.end_ms)):
        if segment.leg != previous:
            turns += 1
            previous = segment.leg
    return turns


def _gaps(intervals: Sequence[Interval]) -> list[Interval]:
    """The gaps between consecutive disjoint sorted intervals, as intervals."""
    return [(cur[1], nxt[0]) for cur, nxt in zip(intervals, intervals[1:], strict=False) if nxt[0] > cur[1]]


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def compute_metrics(
    segments: Sequence[Segment],
    *,
    call_end_ms: int | None = None,
    silence_threshold_ms: int = 5000,
    interruption_min_overlap_ms: int = 500,
    holds_ms: Sequence[Interval] = (),
    pauses_ms: Sequence[Interval] = (),
) -> ConversationMetrics:
    """Conversation metrics of one call from the final segments of both legs (and its holds and secure pauses,
    if any)."""
    held = merge_intervals((start, end) for start, end in holds_ms if end > start)
    agent_segments = [s for s in segments if s.leg == "agent"]
    customer_segments = [s for s in segments if s.leg == "customer"]
    agent = merge_intervals((s.start_ms, s.end_ms) for s in agent_segments)
    customer = merge_intervals((s.start_ms, s.end_ms) for s in customer_segments)
    speech = merge_intervals([*agent, *customer])
    overtalk = intersect_intervals(agent, customer)
    last_end = max((s.end_ms for s in segments), default=0)
    duration = max(call_end_ms or 0, last_end)
    paused = intersect_intervals(merge_intervals((s, e) for s, e in pauses_ms if e > s), [(0, duration)])
    captured = duration - total_ms(paused)  # the call time whose audio was heard
    talk = total_ms(speech)
    non_talk = duration - total_ms(merge_intervals([*speech, *paused]))
    agent_talk, customer_talk = total_ms(agent), total_ms(customer)
    gaps = [end - start for start, end in subtract_intervals(_gaps(speech), paused)]
    silences = [gap for gap in gaps if gap > silence_threshold_ms]
    agent_words, customer_words = count_words(agent_segments), count_words(customer_segments)
    monologues = (longest_monologue(agent, customer, silence_threshold_ms),
                  longest_monologue(customer, agent, silence_threshold_ms))
    return ConversationMetrics(
        duration_ms=duration,
        agent_talk_ms=agent_talk,
        customer_talk_ms=customer_talk,
        talk_ms=talk,
        non_talk_ms=non_talk,
        non_talk_pct=_pct(non_talk, captured),
        agent_talk_pct=_pct(agent_talk, captured),
        customer_talk_pct=_pct(customer_talk, captured),
        agent_talk_share_pct=_pct(agent_talk, agent_talk + customer_talk),
        longest_silence_ms=max(gaps, default=0),
        silence_count=len(silences),
        silence_avg_ms=sum(silences) / len(silences) if silences else 0.0,
        overtalk_count=len(overtalk),
        overtalk_ms=total_ms(overtalk),
        agent_interruptions=count_interruptions(agent, customer, interruption_min_overlap_ms),
        customer_interruptions=count_interruptions(customer, agent, interruption_min_overlap_ms),
        agent_wpm=words_per_minute(agent_words, agent_talk),
        customer_wpm=words_per_minute(customer_words, customer_talk),
        agent_words=agent_words,
        customer_words=customer_words,
        first_agent_response_ms=first_agent_response(segments),
        agent_first_speech_ms=agent[0][0] if agent else None,
        turn_count=turn_count(segments),
        hold_ms=total_ms(held),
        holds=len(held),
        paused_ms=total_ms(paused),
        pauses=len(paused),
        agent_longest_monologue_ms=monologues[0],
        customer_longest_monologue_ms=monologues[1],
        longest_monologue_ms=max(monologues),
    )
