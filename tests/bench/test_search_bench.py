"""`callqa bench search`: generated calls as the worker stores them, and a run's result file (a small store;
the timing itself is the benchmark's, run by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.bench.search import SCRIPTS, CallMaker, script_turns


def test_scripted_turns_carry_the_redaction_markers_not_the_spoken_pii() -> None:
    spoken = [str(p["spoken"]) for path in SCRIPTS.glob("*.yaml")
              for t in yaml.safe_load(path.read_text())["turns"] for p in t.get("pii") or [] if p.get("spoken")]
    texts = [text for _, text in script_turns()]
    assert spoken and not any(s in text for s in spoken for text in texts)
    assert any("[PAN]" in text for text in texts)


def test_generated_calls_are_reproducible_and_shaped_as_stored() -> None:
    first, again = CallMaker(7).batch(0, 50), CallMaker(7).batch(0, 50)
    assert first == again and len(first["calls"]) == 50 == len(first["call_qa"])
    assert 6 * 50 <= len(first["segments"]) <= 21 * 50
    assert {row[1] for row in first["segments"]} == {row[0] for row in first["calls"]}


def test_a_small_run_writes_its_figures(tmp_path: Path) -> None:
    # Its own process, as a user runs it: chdb admits one data path per process, and a test process has one.
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "search", "--calls", "300", "--repeat", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((tmp_path / "search.json").read_text())
    assert saved["calls"] == 300 and (tmp_path / "search.jsonl").exists()
    assert saved["segments"] > 300 * 6 and saved["p95_ms"] >= saved["p50_ms"] > 0
    assert set(saved["kinds"]["search"]["queries"]) == set(saved["kinds"]["scan"]["queries"])
    assert saved["kinds"]["search"]["queries"]["no such phrase"]["calls"] == 0
