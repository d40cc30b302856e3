"""WER and its text normalisation."""

from __future__ import annotations

import pytest

from pipeline.eval.numbers import cardinal, ordinal
from pipeline.eval.wer import WordErrors, normalize_text, word_error_rate, word_errors


@pytest.mark.parametrize("reference,hypothesis", [
    ("go forward ten meters", "Go forward 10 meters."),
    ("two nine three four zero", "2-9-3-4-0"),
    ("two nine three four zero", "29340"),
    ("five five", "55"),
    ("and mister john dashwood", "And Mr. John Dashwood,"),
    ("rather cold hearted", "rather cold-hearted"),
    ("nineteen eighty four", "1984"),
    ("one thousand two hundred", "1,200"),
    ("eight of spades four of clubs", "8 of spades, 4 of clubs!"),
    ("the thirteenth", "the 13th"),
    ("twenty first of may", "21st of May"),
    ("seventieth", "70th"),
    ("the second", "the 2nd"),
])
def test_equivalent_spellings_are_not_errors(reference, hypothesis) -> None:
    assert word_errors(reference, hypothesis).errors == 0


def test_numbers_only_match_the_words_spoken() -> None:
    assert word_errors("ten of clubs", "11 of clubs").substitutions == 1
    assert word_errors("two nine", "2934").errors > 0


def test_edit_kinds_are_counted() -> None:
    errors = word_errors("he was not an ill disposed young man", "he was an ill disposed old young man men")
    assert errors == WordErrors(substitutions=0, deletions=1, insertions=2, reference_words=8)
    assert word_errors("front center", "front centre").substitutions == 1
    assert word_errors("rear left", "").deletions == 2


def test_corpus_wer_is_errors_over_reference_words() -> None:
    refs = ["ten of clubs", "front center", "he might even have been made amiable himself"]
    hyps = ["10 of clubs", "front", "he might have been made amiable himself too"]
    assert word_error_rate(refs, hyps) == pytest.approx(3 / 13)
    with pytest.raises(ValueError):
        word_error_rate(refs, hyps[:2])


def test_normalize_text() -> None:
    assert normalize_text("Mr. Smith's 2 dogs & 50% off!") == "mister smiths two dogs and fifty percent off"
    assert normalize_text("3.5") == "three point five"


def test_cardinals() -> None:
    assert cardinal(0) == ["zero"]
    assert " ".join(cardinal(2934)) == "two thousand nine hundred thirty four"
    assert " ".join(cardinal(1_000_015)) == "one million fifteen"
    assert " ".join(cardinal(110)) == "one hundred ten"


def test_ordinals() -> None:
    assert [" ".join(ordinal(n)) for n in (1, 2, 3, 5, 8, 9, 12, 20, 44, 100)] == [
        "first", "second", "third", "fifth", "eighth", "ninth", "twelfth", "twentieth", "forty fourth",
        "one hundredth"]
