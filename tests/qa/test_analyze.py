"""`callqa analyze`: offline QA of real recordings (the real model, VAD, rules and scorecard; no Kafka)."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from pipeline.analyze import AnalyzeOptions, CallAnalysis, analyze_recordings, render_analysis
from pipeline.asr.engine import Engine
from pipeline.audio.files import load_audio
from pipeline.qa.call import QaConfig
from pipeline.qa.rules import RuleSet

REPO = Path(__file__).resolve().parents[2]
# The shortest stereo calls of samples/calls (by size: all are 8 kHz 16-bit stereo): keeps the test quick
# whatever else the folder holds.
SAMPLE_CALLS = sorted((REPO / "samples" / "calls").glob("*.wav"), key=lambda p: p.stat().st_size)[:3]

TOP_KEYS = {"format", "call_id", "file", "duration_ms", "encoding", "sample_rate", "model", "legs", "score_pct",
            "auto_failed", "scorecard", "categories", "items", "rules", "metrics", "live_alerts", "events", "redactions", "revision"}
SEGMENT_KEYS = {"segment_id", "start_ms", "end_ms", "text", "redactions", "sentiment"}
ITEM_KEYS = {"question", "weight", "passed", "rationale", "auto_fail"}
EVENT_KEYS = {"rule", "category", "leg", "kind", "offset_ms", "text", "severity", "segment_id"}
VERDICTS = {"must": {"met", "missing"}, "must_not": {"violated", "clean"}, "detect": {"detected", "not_detected"}}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "analyze", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def write_wav(path: Path, samples: np.ndarray, rate: int = 8000) -> Path:
    """A 16-bit PCM WAV of float samples shaped [channels, n]."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").T.copy()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(samples.shape[0])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def rms_dbfs(x: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(x, dtype=np.float64))) + 1e-12))


def check_shape(report: dict[str, Any], rule_set: RuleSet, questions: int) -> None:
    """The documented structure (pipeline/analyze.py), key for key."""
    assert set(report) == TOP_KEYS and report["format"] == 1
    for leg, body in report["legs"].items():
        assert leg in ("agent", "customer") and set(body) == {"channel", "segments"}
        for s in body["segments"]:
            assert set(s) == SEGMENT_KEYS
            assert s["segment_id"] == f"{report['call_id']}/{leg}/{s['start_ms']:09d}"
            assert 0 <= s["start_ms"] < s["end_ms"] <= report["duration_ms"] and s["text"].strip()
    assert len(report["items"]) == questions and all(set(i) == ITEM_KEYS for i in report["items"])
    assert set(report["rules"]) == rule_set.names
    for name, verdict in report["rules"].items():
        assert verdict["type"] == rule_set.by_name(name).type  # type: ignore[union-attr]
        assert verdict["verdict"] in VERDICTS[verdict["type"]]
    assert all(set(e) == EVENT_KEYS for e in report["live_alerts"] + report["events"])


@pytest.mark.slow
def test_json_of_sample_calls_has_both_legs_segments_and_verdicts(qa_config: QaConfig, rule_set: RuleSet) -> None:
    assert len(SAMPLE_CALLS) >= 2
    done = run_cli("--json", *map(str, SAMPLE_CALLS))
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["call_id"] for r in reports] == [p.stem for p in SAMPLE_CALLS]
    for path, report in zip(SAMPLE_CALLS, reports, strict=True):
        check_shape(report, rule_set, len(qa_config.scorecard.questions))
        audio = load_audio(path)
        assert report["duration_ms"] == pytest.approx(audio.duration_s * 1000, abs=20)
        assert {leg: b["channel"] for leg, b in report["legs"].items()} == {"agent": 0, "customer": 1}
        for leg, body in report["legs"].items():
            assert len(body["segments"]) >= 2
            own = audio.samples[body["channel"]]
            for s in body["segments"]:  # a leg's segment is speech on that leg's channel, not the other's
                span = own[s["start_ms"] * audio.sample_rate // 1000:s["end_ms"] * audio.sample_rate // 1000]
                assert rms_dbfs(span) > -45, (path.name, leg, s)
        # the score is what the items say: weights of the applicable items that passed
        applicable = [i for i in report["items"] if i["passed"] is not None]
        earned = 100 * sum(i["weight"] for i in applicable if i["passed"]) / sum(i["weight"] for i in applicable)
        assert report["score_pct"] == (0.0 if report["auto_failed"] else pytest.approx(earned, abs=0.01))
        auto_fail_missed = any(i["auto_fail"] and i["passed"] is False for i in report["items"])
        assert report["auto_failed"] == auto_fail_missed
        assert report["metrics"]["duration_ms"] == report["duration_ms"]


@pytest.mark.slow
def test_agent_channel_right_swaps_the_legs_and_the_report_renders_them(engine: Engine, qa_config: QaConfig) -> None:
    call = SAMPLE_CALLS[0]
    (left,) = analyze_recordings([call], engine, qa_config, AnalyzeOptions())
    (right,) = analyze_recordings([call], engine, qa_config, AnalyzeOptions(agent_channel="right"))
    assert right.channels == {"agent": 1, "customer": 0}

    def timed(a: CallAnalysis, leg: str) -> list[tuple[int, int, str]]:
        return [(s.start_ms, s.end_ms, s.text) for s in a.leg_segments(leg)]  # type: ignore[arg-type]

    assert timed(right, "agent") == timed(left, "customer") != []
    assert timed(right, "customer") == timed(left, "agent") != []
    console = Console(record=True, width=200)
    render_analysis(left, console)
    text = console.export_text()
    for heading in ("scorecard items", "rules", "conversation metrics", "live alerts", "transcript (redacted)"):
        assert heading in text
    assert f"score: {left.qa.score_pct:.1f} %" in text
    for s in left.segments:
        assert s.text in text


@pytest.mark.slow
def test_bad_files_one_line_each_and_exit_1_while_good_files_are_reported(tmp_path: Path) -> None:
    silent = write_wav(tmp_path / "silent.wav", np.zeros((2, 8000 * 2), dtype=np.float32))
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is not a recording\n")
    missing = tmp_path / "gone.flac"
    three = write_wav(tmp_path / "three.wav", np.zeros((3, 800), dtype=np.float32))
    done = run_cli("--json", str(not_audio), str(silent), str(missing), str(three))
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 3, done.stderr
    for line, path, cause in zip(errors, (not_audio, missing, three),
                                 ("not a recognised audio format", "no such file", "3 channels"), strict=True):
        assert line.startswith("error:") and str(path) in line and cause in line, line
    (report,) = [json.loads(line) for line in done.stdout.splitlines()]  # the good file went on being analysed
    assert report["call_id"] == "silent" and report["duration_ms"] == 2000
    assert report["legs"] == {"agent": {"channel": 0, "segments": []}, "customer": {"channel": 1, "segments": []}}
    assert report["rules"]["greeting"]["verdict"] == "missing"


def test_mono_file_is_one_leg_and_says_which(tmp_path: Path, engine: Engine, qa_config: QaConfig) -> None:
    # 16 kHz mono: the leg is brought to 8 kHz μ-law like the replay does, and is the leg it is said to be
    mono = write_wav(tmp_path / "mono.wav", np.zeros((1, 16000), dtype=np.float32), rate=16000)
    (default,) = analyze_recordings([mono], engine, qa_config, AnalyzeOptions())
    (customer,) = analyze_recordings([mono], engine, qa_config, AnalyzeOptions(mono_leg="customer"))
    assert default.channels == {"agent": 0} and customer.channels == {"customer": 0}
    assert (customer.sample_rate, customer.duration_ms) == (8000, 1000)
    assert list(customer.as_json()["legs"]) == ["customer"]
    console = Console(record=True, width=200)
    render_analysis(customer, console)
    assert "mono: one leg, analysed as the customer" in console.export_text()


@pytest.mark.parametrize(("args", "says"), [
    (["--agent-channel", "middle"], "--agent-channel 'middle': use left or right"),
    (["--scorecard", "/nonexistent/card.yaml"], "/nonexistent/card.yaml"),
])
@pytest.mark.slow
def test_bad_options_are_one_line_before_any_audio_is_read(args: list[str], says: str) -> None:
    done = run_cli(*args, str(SAMPLE_CALLS[0]))
    assert done.returncode in (1, 2) and done.stdout == ""
    assert says in " ".join(done.stderr.split()), done.stderr
