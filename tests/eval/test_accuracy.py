"""Accuracy per set and condition (pipeline.eval.accuracy): how rows are scored and compared, the guards'
limits (pipeline.eval.guards) on slices of the Asterisk prompts and the library's legs, and `callqa bench
accuracy` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.eval.accuracy import comparison, evaluate, score
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.guards import GuardResult, Limit, asterisk_guard, library_legs_guard

REPO = Path(__file__).resolve().parents[2]

def _utt(reference: str) -> EvalUtterance:
    return EvalUtterance(reference, np.zeros(16000, np.float32), reference, "test", "test")


def test_a_row_counts_word_errors_and_digit_sequences() -> None:
    utterances = [_utt("press one for sales"), _utt("my card is four one one one"), _utt("thank you")]
    row = score("s", "8k", "sys", utterances, ["press 1 for sales", "my card is 4-1-1-7", "thank you very much"],
                wall_s=1.5)
    assert (row.reference_words, row.word_errors) == (13, 3)  # "7" for "one", "very", "much"
    assert (row.digit_sequences, row.digit_sequences_exact) == (2, 1)  # "1" exact, "4117" not
    assert (row.reference_digits, row.digit_errors) == (5, 1)
    assert row.as_json()["wer"] == round(3 / 13, 4) and row.as_json()["audio_s_per_wall_s"] == 2.0


class Echo:
    """A system that says a fixed text for every utterance."""

    def __init__(self, name: str, text: str) -> None:
        self.name, self.text = name, text

    def transcribe(self, utterances: list[EvalUtterance]) -> list[str]:
        return [self.text] * len(utterances)


def test_systems_compare_per_set_and_condition() -> None:
    sets = {"a": [_utt("hello there")], "b": [_utt("one two")]}
    rows = evaluate([Echo("ours", "hello there"), Echo("faster-whisper", "hello")], sets, ["16k", "8k-alaw"])
    assert [(r.set, r.condition, r.system) for r in rows][:2] == [("a", "16k", "ours"), ("a", "16k", "faster-whisper")]
    entries = {(e["set"], e["condition"]): e for e in comparison(rows)}
    assert len(entries) == 4
    assert entries[("a", "16k")]["wer_points_over_reference"] == -50.0
    assert entries[("b", "8k-alaw")]["digits_exact_ours"] == 0.0
    with pytest.raises(ValueError, match="unknown condition"):
        evaluate([Echo("x", "")], sets, ["4k"])


# Short real-speech checks: the guards `callqa bench check` runs on whole sets (pipeline/eval/guards.py), on a
# slice of each with limits measured on that slice (at d52781d: Asterisk every 12th prompt 17 errors in 253
# words, 8 of 8 digit sequences; four library legs 12 in 384). About 5 words of margin: a decoder, front-end
# or codec defect that costs the full set a point costs these slices several times their margin.
SHORT_ASTERISK = (Limit("wer", "<=", 0.09), Limit("digits_exact_rate", ">=", 0.85), Limit("reference_words", ">=", 250))
SHORT_LEGS = (Limit("wer", "<=", 0.045), Limit("reference_words", ">=", 380))
LEGS = ("library/05_rude_agent/agent", "library/05_rude_agent/customer", "library/02_card_payment/customer",
        "library/17_overtalk/agent")


def test_limits_and_verdicts_of_a_guard() -> None:
    result = GuardResult("x", {"wer": 0.1, "digits": None}, (Limit("wer", "<=", 0.095), Limit("digits", ">=", 0.5)))
    assert not result.met and result.misses() == ["wer <= 0.095: got 0.1", "digits >= 0.5: got None"]
    assert GuardResult("y", {"wer": 0.095}, (Limit("wer", "<=", 0.095),)).met
    assert result.as_json()["limits"] == ["wer <= 0.095", "digits >= 0.5"] and result.as_json()["met"] is False


def test_wer_and_digits_on_a_slice_of_the_asterisk_prompts() -> None:
    result = asterisk_guard(every=12, limits=SHORT_ASTERISK)
    print(result.as_json())
    assert result.met, result.misses()


def test_wer_on_four_whole_library_legs() -> None:
    """Conversation: whole legs (many turns of one speaker) through the VAD and the batched decoder, as
    the worker hears them (8 kHz mu-law)."""
    result = library_legs_guard(LEGS, limits=SHORT_LEGS)
    print(result.as_json())
    assert result.figures["utterances"] == 4 and result.met, result.misses()


@pytest.mark.slow
def test_bench_accuracy_writes_its_table_and_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "bench", "accuracy", "--sets", "eval", "--conditions", "8k-mulaw",
         "--no-reference", "--variant", "beam_size=2,context_tokens=16", "--models", "moonshine-tiny",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "COLUMNS": "120"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((tmp_path / "accuracy.json").read_text())
    row, moonshine, variant = doc["rows"]
    assert (row["set"], row["condition"], row["system"], row["utterances"]) == ("eval", "8k-mulaw", "ours", 20)
    assert 0 <= row["wer"] < 0.2 and row["reference_words"] == 117
    assert moonshine["system"] == "moonshine-tiny" and 0 <= moonshine["wer"] < 0.2 and doc["models"] == ["moonshine-tiny"]
    assert variant["system"] == "ours beam size 2,context tokens 16" and 0 <= variant["wer"] < 0.2
    assert doc["variants"][variant["system"]] == {"beam_size": 2, "context_tokens": 16}
    # The latest run and one history line per run (the result writer of every benchmark).
    history = (tmp_path / "accuracy.jsonl").read_text().splitlines()
    assert doc["git"]["commit"] and len(history) == 1 and json.loads(history[0]) == doc
    # The run's tables are the README's (the accuracy spec): a row per set and system, a column per condition.
    assert "WER % by condition" in done.stdout and "eval (117)" in done.stdout and "8k-mulaw" in done.stdout


@pytest.mark.slow
def test_a_variant_with_a_bad_setting_is_one_line_naming_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "bench", "accuracy", "--sets", "eval", "--variant", "beam_size=0"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--variant 'beam_size=0': beam_size" in done.stderr and "greater than or equal to 1" in done.stderr
