"""The call library's scoring helpers and its builder's checks of the scripts (no broker, no audio)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipeline.eval.call_library import (
    email_variants,
    find_leaks,
    item_verdicts,
    redacted_reference,
    rule_verdicts,
    string_values,
)

REPO = Path(__file__).resolve().parents[2]
CARD = {"kind": "PAN", "digits": "4111111111111111"}
CVV = {"kind": "CVV", "digits": "321"}
EMAIL = {"kind": "EMAIL", "local": "kholloway72"}


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_call_library", REPO / "scripts" / "build_call_library.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_call_library"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text", [
    "it is four one one one, one one one one",        # spoken, half the card
    "4111-1111-1111-1111",                              # written with separators
    "the card is forty one eleven",                      # grouped words: 4111
    "and the code is three twenty one",                  # a CVV said as a number
])
def test_a_leak_is_found_however_the_digits_are_written(text: str) -> None:
    leaks = find_leaks("c1", [CARD, CVV], [("segment", text)], in_text=True)
    assert leaks, text


def test_redacted_text_and_other_numbers_are_not_leaks() -> None:
    texts = [("segment", "It is [PAN]. The code is [CVV]."), ("segment", "one hundred and twenty dollars"),
             ("rationale", "matched 'thank you for calling' at 32.1 s")]  # an offset, not a CVV
    assert find_leaks("c1", [CARD, CVV], texts, in_text=True) == []


def test_outside_call_text_only_long_pii_is_searched() -> None:
    line = "[2026-11-30 16:41:11,111] call lib-0001 segment 321 done in 4111 ms"
    assert find_leaks("c1", [CARD, CVV], [("log", line)], in_text=False) == []
    assert find_leaks("c1", [CARD], [("log", "value=4111111111111111")], in_text=False)


def test_each_piece_of_a_value_read_in_pieces_is_a_leak_in_its_call_text_only() -> None:
    ssn = {"kind": "SSN", "digits": "531620874", "spoken": "six two", "part": 2}
    assert find_leaks("c1", [ssn], [("segment", "then six two")], in_text=True)
    assert find_leaks("c1", [ssn], [("log", "took 62 frames")], in_text=False) == []


def test_an_email_name_is_found_spelt_any_way() -> None:
    assert {"kholloway72", "khollowayseventytwo", "khollowaysevenTwo".lower()} <= email_variants("kholloway72")
    assert find_leaks("c1", [EMAIL], [("segment", "K. Holloway 72 at gmail.com")], in_text=True)
    assert find_leaks("c1", [EMAIL], [("segment", "k holloway seventy two at gmail dot com")], in_text=True)
    assert find_leaks("c1", [EMAIL], [("segment", "[EMAIL]. Thanks Mrs Holloway")], in_text=True) == []


def test_verdicts_from_events_and_items() -> None:
    events = [{"rule": "greeting", "kind": "match"}, {"rule": "closing", "kind": "missing"},
              {"rule": "prohibited_language", "kind": "violation"}]
    assert rule_verdicts(events, ["greeting", "closing", "prohibited_language", "escalation_request"]) == {
        "greeting": "present", "closing": "absent", "prohibited_language": "present", "escalation_request": "absent"}
    ids = {"Did the agent greet?": "greeting", "Fast answer?": "response_time"}
    assert item_verdicts([("Did the agent greet?", False)], ids) == {"greeting": "fail", "response_time": "na"}


def test_the_wer_reference_carries_redaction_markers_for_pii() -> None:
    call = {"turns": [{"leg": "customer", "text": "It is three two one."}, {"leg": "agent", "text": "Thanks."}],
            "pii": [{"turn": 0, "kind": "CVV", "spoken": "three two one"}]}
    assert redacted_reference(call, "customer").split() == ["It", "is", "cvv", "."]


def write_script(folder: Path, pii: str, mood: str = "neutral", trend: str = "steady") -> Path:
    path = folder / "99_bad.yaml"
    path.write_text(f"title: t\ncustomer_trend: {trend}\nturns:\n  - agent: Hello there.\n"
                    f"  - customer: It is four one one one.\n    pii: [{pii}]\n    mood: {mood}\n")
    return path


def test_a_script_whose_pii_digits_differ_from_its_words_is_refused(tmp_path: Path) -> None:
    build = builder()
    with pytest.raises(build.ScriptError, match=r"99_bad.yaml: turn 2: PAN spoken as '4111', but digits say '4112'"):
        build.load_script(write_script(tmp_path, '{kind: PAN, digits: "4112", spoken: "four one one one"}'))
    with pytest.raises(build.ScriptError, match="is not in the turn"):
        build.load_script(write_script(tmp_path, '{kind: PAN, digits: "4111", spoken: "four two"}'))
    script = build.load_script(write_script(tmp_path, '{kind: PAN, digits: "4111", spoken: "four one one one"}'))
    assert [t.leg for t in script.events] == ["agent", "customer"]


def test_a_script_without_its_sentiment_labels_is_refused(tmp_path: Path) -> None:
    build = builder()
    card = '{kind: PAN, digits: "4111", spoken: "four one one one"}'
    with pytest.raises(build.ScriptError, match=r"turn 2: every customer turn needs mood: negative \| neutral"):
        build.load_script(write_script(tmp_path, card, mood="angry"))
    with pytest.raises(build.ScriptError, match="customer_trend must be one of improving, steady, worsening"):
        build.load_script(write_script(tmp_path, card, trend="better"))
    script = build.load_script(write_script(tmp_path, card, mood="negative"))
    assert [t.mood for t in script.events] == ["", "negative"] and script.customer_trend == "steady"


def test_every_committed_script_loads_and_states_its_pii() -> None:
    build = builder()
    scripts = [build.load_script(p) for p in sorted((REPO / "samples/calls/library/scripts").glob("*.yaml"))]
    assert len(scripts) >= 20
    kinds = {p["kind"] for s in scripts for t in s.events if not isinstance(t, tuple) for p in t.pii}
    assert kinds == {"PAN", "EXPIRY", "CVV", "SSN", "PHONE", "EMAIL", "DOB", "ADDRESS"}


def test_pipeline_numbers_in_rationales_and_records_are_not_leaks() -> None:
    amex = {"kind": "PAN", "digits": "378282246310005"}
    rationale = "overtalk_ms = 0 (expected overtalk_ms < 10000)"
    assert find_leaks("c1", [amex], [("rationale", rationale)], in_text=True) == []
    row = {"call_id": "c1", "metrics": {"agent_wpm": 111.11111111}, "items.rationale": ["ok"]}
    assert string_values(row) == "call_id | metrics | items.rationale | c1 | agent_wpm | ok"
    assert find_leaks("c1", [CARD], [("row", string_values(row))], in_text=False) == []
    assert find_leaks("c1", [CARD], [("row", string_values({"text": ["card 4111 1111 1111 1111"]}))], in_text=False)
