"""How well the sentiment scorer (pipeline/qa/sentiment.py) agrees with people, on the call library.

The reference: every customer turn of the library's scripts carries a mood (negative, neutral, positive)
and every call the customer's trend (improving, steady, worsening), labelled by reading the script
(samples/calls/library/README.md says how). Two measurements:

- ``evaluate_scripts()``: the scripts' own text, each turn one segment, redacted and scored by the
  ``CallAnalyzer`` as the worker would: per-turn agreement of ``label(score)`` with the mood, and each
  call's trend (computed over the customer's turns exactly as for a live call) against the story's.
- ``evaluate_transcripts(calls, manifest)``: the same on what the pipeline transcribed (``callqa analyze``
  or the worker's stored finals): each labelled turn is scored on the text of the customer segments that
  overlap it most, the trend on the segments themselves.

The library is split, fixed, in two halves (``half(call)``): the odd-numbered calls are the development
half, the only one looked at while choosing the contact-center lexicon (pipeline/qa/sentiment_lexicon.yaml),
the even-numbered ones are held out. Both hold all three moods and all three trends (worsening: 05 and 06,
steady: 07, 09, 17 and 16, 22). ``SentimentReport.of_half(name)`` reports one half: the held-out figure is
the honest one, the figure on all calls the one the goal (≥ 85 % of labelled turns, every
call's trend right) is judged on.

``baseline_agreement()`` gives VADER as it ships (its lexicon whole, its documented ±0.05 neutral band)
for comparison. ``python -m pipeline.eval.sentiment`` prints the report on the scripts.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.rules import RuleSet
from pipeline.qa.scorecard import Scorecard
from pipeline.qa.segment import Segment
from pipeline.qa.sentiment import LegSentiment, label

SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "samples" / "calls" / "library" / "scripts"
HALVES = ("dev", "held-out")
TURN_SPACING_MS = 10_000  # the scripts' turns as segments: only their order matters to the scorer
# Redaction on, no rules: the score of a turn depends on its redacted text alone.
_SCORER = QaConfig(RuleSet(()), Scorecard("none", ()))


def half(call: str) -> str:
    """``dev`` for an odd-numbered library call ("05_rude_agent"), ``held-out`` for an even-numbered one."""
    return "dev" if int(call.split("_", 1)[0]) % 2 else "held-out"


@dataclass(frozen=True)
class LabelledTurn:
    call: str
    index: int  # the turn's place among the call's turns (both legs), as the manifest's ``turns``
    text: str
    mood: str


@dataclass(frozen=True)
class ScoredTurn:
    turn: LabelledTurn
    score: float

    @property
    def got(self) -> str:
        return label(self.score)


@dataclass(frozen=True)
class CallTrend:
    call: str
    expected: str
    customer: LegSentiment

    @property
    def right(self) -> bool:
        return self.customer.trend == self.expected


@dataclass
class SentimentReport:
    turns: list[ScoredTurn] = field(default_factory=list)
    calls: list[CallTrend] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return sum(t.got == t.turn.mood for t in self.turns) / len(self.turns) if self.turns else 0.0

    @property
    def trends_right(self) -> int:
        return sum(c.right for c in self.calls)

    def of_half(self, name: str) -> SentimentReport:
        """The turns and calls of one half of the library (``half``)."""
        return SentimentReport([t for t in self.turns if half(t.turn.call) == name],
                               [c for c in self.calls if half(c.call) == name])

    def summary(self) -> str:
        agree = sum(t.got == t.turn.mood for t in self.turns)
        return (f"{agree}/{len(self.turns)} turns agree ({self.agreement:.1%}), "
                f"trend right in {self.trends_right}/{len(self.calls)} calls")

    def confusion(self) -> Counter[tuple[str, str]]:
        """(labelled, scored) → turns."""
        return Counter((t.turn.mood, t.got) for t in self.turns)

    def lines(self) -> list[str]:
        n = len(self.turns)
        out = [f"turns: {n - sum(t.got != t.turn.mood for t in self.turns)}/{n} agree ({self.agreement:.1%})",
               "confusion (labelled -> scored): " + ", ".join(
                   f"{a}->{b} {k}" for (a, b), k in sorted(self.confusion().items()))]
        out.append(f"customer trend right in {self.trends_right}/{len(self.calls)} calls")
        for c in self.calls:
            s = c.customer
            out.append(f"  {c.call:26} expected {c.expected:9} got {s.trend:9} start {s.start:+5.2f} "
                       f"end {s.end:+5.2f} overall {s.overall:+5.2f}{'' if c.right else '  <- differs'}")
        return out


def load_labels(scripts_dir: Path = SCRIPTS_DIR) -> dict[str, tuple[str, list[tuple[str, str, str]]]]:
    """Per script: (customer trend, [(leg, text, mood or "")] for every turn in order); holds left out."""
    out = {}
    for path in sorted(scripts_dir.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        turns = [(leg, str(node[leg]).strip(), str(node.get("mood", "")))
                 for node in doc["turns"] for leg in ("agent", "customer") if leg in node]
        out[path.stem] = (str(doc.get("customer_trend", "")), turns)
    return out


def _trend(call: str, expected: str, scores: Sequence[float]) -> CallTrend:
    return CallTrend(call, expected, LegSentiment.of("customer", scores))


def evaluate_scripts(scripts_dir: Path = SCRIPTS_DIR, call_ids: Sequence[str] = ()) -> SentimentReport:
    """The scorer on the scripts' own text (redacted as the worker redacts), against the labels; of
    ``call_ids`` only, where given (the calls a run transcribed)."""
    report = SentimentReport()
    for call, (trend, turns) in load_labels(scripts_dir).items():
        if call_ids and call not in call_ids:
            continue
        analyzer = CallAnalyzer(call, _SCORER)
        customer: list[float] = []
        for i, (leg, text, mood) in enumerate(turns):
            at = i * TURN_SPACING_MS
            analyzed = analyzer.process(Segment(call, leg, f"{call}/{i}", at, at + TURN_SPACING_MS // 2, text))  # type: ignore[arg-type]
            if leg == "customer":
                customer.append(analyzed.sentiment)
                report.turns.append(ScoredTurn(LabelledTurn(call, i, text, mood), analyzed.sentiment))
        report.calls.append(_trend(call, trend, customer))
    return report


def baseline_agreement(scripts_dir: Path = SCRIPTS_DIR, band: float = 0.05) -> float:
    """Plain VADER (lexicon as shipped, its documented ±0.05 compound band) on the scripts' customer turns."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    vader = SentimentIntensityAnalyzer()
    pairs = [(mood, vader.polarity_scores(text)["compound"]) for _, turns in load_labels(scripts_dir).values()
             for leg, text, mood in turns if leg == "customer"]
    agree = sum(mood == ("positive" if c >= band else "negative" if c <= -band else "neutral") for mood, c in pairs)
    return agree / len(pairs)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def evaluate_transcripts(calls: Iterable[tuple[str, Sequence[tuple[int, int, str, float]]]],
                         manifest: Mapping[str, Any]) -> SentimentReport:
    """The scorer on transcribed calls: ``calls`` = (library call id, its customer segments as
    (start_ms, end_ms, redacted text, score) in time order). A labelled turn is scored on the joined text
    of the segments that overlap it more than any other turn; the trend comes from the segments' scores."""
    from pipeline.qa.sentiment import score_text

    by_id = {c["id"]: c for c in manifest["calls"]}
    report = SentimentReport()
    for call_id, segments in calls:
        call = by_id[call_id]
        turns = [(i, t) for i, t in enumerate(call["turns"]) if t["leg"] == "customer"]
        texts: dict[int, list[str]] = {i: [] for i, _ in turns}
        for start, end, text, _ in segments:
            best = max(turns, key=lambda it: _overlap((start, end), (it[1]["start_ms"], it[1]["end_ms"])), default=None)
            if best is not None and _overlap((start, end), (best[1]["start_ms"], best[1]["end_ms"])) > 0:
                texts[best[0]].append(text)
        for i, t in turns:
            heard = " ".join(texts[i])
            report.turns.append(ScoredTurn(LabelledTurn(call_id, i, heard, t["mood"]), score_text(heard)))
        report.calls.append(_trend(call_id, call["expected"]["customer_trend"], [s[3] for s in segments]))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description="Sentiment scorer against the call library's labels (script text).")
    parser.add_argument("--scripts", type=Path, default=SCRIPTS_DIR)
    args = parser.parse_args()
    report = evaluate_scripts(args.scripts)
    print("\n".join(report.lines()))
    for name in HALVES:
        print(f"{name} half: {report.of_half(name).summary()}")
    print(f"plain VADER (whole lexicon, ±0.05 compound): {baseline_agreement(args.scripts):.1%} of turns agree")
    for t in report.turns:
        if t.got != t.turn.mood:
            print(f"  differs: {t.turn.call} turn {t.turn.index}: labelled {t.turn.mood}, scored {t.score:+.1f} "
                  f"({t.got}): {t.turn.text[:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
