"""`callqa analyze` with the post-call pass: the live pass's segments decoded again by the accurate
model (Moonshine base), QA scored on that transcript as revision 1, the live result kept beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.analyze import CallAnalysis, analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.config import get_settings
from pipeline.eval.call_library import LIBRARY_DIR, find_leaks, load_manifest, redacted_reference
from pipeline.eval.wer import word_errors
from pipeline.qa.call import QaConfig

REPO = Path(__file__).resolve().parents[2]
CALL = "02_card_payment"  # 71 s, both legs, a card number read out (redaction) and a recording disclosure


@pytest.fixture(scope="module")
def analysis() -> CallAnalysis:
    config = QaConfig.from_settings(get_settings())
    (result,) = analyze_recordings([LIBRARY_DIR / f"{CALL}.wav"], Engine.load(), config,
                                   final_engine=Engine.load("moonshine-base"))
    return result


def _wer(analysis: CallAnalysis, leg: str) -> float:
    call = next(c for c in load_manifest()["calls"] if Path(c["file"]).stem == CALL)
    hypothesis = " ".join(s.text for s in analysis.segments if s.leg == leg)
    errors = word_errors(redacted_reference(call, leg), hypothesis)
    return errors.wer


def test_the_post_call_pass_rescores_the_live_segments_with_the_accurate_model(analysis: CallAnalysis) -> None:
    live = analysis.live
    assert live is not None and (live.revision, analysis.revision) == (0, 1)
    assert live.model.startswith("tiny.en@") and analysis.model.startswith("moonshine-base@")
    # The same segmentation: only the words can change.
    spans = {(s.leg, s.start_ms, s.end_ms) for s in live.segments}
    assert {(s.leg, s.start_ms, s.end_ms) for s in analysis.segments} <= spans
    summary = analysis.live_summary()
    assert summary["segments_changed"] > 0  # a real second decode, not the live text copied
    # Scored on its own transcript: its verdicts are the final ones, the live ones kept for comparison.
    for rule, change in summary["rules_changed"].items():
        assert analysis.rule_verdicts()[rule]["verdict"] == change["final"] != change["live"]
    assert analysis.qa.score_pct >= 0 and summary["score_pct"] == live.qa.score_pct
    # Redaction runs on the final transcript too: none of the call's PII (a card number) is in it.
    call = next(c for c in load_manifest()["calls"] if Path(c["file"]).stem == CALL)
    assert call["pii"] and not find_leaks(CALL, call["pii"], [(s.segment_id, s.text) for s in analysis.segments],
                                          in_text=True)
    for leg in ("agent", "customer"):
        assert _wer(analysis, leg) <= 0.10, leg


def test_the_json_report_says_which_pass_it_is() -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "analyze", "--json", "--final-model",
                           "moonshine-tiny", str(LIBRARY_DIR / f"{CALL}.wav")], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["revision"] == 1 and report["model"].startswith("moonshine-tiny@")
    assert report["live"]["model"].startswith("tiny.en@") and isinstance(report["live"]["rules_changed"], dict)
