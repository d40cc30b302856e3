"""Redaction of what callers say about themselves, measured on hand-labelled ASR-style turns
(tests/qa/data/personal_pii.yaml): recall per kind (every labelled item gone from the answer), precision
(markers in answers that hold nothing personal), and the cost per segment (printed, not asserted)."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.qa.redaction import MARKERS, CallRedactor
from pipeline.qa.segment import Segment

CASES: list[dict[str, Any]] = yaml.safe_load((Path(__file__).parent / "data" / "personal_pii.yaml").read_text())
CARD_DATA = ("PAN", "CVV", "EXPIRY")
MARKER = re.compile(r"\[(" + "|".join(MARKERS) + r")\]")
# Words of a labelled item that would still give it away if left in the answer.
FILLER = {"the", "of", "and", "it's", "um", "uh"}


def redacted_answer(case: dict[str, Any]) -> str:
    redactor = CallRedactor()
    redactor.redact(Segment("c", "agent", "s1", 0, 2000, case["agent"]))
    return redactor.redact(Segment("c", "customer", "s2", 2500, 6000, case["customer"])).text


def gone(item: str, answer: str) -> bool:
    left = Counter(MARKER.sub(" ", answer).lower().split())
    return not any(left[word] for word in item.lower().split() if word not in FILLER)


def figures() -> dict[str, Any]:
    caught: Counter[str] = Counter()
    labelled: Counter[str] = Counter()
    markers = false_markers = 0
    for case in CASES:
        answer = redacted_answer(case)
        found = len(MARKER.findall(answer))
        markers += found
        if case.get("none"):
            false_markers += found
        for kind, items in case.get("pii", {}).items():
            for item in items:
                labelled[kind] += 1
                caught[kind] += gone(item, answer)
    return {"recall": {k: caught[k] / labelled[k] for k in labelled}, "labelled": dict(labelled),
            "precision": (markers - false_markers) / markers if markers else 1.0, "markers": markers}


def test_recall_and_precision_on_the_labelled_turns() -> None:
    got = figures()
    print(f"\npersonal PII: {got}")
    card = sum(got["recall"][k] * got["labelled"][k] for k in CARD_DATA) / sum(got["labelled"][k] for k in CARD_DATA)
    assert card >= 0.95
    assert got["recall"]["DOB"] >= 0.9 and got["recall"]["ADDRESS"] >= 0.9
    assert min(got["recall"][k] for k in ("ACCOUNT", "ROUTING", "PIN")) >= 0.9
    assert got["precision"] >= 0.9


@pytest.mark.parametrize("case", [c for c in CASES if c.get("none")], ids=lambda c: c["customer"][:30])
def test_answers_without_personal_data_stay_readable(case: dict[str, Any]) -> None:
    assert redacted_answer(case) == case["customer"]


def test_the_caller_s_date_of_birth_and_street_from_the_issue() -> None:
    """The reported case: a call page showed "the third of March 1984 and 12 Oak Street" in clear."""
    answer = redacted_answer({"agent": "can you confirm your date of birth and address please",
                              "customer": "the third of March 1984 and 12 Oak Street"})
    assert answer == "the [DOB] and [ADDRESS]"


def test_cost_per_segment() -> None:
    turns = [c for c in CASES] * 20
    began = time.perf_counter()
    for case in turns:
        redacted_answer(case)
    per_segment_us = (time.perf_counter() - began) / (2 * len(turns)) * 1e6
    print(f"\nredaction: {per_segment_us:.0f} µs per segment ({2 * len(turns)} segments)")


NAME_CASES = [
    ("can i have your full name please", "yes it's john smith", "john smith"),
    ("and the name on the card", "mary ann jones", "mary ann jones"),
    ("how can i help", "hi my name is priya patel and i'm calling about my bill", "priya patel"),
    ("who am i speaking with", "this is robert", None),  # no name question, no "my name is": kept
    ("what's your surname", "o'connor", "o'connor"),
]


@pytest.mark.parametrize(("agent", "customer", "name"), NAME_CASES, ids=[c[1][:20] for c in NAME_CASES])
def test_names_are_redacted_only_when_set(agent: str, customer: str, name: str | None) -> None:
    def answer(names: bool) -> str:
        redactor = CallRedactor(names=names)
        redactor.redact(Segment("c", "agent", "s1", 0, 2000, agent))
        return redactor.redact(Segment("c", "customer", "s2", 2500, 6000, customer)).text

    assert answer(names=False) == customer
    if name is None:
        assert answer(names=True) == customer
    else:
        assert name not in answer(names=True) and "[NAME]" in answer(names=True)


def test_a_card_number_read_while_a_date_of_birth_is_in_context_is_a_pan() -> None:
    """The chaos test's call: the card number came within three segments of the date-of-birth question, and
    the date finder took the run of numbers for a date ([DOB] live, [PAN] offline, by context)."""
    for card in ("4111 1111 1111 1111", "four one one one one one one one one one one one one one one one"):
        answer = redacted_answer({"agent": "can you confirm your date of birth and then the card number",
                                  "customer": f"{card}."})
        assert answer == "[PAN].", card


def test_a_resumed_call_s_stored_markers_open_no_context() -> None:
    """A call resumed from its stored finals feeds the redactor their redacted text: "[DOB]", "[PIN]",
    "[ADDRESS]" must not open the contexts their words would (the 6-digit order number stays readable)."""
    for stored in ("It's [DOB].", "[PIN]", "[ADDRESS] please", "it's [ROUTING]"):
        redactor = CallRedactor()
        redactor.redact(Segment("c", "customer", "s1", 0, 2000, stored))
        answer = redactor.redact(Segment("c", "customer", "s2", 2500, 6000, "the order is 445566")).text
        assert answer == "the order is 445566", stored
