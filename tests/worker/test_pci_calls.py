"""The PCI calls (samples/calls/pci/) through the running pipeline with default settings: real broker, one real
worker with its defaults (recordings on), real embedded store.

Each call reads card, social security and bank numbers out the ways callers do (in chunks with the agent's
"mm hmm" between them, after a digression, with "double", "triple", "oh" and "hundred", corrected), and is
otherwise a good call. All of them are replayed at once in real time, as live calls arrive. Then
- no PII span is in any output topic, any table or the worker's log (hard: zero), each piece of a value read
  in pieces counting on its own;
- each kept (redacted) recording, transcribed again, says none of its call's PII and still says the rest
  (the company's name: a silent recording would pass the PII check);
- the rule and scorecard verdicts agree with the manifest (≥ 95 %, as for the call library).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.asr.engine import Engine
from pipeline.bench.recordings import transcript
from pipeline.config import get_settings
from pipeline.eval.call_library import (
    STORE_TABLES,
    Disagreement,
    Leak,
    compare,
    find_leaks,
    holds_of,
    item_verdicts,
    load_manifest,
    rule_verdicts,
)
from pipeline.ingest.replay import load_recording
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import load_scorecard
from pipeline.recordings.encode import decode_call
from pipeline.recordings.storage import RecordingStore
from tests.worker.test_call_library import (
    AGREEMENT_GOAL,
    IDS,
    OPTIONS,
    replay,
    scan_log,
    scan_tables,
    scan_topics,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PCI_DIR = REPO / "samples" / "calls" / "pci" / "built"


def _wait_recordings(worker: Any, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.metric("callqa_recordings_total", outcome="written") < n:
        if time.monotonic() > deadline or not worker.alive():
            raise TimeoutError(f"fewer than {n} recordings written: {worker.log_tail()}")
        time.sleep(0.5)


def test_pci_calls_leave_no_sensitive_digit_and_keep_their_verdicts(
    kafka_settings, start_worker, read_topic, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    manifest = load_manifest(PCI_DIR)
    calls = manifest["calls"]
    recordings = []
    for call in calls:
        rec = load_recording(PCI_DIR / call["file"], OPTIONS)
        rec.holds_ms = holds_of(call)
        recordings.append(rec)
    card = load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", load_rules(REPO / "rules"))
    question_ids = {q.question: q.id for q in card.questions}
    worker = start_worker(recordings="true")  # the default; the fixture turns it off for the live-path tests

    began = time.monotonic()
    call_ids = replay(kafka_settings, recordings, "pci", realtime=True)
    by_id = dict(zip(call_ids, calls, strict=True))
    rows = worker.wait_for_calls(call_ids, timeout_s=300)
    _wait_recordings(worker, len(call_ids), timeout_s=180)
    print(f"\n{len(call_ids)} PCI calls replayed in real time; finished and recorded "
          f"{time.monotonic() - began:.0f} s after the replay began")
    closed = {r["call_id"]: r["end_reason"] for r in rows}

    # Verdicts against the manifest, compared as for the call library
    qa = {r["call_id"]: r for r in worker.query(
        f"SELECT call_id, items.question AS q, items.passed AS p FROM call_qa FINAL WHERE {IDS}",
        ids=",".join(call_ids))}
    events: dict[str, list[dict[str, Any]]] = {}
    for e in worker.query(f"SELECT call_id, rule, kind FROM qa_events FINAL WHERE {IDS}", ids=",".join(call_ids)):
        events.setdefault(e["call_id"], []).append(e)
    compared = 0
    disagreements: list[Disagreement] = []
    for call_id in call_ids:
        expected = by_id[call_id]["expected"]
        got_rules = rule_verdicts(events.get(call_id, []), expected["rules"])
        got_items = item_verdicts(zip(qa[call_id]["q"], qa[call_id]["p"], strict=True), question_ids)
        n_rules, d_rules = compare(by_id[call_id]["id"], expected["rules"], got_rules,
                                   skip=expected.get("uncertain_rules", []))
        n_items, d_items = compare(by_id[call_id]["id"], expected["items"], got_items,
                                   skip=expected["uncertain_items"])
        compared += n_rules + n_items
        disagreements += d_rules + d_items
    agreement = 1 - len(disagreements) / compared

    # What the store kept of each customer turn that read PII out (redacted text), to show per call
    finals = worker.query(f"SELECT call_id, leg, start_ms, end_ms, text FROM segments FINAL WHERE is_final = 1 "
                          f"AND {IDS} ORDER BY call_id, start_ms", ids=",".join(call_ids))

    # PII in every topic (the post-call jobs too), every table (the recordings' too) and the log
    spans = {call_id: by_id[call_id]["pii"] for call_id in call_ids}
    topic_leaks, n_messages = scan_topics(kafka_settings, read_topic, spans, (kafka_settings.topic_postcall,))
    table_leaks, n_rows = scan_tables(worker, call_ids, spans, (*STORE_TABLES, "recordings"))
    cuts = {r["call_id"]: r["cuts"] for r in worker.query(
        f"SELECT call_id, cuts FROM recordings FINAL WHERE {IDS}", ids=",".join(call_ids))}
    worker.stop()
    log_leaks, n_lines = scan_log(worker.log_path, spans)
    leaks = topic_leaks + table_leaks + log_leaks

    # Each kept recording transcribed again, as `callqa bench recordings` does: a leak must show
    files = RecordingStore(str(tmp_path / "recordings"))
    engine = Engine.load(settings=get_settings())
    heard_leaks: list[Leak] = []
    unheard: list[str] = []
    for call_id in call_ids:
        legs, rate = decode_call(files.read(call_id))
        heard = [(f"recording {leg} {a}-{b} ms", text) for leg, a, b, text in transcript(engine, legs, rate)]
        heard_leaks += find_leaks(call_id, spans[call_id], heard, in_text=True)
        if "harbor" not in " ".join(text for _, text in heard).lower():
            unheard.append(by_id[call_id]["id"])

    for call_id in call_ids:
        call = by_id[call_id]
        print(f"{call['id']} ({call_id}): {len(call['pii'])} PII spans, end {closed.get(call_id)}; cuts in the "
              f"recording: {sorted({c['kind'] for c in cuts.get(call_id, [])})}")
        for span in call["pii"]:
            turn = call["turns"][span["turn"]]
            kept = " ".join(s["text"] for s in finals if s["call_id"] == call_id and s["leg"] == turn["leg"]
                            and s["start_ms"] < turn["end_ms"] and turn["start_ms"] < s["end_ms"])
            print(f"  turn {span['turn']} {span['kind']}{'/' + str(span['part']) if 'part' in span else ''} "
                  f"{span['spoken']!r}: stored {kept!r}")
        for leak in (x for x in leaks + heard_leaks if x.call == call_id):
            print(f"  LEAK {leak.kind} ({leak.needle}) in {leak.where}: {leak.excerpt!r}")
        for d in (d for d in disagreements if d.call == call["id"]):
            print(f"  verdict differs: {d.what}: expected {d.expected}, got {d.got}")
    print(f"PII scan: {n_messages} messages, {n_rows} rows, {n_lines} log lines, "
          f"{sum(len(s) for s in spans.values())} PII spans: {len(leaks)} found; "
          f"heard again in the recordings: {len(heard_leaks)}")
    print(f"verdict agreement {agreement:.1%} ({compared - len(disagreements)}/{compared})")

    assert set(closed.values()) == {"end"}, f"calls not closed by their end event: {closed}"
    assert leaks == [], f"{len(leaks)} PII leaks in topics, tables or the log (listed above)"
    assert heard_leaks == [], f"{len(heard_leaks)} PII spans heard again in the kept recordings (listed above)"
    assert unheard == [], f"recordings that no longer say the company's name: {unheard}"
    assert agreement >= AGREEMENT_GOAL, f"verdict agreement {agreement:.1%} < {AGREEMENT_GOAL:.0%}"
