"""`callqa erase`: the call's rows gone from every table, a tombstone on the checkpoint topic, its static page
removed, the erasure on record, the topics that still hold it named; a live call refused (nothing removed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from clickhouse_connect.driver.client import Client
from typer.testing import CliRunner

from pipeline.broker.local import free_port
from pipeline.cli import app
from pipeline.config import get_settings
from pipeline.store.erasure import erasures_of, rows_of
from pipeline.web.render import static_file_name

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


def _call(store: Client, call_id: str, ended: bool) -> None:
    store.insert("calls", [[call_id, T0, T0 + timedelta(minutes=2) if ended else None, T0]],
                 column_names=["call_id", "started_at", "ended_at", "updated_at"])
    store.insert("segments", [[f"{call_id}/customer/0", call_id, "customer", "my card is [CARD] and I live here", 1, T0]],
                 column_names=["segment_id", "call_id", "leg", "text", "is_final", "produced_at"])


def _erase(args: list[str], env: dict[str, str]) -> object:
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, ["erase", *args], env=env)
    finally:
        get_settings.cache_clear()


def test_erase_removes_the_call_everywhere_and_refuses_a_live_one(store: Client, unique_name: str, chdb_path: str,
                                                                   kafka_settings, read_topic, tmp_path: Path) -> None:
    _call(store, "ended-1", ended=True)
    _call(store, "kept-2", ended=True)
    _call(store, "live-3", ended=False)
    page = tmp_path / "demo" / "pages" / "calls" / static_file_name("ended-1")
    page.parent.mkdir(parents=True)
    page.write_text("<p>my card is [CARD]</p>")
    env = {"CALLQA_CLICKHOUSE_URL": f"chdb://{chdb_path}", "CALLQA_CLICKHOUSE_DATABASE": unique_name,
           "CALLQA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
           "CALLQA_TOPIC_CHECKPOINTS": kafka_settings.topic_checkpoints,
           "CALLQA_WEB_PORT": str(free_port()), "CALLQA_STATE_DIR": str(tmp_path), "COLUMNS": "200"}

    done = _erase(["ended-1", "--by", "dpo@example.com"], env)

    assert done.exit_code == 0, done.output
    assert "segments" in done.output and "erased by dpo@example.com" in done.output
    assert f"{kafka_settings.topic_checkpoints}: tombstone written" in done.output
    assert "callqa.transcripts: its transcripts of the call expire 7 d after" in done.output  # what keeps it, named
    assert not page.exists()
    assert rows_of(store, unique_name, ["ended-1", "kept-2"]) == {"ended-1": {}, "kept-2": {"calls": 1, "segments": 1}}
    [record] = erasures_of(store, unique_name, "ended-1")
    assert (record.erased_by, record.reason, record.rows) == ("dpo@example.com", "request", {"calls": 1, "segments": 1})
    [tombstone] = [m for m in read_topic(kafka_settings.bootstrap_servers, kafka_settings.topic_checkpoints)
                   if m.key() == b"ended-1"]
    assert tombstone.value() is None

    refused = _erase(["live-3"], env)
    assert refused.exit_code == 1 and "call live-3 has not ended" in str(refused.exception)  # main() prints it
    assert rows_of(store, unique_name, ["live-3"])["live-3"] == {"calls": 1, "segments": 1}  # nothing removed
    assert not [m for m in read_topic(kafka_settings.bootstrap_servers, kafka_settings.topic_checkpoints)
                if m.key() == b"live-3"]  # its checkpoints stay

    forced = _erase(["live-3", "--force"], env)
    assert forced.exit_code == 0, forced.output
    assert rows_of(store, unique_name, ["live-3"])["live-3"] == {}
