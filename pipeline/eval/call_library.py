"""The contact-center call library (samples/calls/library/): loading it, scoring a pipeline run against its
manifest, and searching outputs for the PII it says must never be stored.

The library is built by ``scripts/build_call_library.py`` into ``samples/calls/library/built/`` (``make
setup`` does it); the manifest there states, for every call, the expected verdict of every rule and
scorecard question, the expected metrics with tolerances, the PII spans and each turn's text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.eval.dataset import SAMPLE_RATE, EvalUtterance
from pipeline.eval.numbers import cardinal
from pipeline.qa.numbers import digit_runs

LIBRARY_DIR = Path(__file__).resolve().parents[2] / "samples" / "calls" / "library" / "built"
# PII kinds long enough that finding them anywhere (ids, timestamps, log lines) cannot be chance.
LONG_KINDS = ("PAN", "SSN", "PHONE", "ROUTING", "ACCOUNT")
# A card leaks when this many of its consecutive digits appear in a call's text (PCI: the first six and
# last four may be shown, but the library's agents never read any part back, so any four is a leak).
CARD_WINDOW_IN_TEXT = 4
# In records and logs full of ids and timestamps, a shorter window would match by chance.
CARD_WINDOW_ANYWHERE = 8
# A value read in pieces over several turns (``part``): in its call's text each piece is a leak on its own
# ("six two" of a social security number), from this many digits (a single digit matches anything).
PART_MIN_DIGITS = 2
# Durations, offsets and metric checks that rationales and reasons print ("at 32.1 s", "12.5 %",
# "overtalk_ms = 0 (expected overtalk_ms < 10000)"): numbers of the pipeline's own, not PII.
_MEASURE = re.compile(
    r"\d+(?:\.\d+)?\s*(?:ms|s|%|kb|mb)\b|\b[a-z]+_[a-z_]+\s*(?:==|!=|<=|>=|=|<|>)\s*-?\d+(?:\.\d+)?",
    re.IGNORECASE,
)


class LibraryNotBuilt(RuntimeError):
    pass


def load_manifest(folder: Path = LIBRARY_DIR) -> dict[str, Any]:
    manifest = folder / "manifest.json"
    if not manifest.exists():
        raise LibraryNotBuilt(f"no call library in {folder}: run `make setup` (or "
                              "`python scripts/build_call_library.py`)")
    doc: dict[str, Any] = json.loads(manifest.read_text())
    return doc


def holds_of(call: Mapping[str, Any]) -> list[tuple[int, int]]:
    return [(int(h["start_ms"]), int(h["end_ms"])) for h in call.get("holds", [])]


# ---- PII search -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Leak:
    call: str
    kind: str
    needle: str
    where: str
    excerpt: str


def digit_text(text: str) -> str:
    """Every number ``text`` writes or says, as digit runs separated by spaces ("four one one one" -> "4111")."""
    return " ".join(run.digits for run in digit_runs(_MEASURE.sub(" ", text))[1])


# Where PII is searched: the free-text fields of decoded messages (for every PII kind of their call), and
# the tables a worker writes with their free-text columns (whole rows are searched for the long kinds).
TEXT_FIELDS = ("text", "rationale", "reason")
STORE_TABLES = ("segments", "calls", "call_qa", "qa_events", "latency")
TABLE_TEXT_COLUMNS = {"segments": ["text"], "call_qa": ["items.rationale"], "qa_events": ["text"]}


def message_texts(message: Any, path: str = "") -> list[tuple[str, str]]:
    """(field path, value) of every free-text field of a decoded message, nested records included."""
    out: list[tuple[str, str]] = []
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if isinstance(value, str) and f.name in TEXT_FIELDS:
            out.append((f"{path}{f.name}", value))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    out += message_texts(item, f"{path}{f.name}[{i}].")
    return out


def string_values(value: Any) -> str:
    """Every string inside a record (a row, a decoded message, nested lists, dicts and dataclasses), joined.

    Numbers are left out: floats such as 111.11111111 words a minute would read as digit runs, and the
    schemas keep no text in numeric fields.
    """
    if isinstance(value, str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, Mapping):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list | tuple):
        return " | ".join(s for s in (string_values(v) for v in value) if s)
    return ""


def _letters(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def email_variants(local: str) -> set[str]:
    """A mailbox name as ASR may write it: "kholloway72", "khollowayseventytwo", "khollowaysevenTwo"."""
    variants = {local}
    for digits in set(re.findall(r"\d+", local)):
        for spelled in (cardinal(int(digits)), [_DIGIT_WORDS[int(d)] for d in digits]):
            variants.add(local.replace(digits, "".join(spelled)))
    return {_letters(v) for v in variants}


_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _windows(digits: str, size: int) -> set[str]:
    return {digits[i:i + size] for i in range(len(digits) - size + 1)} if len(digits) > size else {digits}


def needles(span: Mapping[str, Any], *, in_text: bool) -> set[str]:
    """What to look for: in a call's own text every PII kind (cards by any 4 of their digits, a value read in
    pieces by each piece too); anywhere else only the long kinds and e-mail names (cards by any 8 digits)."""
    kind = span["kind"]
    if kind == "EMAIL":
        return email_variants(span["local"])
    digits = str(span["digits"])
    piece = digit_text(str(span.get("spoken", ""))).replace(" ", "") if span.get("part") is not None else ""
    pieces = {piece} if in_text and len(piece) >= PART_MIN_DIGITS else set()
    if kind == "PAN":
        return _windows(digits, CARD_WINDOW_IN_TEXT if in_text else CARD_WINDOW_ANYWHERE) | pieces
    if in_text or kind in LONG_KINDS:
        return {digits} | pieces
    return set()


def find_leaks(call: str, spans: Sequence[Mapping[str, Any]], texts: Iterable[tuple[str, str]],
               *, in_text: bool) -> list[Leak]:
    """Leaks of ``spans`` in ``texts`` ((where, text) pairs): digits compared after reading spoken numbers,
    e-mail names after dropping everything but letters and digits. A span's own ``call`` key, when it has
    one, names the leak's call (to search many calls' spans in one pass)."""
    leaks: list[Leak] = []
    for where, text in texts:
        numbers, letters = f" {digit_text(text)} ", _letters(text)
        for span in spans:
            haystack = letters if span["kind"] == "EMAIL" else numbers
            for needle in sorted(needles(span, in_text=in_text)):
                if needle and needle in haystack:
                    leaks.append(Leak(span.get("call", call), span["kind"], needle, where, text[:160]))
                    break
    return leaks


# ---- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Disagreement:
    call: str
    what: str
    expected: str
    got: str


def rule_verdicts(events: Iterable[Mapping[str, Any]], rule_names: Iterable[str]) -> dict[str, str]:
    """present / absent per rule from a call's QA events (match, violation, alert = present)."""
    found = {e["rule"] for e in events if e["kind"] in ("match", "violation", "alert")}
    return {name: "present" if name in found else "absent" for name in rule_names}


def item_verdicts(items: Iterable[tuple[str, bool]], question_ids: Mapping[str, str]) -> dict[str, str]:
    """pass / fail per question id from (question text, passed); a question not reported is "na"."""
    got = {question_ids[q]: "pass" if passed else "fail" for q, passed in items if q in question_ids}
    return {qid: got.get(qid, "na") for qid in question_ids.values()}


def compare(call: str, expected: Mapping[str, str], got: Mapping[str, str], skip: Iterable[str] = ()) -> tuple[int, list[Disagreement]]:
    """How many verdicts were compared, and the ones that differ (``skip``: expectations too close to call)."""
    skipped = set(skip)
    keys = [k for k in expected if k not in skipped]
    return len(keys), [Disagreement(call, k, expected[k], got.get(k, "?")) for k in keys if got.get(k) != expected[k]]


def metric_misses(call: str, expected: Mapping[str, float], tolerances: Mapping[str, float],
                  got: Mapping[str, float]) -> list[Disagreement]:
    out = []
    for name, value in expected.items():
        actual = got.get(name)
        if actual is None or abs(actual - value) > tolerances[name]:
            out.append(Disagreement(call, name, f"{value:g}±{tolerances[name]:g}",
                                    "missing" if actual is None else f"{actual:g}"))
    return out


def redacted_reference(call: Mapping[str, Any], leg: str) -> str:
    """The scripted words of one leg with every PII span replaced by its redaction marker."""
    texts = []
    for i, turn in enumerate(call["turns"]):
        if turn["leg"] != leg:
            continue
        text = turn["text"]
        for span in call["pii"]:
            if span["turn"] == i:
                text = text.replace(span["spoken"], f" {span['kind'].lower()} ")
        texts.append(text)
    return " ".join(texts)


# ---- spoken numbers as an evaluation set ----------------------------------------------------------
# Audio kept either side of a spoken number's span, as a segmenter's pre-roll and endpoint would.
NUMBER_MARGIN_MS = 300


def number_utterances(folder: Path = LIBRARY_DIR) -> list[EvalUtterance]:
    """Every spoken number of the library (cards, expiry dates, codes, phones) as an
    EvalUtterance: the span cut from its leg with NUMBER_MARGIN_MS either side, through G.711 μ-law as a
    gateway sends it, at 16 kHz; its reference is the span's spoken words."""
    utterances = []
    for call in load_manifest(folder)["calls"]:
        audio = load_audio(folder / call["file"])
        # Numbers said as numbers: not e-mail names, nor dates of birth and addresses (words around a number).
        for i, span in enumerate(s for s in call["pii"] if s["kind"] not in ("EMAIL", "DOB", "ADDRESS")):
            leg = audio.samples[call["channel_legs"].index(span["leg"])]
            per_ms = audio.sample_rate // 1000
            clip = leg[max(0, (span["start_ms"] - NUMBER_MARGIN_MS) * per_ms):
                       (span["end_ms"] + NUMBER_MARGIN_MS) * per_ms]
            received = codecs.decode(codecs.encode(resample(clip, audio.sample_rate, 8000), "mulaw"), "mulaw")
            utterances.append(EvalUtterance(f"library/{call['id']}/{span['kind']}-{i}",
                                            resample(received, 8000, SAMPLE_RATE), str(span["spoken"]),
                                            str(folder / call["file"]), "call library (synthesised, project's own)"))
    return utterances


# ---- whole legs as an evaluation set (conversation) ------------------------------------------------
def leg_utterances(folder: Path = LIBRARY_DIR) -> list[EvalUtterance]:
    """Every leg of every library call as one EvalUtterance: the whole channel (1-4 min, the other
    party's turns as silence, holds included), at 16 kHz; its reference is the leg's turns in order, PII
    as spoken. Each leg is many segments of one speaker's running talk: the set on which a leg's
    previous text can help (or drag) the next segment's decoding."""
    utterances = []
    for call in load_manifest(folder)["calls"]:
        audio = load_audio(folder / call["file"])
        for channel, leg in enumerate(call["channel_legs"]):
            reference = " ".join(t["text"] for t in call["turns"] if t["leg"] == leg)
            utterances.append(EvalUtterance(f"library/{call['id']}/{leg}",
                                            resample(audio.samples[channel], audio.sample_rate, SAMPLE_RATE),
                                            reference, str(folder / call["file"]),
                                            "call library (synthesised, project's own)"))
    return utterances
