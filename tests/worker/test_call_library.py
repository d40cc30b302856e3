"""Library calls through the running pipeline: real broker, one real worker process, real embedded store.

Seven library calls (every PII kind, a hold, an escalation, a live alert) are replayed (fast, holds honoured:
no frames there) to one worker; all 23 go through the running workers in `callqa bench check`
(``library-live``). Then
- every call's rule and scorecard verdicts are compared with the manifest (agreement ≥ 95 %);
- no PII span of the manifest appears in any output topic, any table or the worker's log (hard: zero);
- metrics are within the manifest's tolerances, WER of the stored (redacted) transcripts against the
  scripts is under a ceiling, and only holds leave frames missing.
Before that, one short call is replayed in real time and its live QaAlert must come before the call ends.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import CallEvent, QaAlert, Serde
from pipeline.eval.call_library import (
    LIBRARY_DIR,
    STORE_TABLES,
    TABLE_TEXT_COLUMNS,
    Disagreement,
    Leak,
    compare,
    find_leaks,
    holds_of,
    item_verdicts,
    load_manifest,
    message_texts,
    metric_misses,
    redacted_reference,
    rule_verdicts,
    string_values,
)
from pipeline.eval.wer import word_error_rate
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import load_scorecard

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20)
LIVE_CALL = "05_rude_agent"  # short, and its agent says prohibited words mid-call
# Cards read in one turn and split over two, expiry and CVV, SSN, e-mail and phone; a 25 s hold; a caller
# asking for a manager; the live call.
CALLS = ("02_card_payment", "12_card_with_pause", "13_social_security", "14_email_and_phone", "15_long_hold",
         "07_escalation_manager", LIVE_CALL)
AGREEMENT_GOAL = 0.95
# The stored finals against the scripts: 6.7 % on these seven calls at d52781d (about 1,500 words: 20 words of
# margin); 4.8 % on all 23 at 21f1ea5, where `callqa bench check` holds it.
WER_CEILING = 0.08
IDS = "has(splitByChar(',', {ids:String}), call_id)"


def load_calls(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], CallRecording]]:
    out = []
    for call in (c for c in manifest["calls"] if c["id"] in CALLS):
        rec = load_recording(LIBRARY_DIR / call["file"], OPTIONS)
        rec.holds_ms = holds_of(call)
        out.append((call, rec))
    return out


def replay(settings: Any, recordings: list[CallRecording], prefix: str, realtime: bool = False) -> list[str]:
    player = TelephonyReplay(ContractProducer(settings.bootstrap, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)
    return player.run(recordings, replace(OPTIONS, realtime=realtime, call_id_prefix=prefix)).call_ids


def every_span(spans: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """All calls' PII spans, each naming its call: searched in one pass where any call's PII could be."""
    return [{**span, "call": call_id} for call_id, call_spans in spans.items() for span in call_spans]


def scan_topics(settings: Any, read_topic: Any, spans: dict[str, list[dict[str, Any]]],
                more_topics: tuple[str, ...] = ()) -> tuple[list[Leak], int]:
    serde = Serde.from_settings()
    leaks: list[Leak] = []
    scanned = 0
    # The checkpoint topic too: an open call's checkpoint holds its finals so far (this worker has no
    # CALLQA_CHECKPOINT_KEY, so they are in the clear and their text is scanned like the transcripts').
    for topic in (settings.topic_transcripts, settings.topic_latency, settings.topic_qa, settings.topic_dead_letters,
                  settings.topic_checkpoints, *more_topics):
        for msg in read_topic(settings.bootstrap, topic, idle_s=3.0, timeout_s=120):
            if msg.value() is None:
                continue  # a tombstone: a finished call's record deleted
            scanned += 1
            decoded = serde.decode_any(msg.value())
            call = getattr(decoded, "call_id", "") or (msg.key() or b"").decode(errors="replace")
            where = f"topic {topic} offset {msg.offset()}"
            leaks += find_leaks(call, spans.get(call, []), [(f"{where} {p}", t) for p, t in message_texts(decoded)],
                                in_text=True)
            leaks += find_leaks(call, every_span(spans), [(where, string_values(decoded))], in_text=False)
    return leaks, scanned


def scan_tables(worker: Any, call_ids: list[str], spans: dict[str, list[dict[str, Any]]],
                tables: tuple[str, ...] = STORE_TABLES) -> tuple[list[Leak], int]:
    leaks: list[Leak] = []
    scanned = 0
    for table in tables:
        # no FINAL: partial and superseded rows are stored too until a merge folds them away
        rows = worker.query(f"SELECT * FROM {table} WHERE {IDS}", ids=",".join(call_ids))
        scanned += len(rows)
        for row in rows:
            call = row["call_id"]
            texts = []
            for column in TABLE_TEXT_COLUMNS.get(table, []):
                value = row.get(column)
                texts += [(f"table {table}.{column}", v) for v in (value if isinstance(value, list) else [value])]
            leaks += find_leaks(call, spans.get(call, []), texts, in_text=True)
            # Ids and times are the pipeline's own (call ids, "…/customer/000246310", "20:59:00.000"): joined
            # with the next value their digits can spell any number, so they are left out of this scan.
            own = {k: v for k, v in row.items() if k not in ("segment_id", "call_id") and not k.endswith("_at")}
            leaks += find_leaks(call, every_span(spans), [(f"table {table} row", string_values(own))], in_text=False)
    return leaks, scanned


def scan_log(log_path: Path, spans: dict[str, list[dict[str, Any]]]) -> tuple[list[Leak], int]:
    lines = log_path.read_text(errors="replace").splitlines()
    leaks = find_leaks("", every_span(spans), [(f"worker log line {i + 1}", line) for i, line in enumerate(lines)],
                       in_text=False)
    return leaks, len(lines)


def live_alert_before_end(settings: Any, read_topic: Any, call_id: str) -> tuple[int | None, int | None]:
    """Kafka timestamp of the call's first live QaAlert and of its end event."""
    serde = Serde.from_settings()
    alerts = [m.timestamp()[1] for m in read_topic(settings.bootstrap, settings.topic_qa, idle_s=3.0)
              if isinstance(d := serde.decode_any(m.value()), QaAlert) and d.call_id == call_id]
    ends = [m.timestamp()[1] for m in read_topic(settings.bootstrap, settings.topic_call_events, idle_s=3.0)
            if isinstance(d := serde.decode_any(m.value()), CallEvent) and d.call_id == call_id
            and d.event_type == "end"]
    return (min(alerts) if alerts else None), (ends[0] if ends else None)


def wait_live_alert(settings: Any, read_topic: Any, timeout_s: float) -> None:
    """Until a QaAlert of the live call (call id "live…") is on the QA topic; the check comes later."""
    serde = Serde.from_settings()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(isinstance(d := serde.decode_any(m.value()), QaAlert) and d.call_id.startswith("live")
               for m in read_topic(settings.bootstrap, settings.topic_qa, idle_s=1.0)):
            return
        time.sleep(1.0)


def test_call_library_verdicts_pii_and_live_alerts_through_the_running_pipeline(
    kafka_settings, start_worker, read_topic  # type: ignore[no-untyped-def]
) -> None:
    manifest = load_manifest()
    calls = load_calls(manifest)
    rule_set = load_rules(REPO / "rules")
    card = load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", rule_set)
    question_ids = {q.question: q.id for q in card.questions}
    # The fast replay puts minutes of audio of several calls on the topics within seconds; a call's end
    # event can then wait behind other calls' frames for longer than the default 30 s of stream time, and
    # the call would be closed as inactive before its last frames: give the burst room.
    worker = start_worker(call_inactivity_timeout_s="600")

    # (c) live alerts: one short call in real time; its alert must be on the topic before the call ends
    live = [(c, r) for c, r in calls if c["id"] == LIVE_CALL]
    live_ids: list[str] = []
    live_replay = threading.Thread(target=lambda: live_ids.extend(
        replay(kafka_settings, [live[0][1]], "live", realtime=True)), daemon=True)
    live_replay.start()
    # The other calls' fast replay loads the worker for about as long as the live call lasts: it starts
    # once the live alert is out, so what is checked is the live path's alert, not a saturated worker's.
    wait_live_alert(kafka_settings, read_topic, timeout_s=120)
    began = time.monotonic()
    # all calls again, fast (holds honoured: no frames), while the live one runs to its end
    call_ids = replay(kafka_settings, [r for _, r in calls], "lib")
    live_replay.join(timeout=300)
    live_id = live_ids[0]
    by_id = dict(zip(call_ids, [c for c, _ in calls], strict=True)) | {live_id: live[0][0]}
    rows = worker.wait_for_calls([*call_ids, live_id], timeout_s=1200)
    print(f"\n{len(call_ids)} library calls finished {time.monotonic() - began:.0f} s after the fast replay began")
    closed = {r["call_id"]: r["end_reason"] for r in rows}
    print(f"end reasons: {sorted(set(closed.values()))}")
    alert_at, end_at = live_alert_before_end(kafka_settings, read_topic, live_id)
    # A clean replay has no late frames: each one is audio that arrived after its place had been filled
    # with silence (the call finalised too early). Holds account for the filled gaps.
    hold_frames = sum(2 * (h["end_ms"] - h["start_ms"]) // OPTIONS.frame_ms for c, _ in calls for h in c["holds"])
    late_frames = worker.metric("callqa_frames_dropped_total", reason="late")
    gap_frames = worker.metric("callqa_gap_frames_total")
    print(f"worker: {late_frames:.0f} late frames dropped, {gap_frames:.0f} missing frames filled with silence "
          f"({hold_frames} are holds)")

    # (a) verdicts and metrics against the manifest
    qa = {r["call_id"]: r for r in worker.query(
        f"SELECT call_id, items.question AS q, items.passed AS p, metrics FROM call_qa FINAL WHERE {IDS}",
        ids=",".join(call_ids))}
    events: dict[str, list[dict[str, Any]]] = {}
    for e in worker.query(f"SELECT call_id, rule, kind FROM qa_events FINAL WHERE {IDS}", ids=",".join(call_ids)):
        events.setdefault(e["call_id"], []).append(e)
    compared = 0
    disagreements: list[Disagreement] = []
    metric_notes: list[Disagreement] = []
    for call_id in call_ids:
        call, expected = by_id[call_id], by_id[call_id]["expected"]
        got_rules = rule_verdicts(events.get(call_id, []), expected["rules"])
        got_items = item_verdicts(zip(qa[call_id]["q"], qa[call_id]["p"], strict=True), question_ids)
        n_rules, d_rules = compare(call["id"], expected["rules"], got_rules,
                                   skip=expected.get("uncertain_rules", []))
        n_items, d_items = compare(call["id"], expected["items"], got_items, skip=expected["uncertain_items"])
        compared += n_rules + n_items
        disagreements += d_rules + d_items
        metric_notes += metric_misses(call["id"], expected["metrics"], expected["tolerances"], qa[call_id]["metrics"])
    agreement = 1 - len(disagreements) / compared
    print(f"verdict agreement {agreement:.1%} ({compared - len(disagreements)}/{compared})")
    for d in disagreements:
        print(f"  verdict differs: {d.call} {d.what}: expected {d.expected}, got {d.got}")
    print(f"metrics outside tolerance: {len(metric_notes)}")
    for d in metric_notes:
        print(f"  metric: {d.call} {d.what}: expected {d.expected}, got {d.got}")
    # The calls row keeps the QA result's sentiment, hold and monologue figures (Float32 there).
    figures = ("customer_sentiment_end", "hold_ms", "longest_monologue_ms")
    stored = {r["call_id"]: r for r in worker.query(
        f"SELECT call_id, {', '.join(figures)} FROM calls FINAL WHERE {IDS}", ids=",".join(call_ids))}
    column_misses = [(c, f, stored[c][f]) for c in call_ids for f in figures
                     if abs(stored[c][f] - qa[c]["metrics"].get(f, 0.0)) > 0.01]

    # WER of the stored (redacted) finals against the scripts (PII spans replaced by their markers)
    segments = worker.query(f"SELECT call_id, leg, start_ms, text FROM segments FINAL WHERE is_final = 1 AND {IDS} "
                            "ORDER BY call_id, leg, start_ms", ids=",".join(call_ids))
    refs, hyps = [], []
    for call_id in call_ids:
        for leg in ("agent", "customer"):
            refs.append(redacted_reference(by_id[call_id], leg))
            hyps.append(" ".join(s["text"] for s in segments if s["call_id"] == call_id and s["leg"] == leg))
    wer = word_error_rate(refs, hyps)
    print(f"WER of the library transcripts (redacted, vs scripts): {wer:.1%}")

    # (b) PII: nowhere, in any topic, table or log line
    spans = {call_id: by_id[call_id]["pii"] for call_id in [*call_ids, live_id]}
    topic_leaks, n_messages = scan_topics(kafka_settings, read_topic, spans)
    table_leaks, n_rows = scan_tables(worker, [*call_ids, live_id], spans)
    worker.stop()
    log_leaks, n_lines = scan_log(worker.log_path, spans)
    leaks = topic_leaks + table_leaks + log_leaks
    print(f"PII scan: {n_messages} messages, {n_rows} rows, {n_lines} log lines, "
          f"{sum(len(s) for s in spans.values())} PII spans: {len(leaks)} found")
    for leak in leaks:
        print(f"  PII {leak.kind} of {leak.call} ({leak.needle}) in {leak.where}: {leak.excerpt!r}")

    assert set(closed.values()) == {"end"}, f"calls not closed by their end event: {closed}"
    assert alert_at is not None, f"no live QaAlert for {LIVE_CALL}"
    assert end_at is not None and alert_at < end_at, "the live alert came only after the call had ended"
    assert leaks == [], f"{len(leaks)} PII leaks (listed above)"
    assert agreement >= AGREEMENT_GOAL, f"verdict agreement {agreement:.1%} < {AGREEMENT_GOAL:.0%}"
    assert metric_notes == [], f"{len(metric_notes)} metrics outside the manifest's tolerance (listed above)"
    assert column_misses == [], f"calls rows differ from their QA result: {column_misses}"
    assert wer <= WER_CEILING, f"WER {wer:.1%} of the stored transcripts > {WER_CEILING:.0%}"
    # Only the holds are missing frames, and nothing came after its place was filled.
    assert (late_frames, gap_frames) == (0, hold_frames)
