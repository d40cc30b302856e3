"""Redaction measured on generated dialogues (tests/qa/dialogues.py), a set its rules were not written
from: recall per kind (no digit, number word or word of the value left in the turns that held it) and
how many negatives (amounts, times, dates, durations, counts, menus, order numbers) stay unchanged.

Goals: every card number, security code, SSN and bank number gone (100 %), every other kind >= 99 %,
negatives >= 97 % unchanged."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.qa.redaction import CallRedactor
from pipeline.qa.segment import Segment
from tests.qa.dialogues import Dialogue, generate, leaked, timed

WHOLE = {"PAN", "CVV", "SSN", "SSN_LAST4", "ACCOUNT", "ROUTING", "IBAN"}


def redact(dialogue: Dialogue) -> list[str]:
    redactor = CallRedactor()
    return [redactor.redact(Segment("c", leg, f"s{i}", start, end, text)).text  # type: ignore[arg-type]
            for i, (leg, text, start, end) in enumerate(timed(dialogue.turns))]


@pytest.fixture(scope="module")
def figures() -> dict[str, object]:
    caught: Counter[str] = Counter()
    total: Counter[str] = Counter()
    misses: dict[str, list[str]] = {}
    kept = negatives = 0
    for dialogue in generate(count_per_kind=150, negatives=1500):
        texts = redact(dialogue)
        if dialogue.negative:
            negatives += 1
            same = all(texts[i] == dialogue.turns[i][1] for i in dialogue.secret_turns)
            kept += same
            if not same:
                misses.setdefault("NEGATIVE", []).append(" | ".join(texts[i] for i in sorted(dialogue.secret_turns)))
            continue
        total[dialogue.kind] += 1
        left = leaked(dialogue, texts)
        caught[dialogue.kind] += not left
        if left:
            misses.setdefault(dialogue.kind, []).append(" | ".join(texts[i] for i in sorted(dialogue.secret_turns)))
    recall = {kind: caught[kind] / total[kind] for kind in total}
    result = {"recall": recall, "negatives_kept": kept / negatives, "dialogues": sum(total.values()) + negatives,
              "misses": {k: v[:3] for k, v in misses.items()}}
    print(f"\ngenerated redaction: {result}")
    return result


def test_no_digit_of_card_data_ssn_or_bank_numbers_is_left(figures: dict) -> None:
    missed = {k: r for k, r in figures["recall"].items() if k in WHOLE and r < 1.0}
    assert not missed, (missed, figures["misses"])


def test_every_other_kind_is_redacted_in_99_percent_of_dialogues(figures: dict) -> None:
    low = {k: r for k, r in figures["recall"].items() if k not in WHOLE and r < 0.99}
    assert not low, (low, figures["misses"])


def test_negatives_stay_readable(figures: dict) -> None:
    assert figures["negatives_kept"] >= 0.97, (figures["negatives_kept"], figures["misses"].get("NEGATIVE"))
