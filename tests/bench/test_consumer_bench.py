"""`callqa bench consumer`: a tiny run against the real broker reads every produced message exactly once by
each path, at each span, and writes its result (the timing itself is the benchmark's, run by hand; the live
traffic only paces the same messages, and a process per run costs ~4 s, so the test reads the backlog)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from pipeline.bench.consumer import ConsumerBenchOptions, run_consumer


def test_each_path_reads_every_message_once_at_each_span_and_traffic(broker: str, tmp_path: Path) -> None:
    options = ConsumerBenchOptions(audio_s=8.0, live_calls=0, live_s=1.0, repeat=1, out=tmp_path)
    doc, paths = run_consumer(options, Console(file=io.StringIO()))

    assert paths == [tmp_path / "consumer.json", tmp_path / "consumer.jsonl"]
    assert json.loads(paths[0].read_text())["rows"] == doc["rows"]
    # The backlog, 8 s of leg audio: one call of two 4 s legs, 200 messages a leg of 20 ms, 20 of 200 ms.
    expected = [(20, "backlog", 400), (200, "backlog", 40)]
    assert [(r["span_ms"], r["traffic"], r["path"], r["messages"]) for r in doc["rows"]] == [
        (span, traffic, path, n) for span, traffic, n in expected for path in ("agent", "batch")]
    assert [(r["span_ms"], r["traffic"], r["path"]) for r in doc["runs"]] == [
        (r["span_ms"], r["traffic"], r["path"]) for r in doc["rows"]]
    assert all(r["exactly_once"] for r in doc["rows"])
    assert all(r["messages"] == r["distinct"] == r["produced"] for r in doc["runs"])
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in doc["runs"])
    assert all("batch_over_agent_cpu" in r for r in doc["rows"][1::2])
    # Each run's log stays in the run's folder, where an error about that run points.
    assert len(list(Path(doc["logs"]).glob("*-backlog-*-0.log"))) == 4
