"""The committed sample calls match their manifest and the script that builds them."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.eval.dataset import load_eval_set

ROOT = Path(__file__).resolve().parents[2]
CALLS = ROOT / "samples" / "calls"


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((CALLS / "manifest.json").read_text())


def test_rebuilding_gives_the_same_bytes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["build_sample_calls.py", "--out", str(tmp_path)])
    runpy.run_path(str(ROOT / "scripts" / "build_sample_calls.py"), run_name="__main__")
    for name in ["manifest.json", "call_01.wav", "call_02.wav", "call_03.wav"]:
        assert (tmp_path / name).read_bytes() == (CALLS / name).read_bytes(), name


def test_calls_are_stereo_8_khz_with_the_manifest_duration(manifest) -> None:
    assert len(manifest["calls"]) == 3
    for call in manifest["calls"]:
        audio = load_audio(CALLS / call["file"])
        assert audio.sample_rate == 8000 and audio.channels == 2
        assert audio.samples.shape[1] == call["duration_ms"] * 8
        assert 20000 <= call["duration_ms"] <= 40000


def test_each_placement_holds_its_source_recording(manifest) -> None:
    sources = {u.id: u for u in load_eval_set()}
    for call in manifest["calls"]:
        audio = load_audio(CALLS / call["file"])
        for placed in call["utterances"]:
            source = resample(sources[placed["utterance_id"]].audio, 16000, 8000)
            expected = placed["gain"] * source[placed["source_start_ms"] * 8 : placed["source_end_ms"] * 8]
            got = audio.samples[placed["channel"], placed["start_ms"] * 8 : placed["end_ms"] * 8]
            assert got.size == expected.size
            assert 0 < placed["gain"] <= 1 and np.abs(got).max() < 0.95  # never clipped
            assert np.abs(got - expected).max() < 0.01  # only the -70 dBFS noise floor and 16-bit rounding
            assert placed["reference"] == sources[placed["utterance_id"]].reference
            assert placed["start_ms"] <= placed["speech_start_ms"] < placed["speech_end_ms"] <= placed["end_ms"]


def test_agent_opens_every_call_and_legs_overlap_somewhere(manifest) -> None:
    overlaps = 0
    for call in manifest["calls"]:
        first = min(call["utterances"], key=lambda u: u["start_ms"])
        assert first["leg"] == "agent" and first["channel"] == 0
        agent = [u for u in call["utterances"] if u["leg"] == "agent"]
        customer = [u for u in call["utterances"] if u["leg"] == "customer"]
        overlaps += sum(
            a["speech_start_ms"] < c["speech_end_ms"] and c["speech_start_ms"] < a["speech_end_ms"]
            for a in agent for c in customer
        )
    assert overlaps >= 1


def test_pauses_between_utterances_are_quiet(manifest) -> None:
    call = manifest["calls"][1]
    audio = load_audio(CALLS / call["file"])
    busy = np.zeros(audio.samples.shape[1], dtype=bool)
    for placed in call["utterances"]:
        busy[placed["start_ms"] * 8 : placed["end_ms"] * 8] = True
    for channel in range(2):
        spans = [(u["start_ms"], u["end_ms"]) for u in call["utterances"] if u["channel"] == channel]
        idle = np.ones(busy.size, dtype=bool)
        for start, end in spans:
            idle[start * 8 : end * 8] = False
        assert np.sqrt(np.mean(audio.samples[channel, idle] ** 2)) < 10 ** (-60 / 20)
