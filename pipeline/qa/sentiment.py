"""Sentiment of each final segment, each leg's trend over the call, and the sharp-drop test of live alerts.

The scorer is VADER (PyPI ``vaderSentiment``: a lexicon and rules, MIT, shipped in the wheel, no model to
download), run on the segment's text *after* PII redaction: nothing is scored or stored that the
redacted transcript does not already hold. Definitions (what the store, the rules and the report mean):

- score of a segment: VADER's compound (−1..+1) times 5, rounded to one decimal: Amazon Contact Lens's
  −5..+5 scale, linear so that 0 stays neutral.
- label of a score: ``positive`` from +1.0 (``NEUTRAL_BAND``), ``negative`` from −1.0, else ``neutral``.
  VADER's own docs put the band at ±0.05 compound (±0.25 points); on spoken turns that colours every
  polite request ("I would like to ..." scores +1.8), so a turn must reach one point of five.
- conversational particles: answer words and "please" (``DIALOGUE_PARTICLES``) score 0. VADER's lexicon
  comes from social media, where "yes", "no", "okay", "sure", "please" carry feeling; in a service call
  they answer or ask ("No that is all" is not negative, "Sure, it is the fourth of May" not positive).
- contact-center lexicon (``sentiment_lexicon.yaml``, each group with its reason): words that in a
  service call ask or name the call's subject score 0 ("I would like to", "help", "accident", "damage"),
  the formulaic decline "No, thank you" scores 0 (VADER: +1.8, or −1.4 without the comma), and plain
  complaints of service failure score negative ("nobody has called me back", "I already sent it",
  "I want to speak to a manager"). Phrases of several words are replaced by one token before VADER
  scores the turn (VADER scores words). Chosen on the development half of the call library only.
- a leg's turns: its final segments in time order (a segment is the unit the worker stores and scores).
- start / end of a leg: the mean score of its first / last third of turns (``ceil(n / 3)`` turns: one
  turn for up to three, two for four to six...). trend: ``end − start`` ≥ +1 point (``TREND_POINTS``)
  improving, ≤ −1 worsening, else steady. overall: the mean of all its turns.
- sharp drop (a live alert, rules/README.md): a leg's turn that scores ``drop`` points or more below
  the best of the leg's previous ``turns − 1`` turns, and is itself negative (≤ −1); not raised again
  while the leg's turn before it met the same test (one falling run is one alert).

How well this matches people: ``pipeline/eval/sentiment.py`` on the call library's labelled turns.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.qa.segment import LEGS, Leg

SCALE = 5.0  # compound −1..+1 to the −5..+5 scale
NEUTRAL_BAND = 1.0  # points: |score| below this is neutral
TREND_POINTS = 1.0  # points: a change of start to end below this is steady
DIALOGUE_PARTICLES = frozenset({"yes", "yeah", "yep", "no", "nope", "ok", "okay", "alright", "sure", "please"})

Label = Literal["negative", "neutral", "positive"]
Trend = Literal["improving", "steady", "worsening"]
LABELS: tuple[Label, ...] = ("negative", "neutral", "positive")
TRENDS: tuple[Trend, ...] = ("improving", "steady", "worsening")

LEXICON_FILE = Path(__file__).with_name("sentiment_lexicon.yaml")
_analyzer: Any = None
_phrases: tuple[re.Pattern[str], dict[str, str]] | None = None
_lock = threading.Lock()


@dataclass(frozen=True)
class Lexicon:
    """The contact-center supplement: single words and several-word phrases, VADER's −4..+4 values."""

    words: dict[str, float]
    phrases: dict[str, float]

    @staticmethod
    def token(phrase: str) -> str:
        """The one word a phrase becomes before VADER scores the turn (VADER keeps inner underscores)."""
        return "cc_" + "_".join(phrase.lower().split())

    def entries(self) -> dict[str, float]:
        """What goes into VADER's lexicon: the words and each phrase's token."""
        return self.words | {self.token(p): v for p, v in self.phrases.items()}


def load_lexicon(path: Path = LEXICON_FILE) -> Lexicon:
    words: dict[str, float] = {}
    phrases: dict[str, float] = {}
    for group in yaml.safe_load(path.read_text())["groups"]:
        words |= {str(w).lower(): float(v) for w, v in (group.get("words") or {}).items()}
        phrases |= {" ".join(str(p).lower().split()): float(v) for p, v in (group.get("phrases") or {}).items()}
    return Lexicon(words, phrases)


def _phrase_pattern(phrases: Mapping[str, float]) -> re.Pattern[str]:
    """One alternation, longest phrase first; words may be separated by spaces and commas ("No, thanks")."""
    alternatives = [r"[\s,]+".join(map(re.escape, p.split())) for p in sorted(phrases, key=len, reverse=True)]
    return re.compile(r"\b(?:" + "|".join(alternatives) + r")\b", re.IGNORECASE)


def _vader() -> Any:
    """One analyzer per process (it reads a 7,500-word lexicon): particles out, the supplement in."""
    global _analyzer, _phrases
    with _lock:
        if _analyzer is None:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

            analyzer = SentimentIntensityAnalyzer()
            for word in DIALOGUE_PARTICLES:
                analyzer.lexicon.pop(word, None)
            lexicon = load_lexicon()
            analyzer.lexicon.update(lexicon.entries())
            tokens = {p: lexicon.token(p) for p in lexicon.phrases}
            _phrases = (_phrase_pattern(lexicon.phrases), tokens)
            _analyzer = analyzer
        return _analyzer


def _join_phrases(text: str) -> str:
    """Each lexicon phrase in the text replaced by its token."""
    assert _phrases is not None
    pattern, tokens = _phrases
    return pattern.sub(lambda m: " " + tokens[" ".join(re.split(r"[\s,]+", m.group(0).lower()))] + " ", text)


def score_text(text: str) -> float:
    """The sentiment of one (redacted) turn on −5..+5, one decimal; 0.0 for no words."""
    if not text.strip():
        return 0.0
    vader = _vader()
    compound = float(vader.polarity_scores(_join_phrases(text))["compound"])
    return round(compound * SCALE, 1) + 0.0  # + 0.0: no "-0.0"


def label(score: float) -> Label:
    if score >= NEUTRAL_BAND:
        return "positive"
    if score <= -NEUTRAL_BAND:
        return "negative"
    return "neutral"


def trend_of(change: float) -> Trend:
    if change >= TREND_POINTS:
        return "improving"
    if change <= -TREND_POINTS:
        return "worsening"
    return "steady"


def edge_turns(count: int) -> int:
    """How many turns make the start (and the end) of a leg of ``count`` turns: a third, at least one."""
    return max(1, math.ceil(count / 3)) if count else 0


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 2) if values else 0.0


@dataclass(frozen=True)
class LegSentiment:
    """One leg's sentiment over the call (scores on −5..+5); ``turns`` 0: the leg never spoke."""

    leg: Leg
    turns: int
    overall: float
    start: float
    end: float

    @property
    def change(self) -> float:
        return round(self.end - self.start, 2)

    @property
    def trend(self) -> Trend:
        return trend_of(self.change)

    @classmethod
    def of(cls, leg: Leg, scores: Sequence[float]) -> LegSentiment:
        """From the leg's turn scores in time order."""
        k = edge_turns(len(scores))
        return cls(leg, len(scores), _mean(scores), _mean(scores[:k]), _mean(scores[len(scores) - k:]))


@dataclass(frozen=True)
class CallSentiment:
    """Both legs of a call; ``as_metrics`` gives the figures scorecard checks and the CallQA metrics use."""

    legs: dict[Leg, LegSentiment]

    def leg(self, leg: Leg) -> LegSentiment:
        return self.legs.get(leg) or LegSentiment(leg, 0, 0.0, 0.0, 0.0)

    def as_metrics(self) -> dict[str, float]:
        """``<leg>_sentiment``, ``<leg>_sentiment_start``, ``_end``, ``_change`` for each leg that spoke."""
        out: dict[str, float] = {}
        for leg in LEGS:
            s = self.leg(leg)
            if s.turns:
                out |= {f"{leg}_sentiment": s.overall, f"{leg}_sentiment_start": s.start,
                        f"{leg}_sentiment_end": s.end, f"{leg}_sentiment_change": s.change}
        return out


SENTIMENT_METRICS = frozenset(
    f"{leg}_sentiment{part}" for leg in LEGS for part in ("", "_start", "_end", "_change")
)


def call_sentiment(turns: Sequence[tuple[Leg, float]]) -> CallSentiment:
    """From every scored turn of the call, (leg, score) in time order."""
    return CallSentiment({leg: LegSentiment.of(leg, [s for lg, s in turns if lg == leg]) for leg in LEGS})


def drop_of(scores: Sequence[float], turns: int) -> float:
    """How far the last score fell below the best of the ``turns − 1`` before it (0 if it did not fall)."""
    window = list(scores[-turns:])
    if len(window) < 2:
        return 0.0
    return round(max(0.0, max(window[:-1]) - window[-1]), 2)


def is_sharp_drop(scores: Sequence[float], drop_points: float, turns: int) -> bool:
    """The last turn is negative and fell at least ``drop_points`` within the leg's last ``turns`` turns."""
    return bool(scores) and label(scores[-1]) == "negative" and drop_of(scores, turns) >= drop_points
