"""Geometry of a call's timeline, as boxes, markers and ticks in SVG user units: pure, no I/O.

Lanes, top to bottom: the agent's speech, the customer's speech, then one lane for what is between them:
overtalk (both speak) and silence (neither speaks for longer than the QA silence threshold, lead-in and tail
not counted, as pipeline/qa/metrics.py counts them). A hold (the telephony sent no audio) is a band across
both legs' lanes and the one between them, drawn beneath the speech, and not as the silence it also is. A
secure pause (the call's capture paused during payment: no audio was captured) is such a band of its own kind,
"paused", neither speech nor silence: a gap between speech is cut at its edges, as the metrics cut it. When turns carry sentiment, a last lane plots each
turn's score (−5..+5) at its middle, one line per leg. Live alerts are markers across the lanes. A keypad
tone (the caller typed on the keypad; the tone was silenced) is a "keypad" box on its leg's lane, drawn over
the speech. Every box and marker that belongs to a turn names the turn's anchor, so the SVG links to the transcript.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.qa.metrics import intersect_intervals, merge_intervals, subtract_intervals

Interval = tuple[int, int]
LEGS = ("agent", "customer")
LABEL_W = 84.0  # left gutter for the lane names
RIGHT_PAD = 12.0
LANE_H = 22.0
LANE_GAP = 8.0
TOP = 18.0  # room for the alert markers' heads
AXIS_H = 20.0
SENTIMENT_H = 60.0
MIN_BOX_W = 1.0  # a 100 ms turn on an hour-long call is still visible
SENTIMENT_RANGE = 5.0
# Tick spacing: the smallest step that keeps at most ~10 ticks.
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


@dataclass(frozen=True)
class Span:
    """A leg's speech turn: [start_ms, end_ms), its anchor in the page, its sentiment (None: not scored)."""

    leg: str
    start_ms: int
    end_ms: int
    anchor: str
    sentiment: float | None = None


@dataclass(frozen=True)
class Box:
    kind: str  # agent, customer, overtalk, silence, hold, paused, keypad
    x: float
    y: float
    width: float
    height: float
    start_ms: int
    end_ms: int
    anchor: str | None = None


@dataclass(frozen=True)
class Marker:
    """A live alert at ``offset_ms``: a vertical line from ``y1`` to ``y2`` at ``x``."""

    x: float
    y1: float
    y2: float
    offset_ms: int
    label: str
    anchor: str | None = None


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Lane:
    name: str
    y: float
    height: float


@dataclass(frozen=True)
class SentimentLine:
    leg: str
    points: tuple[tuple[float, float], ...]  # (x, y), in time order

    @property
    def svg_points(self) -> str:
        return " ".join(f"{x:g},{y:g}" for x, y in self.points)


@dataclass(frozen=True)
class Timeline:
    width: float
    height: float
    duration_ms: int
    lanes: tuple[Lane, ...]
    boxes: tuple[Box, ...]
    markers: tuple[Marker, ...]
    ticks: tuple[Tick, ...]
    axis_y: float
    sentiment: tuple[SentimentLine, ...] = ()
    sentiment_zero_y: float | None = None
    plot_x: float = LABEL_W  # where the time axis starts
    plot_width: float = 0.0

    def of_kind(self, kind: str) -> tuple[Box, ...]:
        return tuple(b for b in self.boxes if b.kind == kind)


@dataclass(frozen=True)
class AlertMark:
    offset_ms: int
    label: str
    anchor: str | None = None


def silences(speech: Sequence[Interval], threshold_ms: int, paused: Sequence[Interval] = ()) -> list[Interval]:
    """Gaps between consecutive speech (of either leg) longer than ``threshold_ms``: not the lead-in, not the tail;
    a gap is cut at the edges of the secure pauses in ``paused`` (sorted, disjoint), each part judged alone."""
    merged = merge_intervals(speech)
    gaps = subtract_intervals([(a[1], b[0]) for a, b in zip(merged, merged[1:], strict=False) if b[0] > a[1]], paused)
    return [(a, b) for a, b in gaps if b - a > threshold_ms]


def tick_step_s(duration_ms: int, most: int = 10) -> int:
    for step in TICK_STEPS_S:
        if duration_ms / 1000 / step <= most:
            return step
    return TICK_STEPS_S[-1]


def clock(ms: int) -> str:
    """m:ss (h:mm:ss from an hour on)."""
    s = int(ms // 1000)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _Scale:
    def __init__(self, duration_ms: int, width: float) -> None:
        self.duration_ms = max(duration_ms, 1)
        self.left = LABEL_W
        self.plot_w = width - LABEL_W - RIGHT_PAD

    def x(self, ms: float) -> float:
        ms = min(max(ms, 0), self.duration_ms)
        return round(self.left + ms / self.duration_ms * self.plot_w, 1)

    def box(self, kind: str, start: int, end: int, lane: Lane, anchor: str | None = None) -> Box:
        x0, x1 = self.x(start), self.x(end)
        return Box(kind, x0, lane.y, round(max(x1 - x0, MIN_BOX_W), 1), lane.height, start, end, anchor)


def layout(
    duration_ms: int,
    spans: Iterable[Span],
    holds: Sequence[Interval] = (),
    alerts: Sequence[AlertMark] = (),
    silence_threshold_ms: int = 5000,
    width: float = 960.0,
    pauses: Sequence[Interval] = (),
    keypad: Sequence[tuple[str, int, int]] = (),
) -> Timeline:
    """The timeline of a call lasting ``duration_ms`` (spans or holds past it are cut at its end); ``pauses``:
    its secure pauses; ``keypad``: its keypad tones, (leg, start_ms, end_ms)."""
    spans = sorted(spans, key=lambda s: (s.start_ms, s.leg))
    end = max([duration_ms, *(s.end_ms for s in spans), *(h[1] for h in holds), *(p[1] for p in pauses)],
              default=0)
    scale = _Scale(end, width)
    lanes = [Lane(leg, TOP + i * (LANE_H + LANE_GAP), LANE_H) for i, leg in enumerate(LEGS)]
    between = Lane("between", TOP + 2 * (LANE_H + LANE_GAP), LANE_H)
    lane_of = {lane.name: lane for lane in lanes}
    # Holds first: SVG paints in order, so a turn that overlaps a hold's edge stays visible on top of it.
    held = merge_intervals(h for h in holds if h[1] > h[0])
    band = Lane("hold", lanes[0].y, between.y + between.height - lanes[0].y)
    boxes = [scale.box("hold", a, b, band) for a, b in held]
    paused = merge_intervals(p for p in pauses if p[1] > p[0])
    boxes += [scale.box("paused", a, b, band) for a, b in paused]
    boxes += [scale.box(s.leg, s.start_ms, s.end_ms, lane_of[s.leg], s.anchor) for s in spans if s.leg in lane_of]
    boxes += [scale.box("keypad", a, b, lane_of[leg]) for leg, a, b in keypad if leg in lane_of and b > a]

    speech = {leg: merge_intervals((s.start_ms, s.end_ms) for s in spans if s.leg == leg) for leg in LEGS}
    overtalk = intersect_intervals(speech["agent"], speech["customer"])
    quiet = subtract_intervals(silences([*speech["agent"], *speech["customer"]], silence_threshold_ms, paused), held)
    boxes += [scale.box("silence", a, b, between) for a, b in quiet]
    boxes += [scale.box("overtalk", a, b, between) for a, b in overtalk]

    y = between.y + between.height + LANE_GAP
    all_lanes = [*lanes, between]
    lines: list[SentimentLine] = []
    zero_y = None
    scored = [s for s in spans if s.sentiment is not None and s.leg in lane_of]
    if scored:
        lane = Lane("sentiment", y, SENTIMENT_H)
        all_lanes.append(lane)
        zero_y = round(lane.y + lane.height / 2, 1)
        for leg in LEGS:
            points = tuple((scale.x((s.start_ms + s.end_ms) / 2), _sentiment_y(s.sentiment, lane))
                           for s in scored if s.leg == leg and s.sentiment is not None)
            if points:
                lines.append(SentimentLine(leg, points))
        y = lane.y + lane.height + LANE_GAP

    markers = tuple(Marker(scale.x(a.offset_ms), TOP - 10, y - LANE_GAP, a.offset_ms, a.label, a.anchor)
                    for a in sorted(alerts, key=lambda a: a.offset_ms))
    step_ms = tick_step_s(end) * 1000
    ticks = tuple(Tick(scale.x(t), clock(t)) for t in range(0, end + 1, step_ms))
    return Timeline(width, round(y + AXIS_H, 1), end, tuple(all_lanes), tuple(boxes), markers, ticks, round(y, 1),
                    tuple(lines), zero_y, scale.left, round(scale.plot_w, 1))


def _sentiment_y(score: float, lane: Lane) -> float:
    """+5 at the lane's top, −5 at its bottom; scores outside the scale are held at its ends."""
    clamped = min(max(score, -SENTIMENT_RANGE), SENTIMENT_RANGE)
    return round(lane.y + lane.height / 2 - clamped / SENTIMENT_RANGE * lane.height / 2, 1)
