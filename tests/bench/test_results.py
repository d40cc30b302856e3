"""The shared result writer: every run's document carries the machine, commit, date and settings beside its
figures; ``<name>.json`` is the latest run and ``<name>.jsonl`` gains one line per run. And `callqa bench`
lists every benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bench.cli import bench_app
from pipeline.bench.results import read_history, record, settings_that_matter, write_result
from pipeline.bench.variants import BadVariant, changed_settings, settings_variant
from pipeline.config import Settings

BENCHMARKS = ("live", "accuracy", "asr", "scale-out", "end-to-end")


def test_a_run_is_the_latest_file_and_one_more_history_line(tmp_path: Path) -> None:
    settings = settings_that_matter(Settings())
    first = record("demo", settings, {"rows": [{"wer": 0.043}]})
    second = record("demo", settings, {"rows": [{"wer": 0.051}]}, started="20990101T000000Z")

    assert write_result("demo", first, tmp_path) == [tmp_path / "demo.json", tmp_path / "demo.jsonl"]
    write_result("demo", second, tmp_path)

    assert json.loads((tmp_path / "demo.json").read_text()) == second  # the latest run only
    assert read_history("demo", tmp_path) == [first, second]  # every run, oldest first, one line each
    assert len((tmp_path / "demo.jsonl").read_text().splitlines()) == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_a_run_records_machine_commit_date_and_settings() -> None:
    doc = record("demo", settings_that_matter(Settings()), {"figure": 1.5})

    assert doc["benchmark"] == "callqa bench demo" and doc["figure"] == 1.5
    assert re.fullmatch(r"\d{8}T\d{6}Z", doc["started"])
    machine = doc["machine"]
    assert machine["cpu_model"] and machine["cores"] >= 1 and 1 <= machine["cores_available"] <= machine["cores"]
    assert machine["memory_gb"] > 0 and machine["python"].count(".") == 2
    assert {"cpu_family", "cpu_vendor", "cpu_model_number"} <= machine.keys()
    assert isinstance(machine["cpu_flags"], list)
    git = doc["git"]
    assert re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and isinstance(git["dirty"], bool)
    # The settings that change the figures: decoding, segmentation and the worker's batching.
    assert {"model", "quantization", "beam_size", "max_batch", "endpoint_silence_ms"} <= doc["settings"].keys()
    assert "models_dir" not in doc["settings"]


def test_a_document_without_the_envelope_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="machine"):
        write_result("demo", {"benchmark": "x", "started": "y", "git": {}, "settings": {}}, tmp_path)
    with pytest.raises(ValueError, match="envelope"):
        record("demo", {}, {"machine": "mine"})
    assert not (tmp_path / "demo.json").exists()


def test_bench_help_lists_every_benchmark_with_a_description() -> None:
    result = CliRunner().invoke(bench_app, ["--help"], env={"COLUMNS": "160"})

    assert result.exit_code == 0, result.output
    for name in BENCHMARKS:
        line = next((ln for ln in result.output.splitlines() if re.search(rf"│ {re.escape(name)}\s", ln)), None)
        assert line is not None, f"{name} not listed:\n{result.output}"
        assert len(line.split(name, 1)[1].strip(" │")) > 20, line  # a description beside it


def test_settings_variants_are_validated_and_recorded_as_what_changed() -> None:
    base = Settings()
    label, variant = settings_variant(base, "beam_size=5,context_tokens=64")
    assert label == "beam size 5,context tokens 64"
    assert changed_settings(base, variant) == {"beam_size": 5, "context_tokens": 64}
    with pytest.raises(BadVariant, match="no_such_setting"):
        settings_variant(base, "no_such_setting=1")
    with pytest.raises(BadVariant, match="beam_size"):
        settings_variant(base, "beam_size=many")
