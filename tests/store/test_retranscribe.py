"""`callqa retranscribe`: stored calls transcribed again from the contact center's
recordings or the audio topic by the accurate model, stored as each call's next revision beside the earlier ones, and what
changed reported. Real model, real embedded ClickHouse."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings, get_settings
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.postcall.rows import revision_rows
from pipeline.qa.call import QaConfig
from pipeline.retranscribe import AudioTopic, run
from pipeline.store.queries import call_summary, transcript

REPO = Path(__file__).resolve().parents[2]
RECORDING = LIBRARY_DIR / "02_card_payment.wav"


@pytest.fixture(scope="module")
def config() -> QaConfig:
    return QaConfig.from_settings(get_settings())


def _store_live_pass(store: Client, call_id: str, make_call: Callable[..., dict[str, Any]], config: QaConfig) -> float:
    """The call as a worker stored it (revision 0: tiny.en), from the same recording; returns its score."""
    (live,) = analyze_recordings([RECORDING], Engine.load(), config)
    stored = make_call(call_id, ended=True)
    for table, rows in revision_rows(stored, live, 0, ("tiny.en", 1), 1_772_443_800_000).in_write_order():
        if not rows:
            continue
        columns = list(rows[0])
        store.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)
    return live.qa.score_pct


def test_each_call_gets_its_next_revision_and_readers_show_it(
        store: Client, tmp_path: Path, make_call: Callable[..., dict[str, Any]], config: QaConfig) -> None:
    live_score = _store_live_pass(store, "CA-1", make_call, config)
    store.insert("calls", [list(make_call("CA-no-audio", ended=True).values())],
                 column_names=list(make_call("CA-no-audio", ended=True)))
    (tmp_path / "CA-1.wav").symlink_to(RECORDING)
    live_text = [line.text for line in transcript(store, "CA-1")]

    changes, skipped = run(store, tmp_path, Engine.load("moonshine-tiny"), config,
                           since=make_call("x")["started_at"] - timedelta(minutes=1))
    assert [s.call_id for s in skipped] == ["CA-no-audio"] and "CA-no-audio.*" in skipped[0].why
    (change,) = changes
    assert (change.call_id, change.revision, change.score_before) == ("CA-1", 1, live_score)
    assert change.model.startswith("moonshine-tiny@")
    final_text = [line.text for line in transcript(store, "CA-1")]
    assert final_text != live_text and len(final_text) == change.segments  # the views show revision 1
    summary = call_summary(store, "CA-1")
    assert summary is not None and summary.score_pct == change.score_after
    # Both passes are kept; the live one is still there for a reader who asks for it.
    kept = dict(store.query("SELECT revision, count() FROM segments FINAL WHERE call_id = 'CA-1' GROUP BY revision")
                .result_rows)
    assert set(kept) == {0, 1} and kept[0] == len(live_text)
    for question, (before, after) in change.items_changed.items():
        assert before != after, question

    # Again, with a named call: the next revision, and nothing else touched.
    (again,), skipped = run(store, tmp_path, Engine.load("moonshine-tiny"), config, call_ids=["CA-1"])
    assert again.revision == 2 and again.score_before == change.score_after and not skipped
    assert store.query("SELECT max(revision) FROM calls_deduped WHERE call_id = 'CA-1'").result_rows == [(2,)]


def test_a_calls_audio_comes_from_the_audio_topic_while_it_keeps_it(
        store: Client, make_call: Callable[..., dict[str, Any]], config: QaConfig, kafka_settings: Settings) -> None:
    began = datetime.now(UTC)
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    (call_id,) = player.run([load_recording(RECORDING, ReplayOptions())], ReplayOptions()).call_ids
    final = Engine.load("moonshine-tiny")
    (offline,) = analyze_recordings([RECORDING], Engine.load(), config, final_engine=final)
    # As the worker stored it: the live pass, started and ended around the frames' times.
    for call, audio_ms in ((call_id, offline.duration_ms), ("CA-gone", 60_000)):
        row = make_call(call, ended=True) | {"started_at": began, "ended_at": datetime.now(UTC), "audio_ms": audio_ms}
        store.insert("calls", [list(row.values())], column_names=list(row))

    source = AudioTopic(kafka_settings, Serde.from_settings())
    changes, skipped = run(store, source, final, config, call_ids=[call_id, "CA-gone"])
    assert [(s.call_id, "no frame of it" in s.why) for s in skipped] == [("CA-gone", True)]
    (change,) = changes
    assert (change.call_id, change.revision, change.score_after) == (call_id, 1, offline.qa.score_pct)
    assert [(line.leg, line.text) for line in transcript(store, call_id)] == [
        (s.leg, s.text) for s in offline.segments]


def test_the_command_refuses_without_a_model_or_a_folder(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "retranscribe", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "CALLQA_FINAL_MODEL": ""})

    no_model = cli("--recordings", str(tmp_path))
    assert no_model.returncode == 2 and "no model" in no_model.stderr and "Traceback" not in no_model.stderr
    no_folder = cli("--recordings", str(tmp_path / "missing"), "--model", "moonshine-tiny")
    assert no_folder.returncode == 2 and "not a folder" in no_folder.stderr
    no_source = cli("--model", "moonshine-tiny")
    assert no_source.returncode == 2 and "--recordings DIR or --audio-topic" in no_source.stderr

