"""Live traffic for the benchmark, built from the call library; pure (no Kafka).

A load level is a target steady concurrency N. Calls arrive as a Poisson process of rate λ = N / D
(D the mean call length), so by Little's law N calls are open on average; at the start N calls are
already in progress, joined part-way (a benchmark that begins at steady state sees them), so a short
warm-up suffices.

Each call is a conversation of 2-6 minutes: turns of the library calls (each turn's audio as recorded,
on its own leg) chained from as many library calls as the length needs, interleaved so both legs move
on together, and placed on a new timeline with pauses and some overlaps, so that each leg talks 35-45 %
of the call. Every turn keeps its ground truth (leg, start_ms, end_ms, text) on the call's timeline:
the latency reference. Audio is 8 kHz μ-law (one byte a sample); between turns a leg carries line
noise at the library's level, as a real line does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.contracts.messages import LEGS, Leg
from pipeline.eval.call_library import LIBRARY_DIR, load_manifest

RATE = 8000
SAMPLES_PER_MS = RATE // 1000
FRAME_MS = 20
FRAME_BYTES = FRAME_MS * SAMPLES_PER_MS  # μ-law: one byte per sample
# A leg's consecutive turns stay this far apart: more than the segmenter's endpoint silence (500 ms) plus
# its post-roll (150 ms), so each turn closes a segment of its own and the ground truth stays per turn.
SAME_LEG_GAP_MS = 1200
# The library's line noise between turns (standard deviation of its leg channels outside the turns).
NOISE_STD = 0.0005
# Room the noise bed has beyond the longest call, to start each leg's noise at a different place.
NOISE_SPREAD_S = 60.0
MAX_COMPOSE_TRIES = 50


@dataclass(frozen=True)
class LibraryTurn:
    """One turn of a library call, where it lies in that call's recording."""

    call: str
    leg: Leg
    start_ms: int
    end_ms: int
    text: str

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class TurnLibrary:
    """The library's turns, per call in spoken order, and each call's legs as μ-law bytes."""

    calls: tuple[tuple[LibraryTurn, ...], ...]
    audio: Mapping[tuple[str, str], bytes] = field(repr=False)  # (library call, leg) -> the whole leg

    @classmethod
    def load(cls, folder: Path = LIBRARY_DIR) -> TurnLibrary:
        """Read the built library (``make setup``); raises LibraryNotBuilt when it is missing."""
        manifest = load_manifest(folder)
        calls, audio = [], {}
        for call in manifest["calls"]:
            loaded = load_audio(folder / call["file"])
            for channel, leg in enumerate(call["channel_legs"]):
                samples = resample(loaded.samples[channel], loaded.sample_rate, RATE)
                audio[(call["id"], leg)] = codecs.encode(samples, "mulaw")
            calls.append(tuple(LibraryTurn(call["id"], t["leg"], int(t["start_ms"]), int(t["end_ms"]), t["text"])
                               for t in call["turns"]))
        return cls(tuple(calls), audio)

    def turn_audio(self, turn: LibraryTurn) -> bytes:
        return self.audio[(turn.call, turn.leg)][turn.start_ms * SAMPLES_PER_MS:turn.end_ms * SAMPLES_PER_MS]


@dataclass(frozen=True)
class TrafficSpec:
    """One load level's traffic: N concurrent calls on average, of 2-6 minutes, each leg talking 35-45 %."""

    calls: int
    seed: int = 1
    min_call_s: float = 120.0
    max_call_s: float = 360.0
    talk_min: float = 0.35
    talk_max: float = 0.45
    # Share of speaker changes where the next speaker starts before the other has finished.
    overlap_share: float = 0.15

    @property
    def mean_call_s(self) -> float:
        """D: call lengths are drawn uniformly between the bounds."""
        return (self.min_call_s + self.max_call_s) / 2

    @property
    def arrival_rate_per_s(self) -> float:
        """λ = N / D."""
        return self.calls / self.mean_call_s


@dataclass(frozen=True)
class Turn:
    """A turn placed on a generated call's timeline: the ground truth its finals are matched to."""

    leg: Leg
    start_ms: int
    end_ms: int
    text: str
    source: LibraryTurn

    def shifted(self, by_ms: int) -> Turn:
        return replace(self, start_ms=self.start_ms + by_ms, end_ms=self.end_ms + by_ms)


@dataclass(frozen=True)
class CallPlan:
    """One generated call: when it starts (s from the traffic's start), its length and its turns."""

    call_id: str
    arrival_s: float
    duration_ms: int
    turns: tuple[Turn, ...]
    # The whole conversation's length; a call joined in progress starts ``joined_at_ms`` into it.
    full_duration_ms: int
    joined_at_ms: int = 0
    sources: tuple[str, ...] = ()  # the library calls its turns come from
    noise_offset: int = 0  # where its legs' line noise starts in the noise bed (samples)

    @property
    def end_s(self) -> float:
        return self.arrival_s + self.duration_ms / 1000

    @property
    def frames(self) -> int:
        return math.ceil(self.duration_ms / FRAME_MS)

    def open_at(self, t_s: float) -> bool:
        return self.arrival_s <= t_s < self.end_s

    def talk_ms(self, leg: str) -> int:
        return sum(t.end_ms - t.start_ms for t in self.turns if t.leg == leg)

    def talk_ratio(self, leg: str) -> float:
        return self.talk_ms(leg) / self.duration_ms

    def turns_of(self, leg: str) -> list[Turn]:
        return [t for t in self.turns if t.leg == leg]


# ---- composing one conversation ------------------------------------------------------------------
@dataclass(frozen=True)
class _Conversation:
    turns: tuple[Turn, ...]
    length_ms: int
    sources: tuple[str, ...]


@dataclass
class _Layout:
    """Turns placed with the least silence the conversation allows; ``pauses``: the turns that begin
    after a pause (not an overlap), where more silence may go without breaking any rule of the layout."""

    order: list[LibraryTurn]
    starts: list[int]
    pauses: list[int]
    length_ms: int


def compose(rng: np.random.Generator, library: TurnLibrary, spec: TrafficSpec) -> _Conversation:
    """One conversation of ``spec``'s length range and talk ratios."""
    # Budgets well inside the talk range: turns are taken whole, so a leg ends a little under its budget.
    inner_lo, inner_hi = spec.talk_min + 0.02, spec.talk_max - 0.02
    for _ in range(MAX_COMPOSE_TRIES):
        target_ms = rng.uniform(spec.min_call_s, spec.max_call_s) * 1000
        budgets: dict[str, float] = {leg: rng.uniform(inner_lo, inner_hi) * target_ms for leg in LEGS}
        picked, sources = _pick_turns(rng, library, budgets)
        talk = {leg: sum(t.duration_ms for t in picked[leg]) for leg in LEGS}
        if min(talk.values()) == 0:
            continue
        layout = _place(rng, _interleave(picked), spec)
        # Lengths where both legs' ratios are in range (5 ms inside, for rounding), within the bounds.
        lo = max(spec.min_call_s * 1000, max(talk.values()) / (spec.talk_max - 0.005), layout.length_ms)
        hi = min(spec.max_call_s * 1000, min(talk.values()) / (spec.talk_min + 0.005))
        lo_frames, hi_frames = math.ceil(lo / FRAME_MS), math.floor(hi / FRAME_MS)
        if lo_frames > hi_frames:
            continue
        length = FRAME_MS * min(max(round(target_ms / FRAME_MS), lo_frames), hi_frames)
        return _Conversation(_stretch(rng, layout, length), length, sources)
    raise RuntimeError(f"could not compose a {spec.min_call_s:g}-{spec.max_call_s:g} s call with each leg talking "
                       f"{spec.talk_min:.0%}-{spec.talk_max:.0%} from the library in {MAX_COMPOSE_TRIES} tries")


def _pick_turns(rng: np.random.Generator, library: TurnLibrary,
                budgets: Mapping[str, float]) -> tuple[dict[str, list[LibraryTurn]], tuple[str, ...]]:
    """Turns of library calls chained in random order, in spoken order, each leg's while they fit its
    budget (a longer call needs more library calls: 2 for the shortest, up to ~8 for six minutes)."""
    picked: dict[str, list[LibraryTurn]] = {leg: [] for leg in LEGS}
    left = dict(budgets)
    shortest = min(t.duration_ms for call in library.calls for t in call)
    sources: list[str] = []
    for index in rng.permutation(len(library.calls)):
        if all(v < shortest for v in left.values()):
            break
        took = False
        for turn in library.calls[index]:
            if turn.duration_ms <= left[turn.leg]:
                picked[turn.leg].append(turn)
                left[turn.leg] -= turn.duration_ms
                took = True
        if took:
            sources.append(library.calls[index][0].call)
    return picked, tuple(sources)


def _interleave(picked: Mapping[str, list[LibraryTurn]]) -> list[LibraryTurn]:
    """One speaking order: next is the leg that is furthest behind in its own share of talk, so both legs
    move on together (turns alternate, with a leg's second turn in a row where its turns are shorter)."""
    total = {leg: sum(t.duration_ms for t in turns) for leg, turns in picked.items()}
    done = dict.fromkeys(picked, 0)
    index = dict.fromkeys(picked, 0)
    order: list[LibraryTurn] = []
    last = ""
    while any(index[leg] < len(turns) for leg, turns in picked.items()):
        leg = min((leg for leg, turns in picked.items() if index[leg] < len(turns)),
                  key=lambda leg: (done[leg] / total[leg], leg == last))
        turn = picked[leg][index[leg]]
        order.append(turn)
        index[leg] += 1
        done[leg] += turn.duration_ms
        last = leg
    return order


def _place(rng: np.random.Generator, order: list[LibraryTurn], spec: TrafficSpec) -> _Layout:
    """Short pauses at speaker changes, an overlap at some, a gap between a leg's own turns."""
    frontier = int(rng.uniform(200, 1000))  # the first words come a moment after the call connects
    last_end: dict[str, float] = dict.fromkeys(LEGS, -math.inf)
    starts: list[int] = []
    pauses: list[int] = []
    previous: LibraryTurn | None = None
    for i, turn in enumerate(order):
        start = float(frontier)
        if previous is not None and turn.leg != previous.leg:
            if rng.random() < spec.overlap_share:
                # Never more than half of either turn: the other leg's speech stays mostly clear.
                start -= min(rng.uniform(200, 1000), 0.5 * min(turn.duration_ms, previous.duration_ms))
            else:
                start += rng.uniform(100, 500)
        start = max(start, last_end[turn.leg] + SAME_LEG_GAP_MS)
        begin = round(start)
        if i > 0 and begin >= frontier:
            pauses.append(i)
        starts.append(begin)
        last_end[turn.leg] = begin + turn.duration_ms
        frontier = max(frontier, begin + turn.duration_ms)
        previous = turn
    return _Layout(order, starts, pauses, frontier + int(rng.uniform(300, 800)))


def _stretch(rng: np.random.Generator, layout: _Layout, length_ms: int) -> tuple[Turn, ...]:
    """Spread the silence the length leaves over the pauses (exponential shares: mostly short, a few
    long ones, as dead air); each turn moves by the silence added before it, so gaps only grow and
    overlaps stay as placed."""
    extra = length_ms - layout.length_ms
    shift = [0] * len(layout.order)
    if layout.pauses and extra > 0:
        weights = rng.exponential(1.0, len(layout.pauses))
        cumulative = np.floor(extra * np.cumsum(weights) / weights.sum()).astype(int)
        added = dict(zip(layout.pauses, np.diff(cumulative, prepend=0), strict=True))
        running = 0
        for i in range(len(layout.order)):
            running += int(added.get(i, 0))
            shift[i] = running
    return tuple(
        Turn(turn.leg, start + moved, start + moved + turn.duration_ms, turn.text, turn)
        for turn, start, moved in zip(layout.order, layout.starts, shift, strict=True)
    )


# ---- the traffic of a run ------------------------------------------------------------------------------
def plan_traffic(library: TurnLibrary, spec: TrafficSpec, horizon_s: float, id_prefix: str) -> list[CallPlan]:
    """The calls of a run of ``horizon_s``: N in progress at the start, then Poisson arrivals (seeded, so
    the same spec gives the same calls whatever the id prefix)."""
    rng = np.random.default_rng(spec.seed)
    spread = int(NOISE_SPREAD_S * RATE)
    plans = [_joined(rng, library, spec, f"{id_prefix}-{i:05d}", int(rng.integers(spread)))
             for i in range(spec.calls)]
    t = 0.0
    while spec.calls > 0:
        t += rng.exponential(1.0 / spec.arrival_rate_per_s)
        if t >= horizon_s:
            break
        plans.append(arriving(rng, library, spec, f"{id_prefix}-{len(plans):05d}", t))
    return plans


def plan_steady_traffic(library: TurnLibrary, spec: TrafficSpec, horizon_s: float, id_prefix: str) -> list[CallPlan]:
    """The calls of a run of ``horizon_s`` with exactly N open at every moment: N lines, each one in progress
    at the start and then a new call as soon as its last one ends (a soak's load must not drift with Poisson
    luck: its figures are compared over time)."""
    rng = np.random.default_rng(spec.seed)
    spread = int(NOISE_SPREAD_S * RATE)
    plans: list[CallPlan] = []
    for _ in range(spec.calls):  # one line each
        plan = _joined(rng, library, spec, f"{id_prefix}-{len(plans):05d}", int(rng.integers(spread)))
        while True:
            plans.append(plan)
            if plan.end_s >= horizon_s:
                break
            plan = arriving(rng, library, spec, f"{id_prefix}-{len(plans):05d}", plan.end_s)
    return sorted(plans, key=lambda p: (p.arrival_s, p.call_id))


def arriving(rng: np.random.Generator, library: TurnLibrary, spec: TrafficSpec, call_id: str,
             arrival_s: float) -> CallPlan:
    """A whole new conversation that connects at ``arrival_s`` (put on the frame grid)."""
    conversation = compose(rng, library, spec)
    return CallPlan(call_id, round(arrival_s * 1000 / FRAME_MS) * FRAME_MS / 1000, conversation.length_ms,
                    conversation.turns, conversation.length_ms, sources=conversation.sources,
                    noise_offset=int(rng.integers(int(NOISE_SPREAD_S * RATE))))


def _joined(rng: np.random.Generator, library: TurnLibrary, spec: TrafficSpec, call_id: str,
            noise_offset: int) -> CallPlan:
    """A call already in progress at the start: the rest of a conversation from a uniform point of it.
    Conversations are drawn length-biased (the longer a call, the likelier it is in progress), and only
    turns that begin after the joining point are kept, so no speech starts mid-word."""
    while True:
        conversation = compose(rng, library, spec)
        if rng.random() < conversation.length_ms / (spec.max_call_s * 1000):
            break
    frames = conversation.length_ms // FRAME_MS
    joined_at = FRAME_MS * int(rng.integers(0, frames))
    turns = tuple(t.shifted(-joined_at) for t in conversation.turns if t.start_ms >= joined_at)
    return CallPlan(call_id, 0.0, conversation.length_ms - joined_at, turns, conversation.length_ms, joined_at,
                    conversation.sources, noise_offset)


def calls_open(plans: Sequence[CallPlan], t_s: float) -> int:
    return sum(1 for p in plans if p.open_at(t_s))


def mean_open(plans: Sequence[CallPlan], from_s: float, to_s: float, step_s: float = 1.0) -> tuple[float, int, int]:
    """Calls open over [from_s, to_s), sampled every ``step_s``: mean, least, most."""
    counts = [calls_open(plans, t) for t in np.arange(from_s, to_s, step_s)]
    if not counts:
        return 0.0, 0, 0
    return float(np.mean(counts)), min(counts), max(counts)


# ---- audio ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NoiseBed:
    """Line noise as μ-law, long enough for any call's leg from any offset up to NOISE_SPREAD_S."""

    max_call_s: float
    seed: int = 0

    @cached_property
    def data(self) -> bytes:
        samples = int((self.max_call_s + NOISE_SPREAD_S) * RATE) + FRAME_BYTES
        noise = np.random.default_rng(self.seed).normal(0.0, NOISE_STD, samples).astype(np.float32)
        return codecs.encode(noise, "mulaw")

    def take(self, n: int, offset: int) -> bytearray:
        return bytearray(self.data[offset:offset + n])


def render_leg(plan: CallPlan, leg: str, library: TurnLibrary, noise: NoiseBed) -> bytes:
    """One leg of a call as μ-law bytes, a whole number of frames: line noise, the leg's turns in place."""
    out = noise.take(plan.frames * FRAME_BYTES, (plan.noise_offset + LEGS.index(leg) * 7919) % (
        int(NOISE_SPREAD_S * RATE)))  # the other leg's noise starts elsewhere: no identical legs
    for turn in plan.turns_of(leg):
        audio = library.turn_audio(turn.source)
        at = turn.start_ms * SAMPLES_PER_MS
        out[at:at + len(audio)] = audio
    return bytes(out)


def frames_of(leg_audio: bytes) -> Iterator[bytes]:
    for at in range(0, len(leg_audio), FRAME_BYTES):
        yield leg_audio[at:at + FRAME_BYTES]
