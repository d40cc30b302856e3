"""`callqa redact`: stored calls whose text still holds PII the redactor catches get markers in every table that
keeps the text and silence where their kept recording said it; a dry run writes nothing, a second run changes
nothing, --call and --since choose the calls, and a call that cannot be done (unknown, its recording unreadable)
is one line and left as it was. Real embedded ClickHouse, the real redactor, the live model checking the cuts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client
from typer.testing import CliRunner

from pipeline.broker.local import free_port
from pipeline.cli import app
from pipeline.config import get_settings
from pipeline.recordings.encode import decode_call, encode_call
from pipeline.web.render import static_file_name

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
RATE = 8000
SECONDS = 16
CARD = "my card number is 4111 1111 1111 1111"
EMAIL = "it is john.smith@example.com"
SSN = "my social is 123-45-6789"
# (segment id, leg, start ms, end ms, stored text) of the call with PII: stored as an older redactor left it.
PII_CALL = [
    ("a0", "agent", 0, 1800, "thank you for calling harbor mutual"),
    ("c1", "customer", 2000, 6000, CARD),
    ("a1", "agent", 6200, 7800, "and your email address please"),
    ("c2", "customer", 8000, 11000, EMAIL),
    ("c3", "customer", 11500, 13500, SSN),
    ("c4", "customer", 14000, 15500, "the code is [CVV]"),
]
# Where the PII is, by its share of each segment's characters (what the cut starts from): by hand.
SPANS_MS = [(2000 + 18 * 4000 // 37, 6000), (8000 + 6 * 3000 // 28, 11000), (11500 + 13 * 2000 // 24, 13500)]


def _tone(hz: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(SECONDS * RATE) / RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _insert(store: Client, table: str, rows: list[dict[str, Any]]) -> None:
    store.insert(table, [list(r.values()) for r in rows], column_names=list(rows[0]))


def _stored_call(store: Client, recordings: Path, call_id: str, started: datetime,
                 segments: list[tuple[str, str, int, int, str]], recording: bytes | None = None) -> None:
    """A call as a worker stored it: calls row, final segments, a QA event and rationale quoting the first
    customer turn, and its recording (its CVV turn cut already) with its row."""
    _insert(store, "calls", [{"call_id": call_id, "tenant": "acme", "agent_id": "agent-7", "started_at": started,
                              "ended_at": started + timedelta(seconds=SECONDS), "end_reason": "end",
                              "segments": len(segments), "updated_at": started + timedelta(seconds=SECONDS)}])
    _insert(store, "segments", [{"segment_id": sid, "call_id": call_id, "leg": leg, "start_ms": a, "end_ms": b,
                                 "text": text, "is_final": 1, "redactions": text.count("["), "produced_at": started}
                                for sid, leg, a, b, text in segments])
    said = next(text for _, leg, _, _, text in segments if leg == "customer")
    _insert(store, "qa_events", [{"call_id": call_id, "rule": "card_given", "leg": "customer", "kind": "match",
                                  "offset_ms": 2000, "text": said, "detected_at": started}])
    _insert(store, "call_qa", [{"call_id": call_id, "tenant": "acme", "score_pct": 90.0,
                                "items.question": ["Did the agent take the card?", "Did the agent greet?"],
                                "items.weight": [1.0, 1.0], "items.passed": [1, 1],
                                "items.rationale": [f"rule card_given: match at 2.0 s (customer): {said!r}",
                                                    "rule greeting: match at 0.0 s (agent): 'thank you'"],
                                "computed_at": started}])
    if recording is not None:
        recordings.mkdir(exist_ok=True)
        (recordings / f"{call_id}.ogg").write_bytes(recording)
        _insert(store, "recordings", [{"call_id": call_id, "tenant": "acme",
                                       "url": f"file://{recordings}/{call_id}.ogg", "media_type": "audio/ogg",
                                       "bytes": len(recording), "duration_ms": SECONDS * 1000,
                                       "channels": ["agent", "customer"],
                                       "cuts": [("customer", 14000, 15500, "CVV", "estimate")],
                                       "started_at": started, "written_at": started}])


def _recording() -> tuple[bytes, dict[str, np.ndarray]]:
    """Both legs a tone throughout (the customer's CVV turn already silent), as the writer encodes them."""
    customer = _tone(300)
    customer[14000 * RATE // 1000: 15500 * RATE // 1000] = 0
    legs = {"agent": _tone(440), "customer": customer}
    data = encode_call(legs, RATE, get_settings().recordings_compression)
    return data, decode_call(data)[0]


def _rms(samples: np.ndarray, start_ms: int, end_ms: int) -> float:
    part = samples[start_ms * RATE // 1000: end_ms * RATE // 1000]
    return float(np.sqrt(np.mean(part.astype(np.float64) ** 2)))


def _redact(args: list[str], env: dict[str, str]) -> Any:
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, ["redact", *args], env=env)
    finally:
        get_settings.cache_clear()


def _texts(store: Client, call_id: str) -> dict[str, str]:
    rows = store.query("SELECT segment_id, text FROM segments FINAL WHERE call_id = {c:String}",
                       parameters={"c": call_id}).result_rows
    return dict(rows)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_redact_rewrites_the_text_everywhere_and_silences_the_recording(store: Client, unique_name: str,
                                                                        chdb_path: str, tmp_path: Path) -> None:
    recordings = tmp_path / "recordings"
    audio, before = _recording()
    _stored_call(store, recordings, "pii-1", T0, PII_CALL, audio)
    # A live preview of the card turn, superseded by its final: its text is on disk until a merge.
    _insert(store, "segments", [{"segment_id": "c1", "call_id": "pii-1", "leg": "customer", "start_ms": 2000,
                                 "end_ms": 4500, "text": "my card number is 4111 1111", "is_final": 0,
                                 "produced_at": T0 - timedelta(seconds=1)}])
    _stored_call(store, recordings, "pii-2", T0 + timedelta(days=1), [
        ("a0", "agent", 0, 2000, "can I have your social security number"),
        ("c1", "customer", 2000, 5000, SSN)])
    _stored_call(store, recordings, "clean-3", T0, [("a0", "agent", 0, 2000, "thank you for calling"),
                                                     ("c1", "customer", 2000, 4000, "I want to change my address")])
    _stored_call(store, recordings, "bad-4", T0, [("c1", "customer", 0, 4000, CARD)], b"OggS not really a recording")
    page = tmp_path / "demo" / "pages" / "calls" / static_file_name("pii-1")
    page.parent.mkdir(parents=True)
    page.write_text(f"<p>{CARD}</p>")
    env = {"CALLQA_CLICKHOUSE_URL": f"chdb://{chdb_path}", "CALLQA_CLICKHOUSE_DATABASE": unique_name,
           "CALLQA_STATE_DIR": str(tmp_path), "CALLQA_RECORDINGS_URL": str(recordings),
           "CALLQA_WEB_PORT": str(free_port()), "COLUMNS": "200"}
    kept = {call_id: _texts(store, call_id) for call_id in ("pii-1", "pii-2", "clean-3", "bad-4")}
    file_before = _sha(recordings / "pii-1.ogg")

    # A dry run: what would change, nothing written.
    dry = _redact(["--dry-run", "--json"], env)
    assert dry.exit_code == 1, dry.output  # bad-4's recording
    report = json.loads(dry.stdout)
    assert report["dry_run"] and report["calls"] == 4
    assert [c["call_id"] for c in report["changed"]] == ["pii-1", "pii-2"]
    [pii] = [c for c in report["changed"] if c["call_id"] == "pii-1"]
    assert pii["segments_changed"] == 3 and pii["markers_added"] == {"PAN": 1, "EMAIL": 1, "SSN": 1}
    assert pii["events_changed"] == 1 and pii["rationales_changed"] == 1 and pii["silenced_ms"] > 0
    assert [e["call_id"] for e in report["errors"]] == ["bad-4"] and "cannot be read" in report["errors"][0]["error"]
    assert {c: _texts(store, c) for c in kept} == kept and _sha(recordings / "pii-1.ogg") == file_before
    assert store.query("SELECT text FROM qa_events WHERE call_id = 'pii-1'").result_rows == [(CARD,)]
    assert store.query("SELECT count() FROM recordings WHERE call_id = 'pii-1'").result_rows == [(1,)]

    # --since and --call choose the calls.
    later = json.loads(_redact(["--since", (T0 + timedelta(hours=12)).isoformat(), "--dry-run", "--json"], env).stdout)
    assert later["calls"] == 1 and [c["call_id"] for c in later["changed"]] == ["pii-2"]
    named = _redact(["--call", "pii-2", "--call", "clean-3"], env)
    assert named.exit_code == 0, named.output
    assert "2 calls looked at: 1 changed" in named.stdout
    assert _texts(store, "pii-2")["c1"] == "my social is [SSN]" and _texts(store, "pii-1") == kept["pii-1"]

    # Every call: pii-1 done, bad-4 left as it was with one line saying why.
    done = _redact([], env)
    assert done.exit_code == 1, done.output
    [line] = [x for x in done.stderr.splitlines() if "bad-4" in x]
    assert line.startswith("error: call bad-4: its recording") and line.endswith("left as it was")
    assert "4 calls looked at: 1 changed" in done.stdout
    assert _texts(store, "bad-4") == kept["bad-4"] and (recordings / "bad-4.ogg").read_bytes().startswith(b"OggS not")
    assert _texts(store, "pii-1") == {**kept["pii-1"], "c1": "my card number is [PAN]", "c2": "it is [EMAIL]",
                                      "c3": "my social is [SSN]"}

    # Everywhere the text is kept: every copy of the segments (the preview too), their redaction counts, the
    # full-text index, the QA event quoting the card turn, the scorecard's rationale, the static page.
    raw = store.query("SELECT text, redactions FROM segments WHERE call_id = 'pii-1' AND segment_id = 'c1'").result_rows
    assert raw and all("4111" not in text and "[PAN]" in text and n == 1 for text, n in raw)
    for secret in ("4111", "john", "6789"):
        assert store.query("SELECT count() FROM segments WHERE call_id != 'bad-4' AND hasAllTokens(lower(text), "
                           "[{w:String}])", parameters={"w": secret}).result_rows == [(0,)]
    assert store.query("SELECT text FROM qa_events WHERE call_id = 'pii-1'").result_rows == [("my card number is [PAN]",)]
    [(rationales,)] = store.query("SELECT `items.rationale` FROM call_qa WHERE call_id = 'pii-1'").result_rows
    assert rationales == ["rule card_given: match at 2.0 s (customer): 'my card number is [PAN]'",
                          "rule greeting: match at 0.0 s (agent): 'thank you'"]
    assert "4111" not in page.read_text() and "[PAN]" in page.read_text()

    # The recording: silent over each redacted span, the rest as it was; its row says what was cut.
    after, _ = decode_call((recordings / "pii-1.ogg").read_bytes())
    for start_ms, end_ms in SPANS_MS:  # within a codec frame of the tone coming back, Opus smears it a little
        assert _rms(after["customer"], start_ms, end_ms - 20) < 0.001, (start_ms, end_ms)
    assert 0.8 < _rms(after["customer"], 0, 1700) / _rms(before["customer"], 0, 1700) < 1.25
    assert 0.8 < _rms(after["agent"], 0, SECONDS * 1000) / _rms(before["agent"], 0, SECONDS * 1000) < 1.25
    [(size, cuts)] = store.query("SELECT bytes, cuts FROM recordings FINAL WHERE call_id = 'pii-1'").result_rows
    assert size == (recordings / "pii-1.ogg").stat().st_size
    spans = [(c["leg"], c["start_ms"], c["end_ms"]) for c in cuts]
    assert ("customer", 14000, 15500) in spans  # the cut it had
    for start_ms, end_ms in SPANS_MS:
        assert any(leg == "customer" and a <= start_ms and end_ms <= b for leg, a, b in spans), (start_ms, spans)

    unknown = _redact(["--call", "nope"], env)
    assert unknown.exit_code == 1 and unknown.stderr.splitlines() == ["error: no call 'nope' in the store"]

    # Again: nothing changes.
    file_after = _sha(recordings / "pii-1.ogg")
    texts_after = _texts(store, "pii-1")
    again = json.loads(_redact(["--json"], env).stdout)
    assert again["changed"] == [] and [e["call_id"] for e in again["errors"]] == ["bad-4"]
    assert _sha(recordings / "pii-1.ogg") == file_after and _texts(store, "pii-1") == texts_after


def test_a_bad_since_is_one_line_before_the_store_is_opened(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "pipeline.cli", "redact", "--since", "last tuesday"], cwd=REPO,
                         env={**os.environ, "CALLQA_CLICKHOUSE_URL": f"chdb://{tmp_path / 'chdb'}"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: --since 'last tuesday': not an ISO 8601 date or time")
    assert not (tmp_path / "chdb").exists()
