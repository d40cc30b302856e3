"""`callqa bench redaction` runs, times every library turn and writes its result (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.eval.call_library import LIBRARY_DIR


def test_the_redaction_benchmark_times_each_library_turn_and_writes_its_figures(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "redaction", "--rounds", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "redaction.json").read_text())
    turns = sum(len(call["turns"]) for call in json.loads((LIBRARY_DIR / "manifest.json").read_text())["calls"])
    assert doc["segments_timed"] == 2 * turns and doc["benchmark"] == "callqa bench redaction"
    assert 0 < doc["p50_ms"] <= doc["p99_ms"] <= doc["max_ms"] and doc["goal_mean_ms"] == 0.2
    assert len((tmp_path / "redaction.jsonl").read_text().splitlines()) == 1
