"""`callqa bench search`: search and the call list at contact-center scale, in the embedded store.

A fresh chdb folder is filled with ``calls`` generated calls, migrated as a worker's store is (the segments'
full-text index included): 6-20 final turns each (over a million segments at 100,000 calls), the turns the
call library's scripts say (samples/calls/library/scripts/, their spoken PII already a marker, as the
worker stores it), a share of sentences drawn from the scripts' words, and in one call of 200 a turn no
script says (what a rare search finds); 60 agents, starts spread over 90 days, a QA score each, 15 % of calls failing the
recording disclosure. The tables are merged first (``OPTIMIZE ... FINAL``, timed): a store that has run a
while has its parts merged; a fresh fill would measure the parts, not the search.

Then, each ``repeat`` times, through the query API's checked path (``ClientRows``, as ``/api/search`` and
the pages run): phrase searches (common and rare phrases, alone and with a leg, an agent, a date range, a
score and a failed rule), and pages of the call list (first page, filtered, deep by cursor, with a phrase,
sorted by score, one category).
Figures: P50/P95 per query and over each kind; the same phrase searches with the skip indexes off
(``use_skip_indexes = 0``: a scan, what the index saves). Goal: search P95 <= 300 ms, the list's
P95 <= 300 ms. Result: ``search``.
"""

from __future__ import annotations

import random
import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.progress import Progress

from pipeline.bench.results import RESULTS, ROOT, record, run_folder, utc_stamp, write_result
from pipeline.desk.search import SearchQuery, search
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.store.queries import ClientRows, QueryLimits
from pipeline.web.data import ListFilters, read_call_list

SCRIPTS = ROOT / "samples" / "calls" / "library" / "scripts"
GOAL_P95_MS = 300.0
T0 = datetime(2026, 9, 1, tzinfo=UTC)
BATCH_CALLS = 5_000
RARE_TURN = "I saw the platinum rewards offer on television last night."
CATEGORY_SHARES = (("escalation", 0.08), ("cancellation", 0.05), ("no_disclosure", 0.15))


@dataclass(frozen=True)
class SearchBenchOptions:
    calls: int = 100_000
    repeat: int = 15
    seed: int = 1
    out: Path = RESULTS
    keep: bool = False  # keep the filled store (its folder is printed)


def script_turns() -> list[tuple[str, str]]:
    """(leg, text) of every scripted turn, with its spoken PII replaced by the marker the redactor writes."""
    turns = []
    for path in sorted(SCRIPTS.glob("*.yaml")):
        for turn in yaml.safe_load(path.read_text())["turns"]:
            leg = next((leg for leg in ("agent", "customer") if leg in turn), None)
            if leg is None:
                continue  # a hold: nothing said
            text = str(turn[leg])
            for pii in turn.get("pii") or []:
                text = text.replace(str(pii.get("spoken", "")), f"[{pii['kind']}]")
            turns.append((leg, text))
    return turns


class CallMaker:
    """Generated calls, reproducible from the seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.turns = script_turns()
        self.words = sorted({w for _, t in self.turns for w in re.findall(r"[a-z']+", t.lower())})

    def sentence(self) -> str:
        return " ".join(self.rng.choice(self.words) for _ in range(self.rng.randint(4, 14))).capitalize() + "."

    def batch(self, first: int, count: int) -> dict[str, list[list[Any]]]:
        rng = self.rng
        rows: dict[str, list[list[Any]]] = {"calls": [], "segments": [], "call_qa": [], "qa_events": []}
        for n in range(first, first + count):
            call_id, agent = f"bench-{n:07d}", f"agent-{rng.randrange(60):02d}"
            started = T0 + timedelta(seconds=rng.randrange(90 * 86_400))
            at_ms, turns = 0, rng.randint(6, 20)
            for _ in range(turns):
                leg, text = rng.choice(self.turns) if rng.random() < 0.7 else (rng.choice(("agent", "customer")),
                                                                                self.sentence())
                length = 1000 + 60 * len(text)
                rows["segments"].append([f"{call_id}:{leg}:{at_ms}", call_id, leg, at_ms, at_ms + length, text, 1,
                                         started + timedelta(milliseconds=at_ms + length)])
                at_ms += length + rng.randrange(300, 2500)
            if rng.random() < 0.005:  # what a rare search finds: one call in 200
                rows["segments"].append([f"{call_id}:customer:{at_ms}", call_id, "customer", at_ms, at_ms + 3000,
                                         RARE_TURN, 1, started + timedelta(milliseconds=at_ms + 3000)])
                at_ms += 3500
            ended = started + timedelta(milliseconds=at_ms)
            categories = [name for name, share in CATEGORY_SHARES if rng.random() < share]
            rows["calls"].append([call_id, "acme", agent, rng.choice(("billing", "sales", "support")), "inbound",
                                  ["agent", "customer"], started, ended, "end", turns, at_ms, ended, categories])
            rows["call_qa"].append([call_id, "acme", agent, round(rng.uniform(20, 100), 1), 0, ended])
            if rng.random() < 0.15:
                rows["qa_events"].append([call_id, "recording_disclosure", "compliance", "agent", "missing", 60_000,
                                          "", "critical", ended])
        return rows


COLUMNS = {
    "calls": ["call_id", "tenant", "agent_id", "queue", "direction", "legs", "started_at", "ended_at", "end_reason",
              "segments", "audio_ms", "updated_at", "categories"],
    "segments": ["segment_id", "call_id", "leg", "start_ms", "end_ms", "text", "is_final", "produced_at"],
    "call_qa": ["call_id", "tenant", "agent_id", "score_pct", "auto_failed", "computed_at"],
    "qa_events": ["call_id", "rule", "category", "leg", "kind", "offset_ms", "text", "severity", "detected_at"],
}


def searches() -> dict[str, SearchQuery]:
    week = (T0 + timedelta(days=60), T0 + timedelta(days=67))
    return {
        "common phrase": SearchQuery("may be recorded"),
        "phrase, customer leg": SearchQuery("speak to a manager", leg="customer"),
        "phrase + agent": SearchQuery("date of birth", agent="agent-07"),
        "phrase + a week": SearchQuery("cancel", since=week[0], until=week[1]),
        "phrase + score below 40": SearchQuery("refund", score_below=40),
        "phrase + failed rule": SearchQuery("thank you for calling", failed="recording_disclosure"),
        "a place name": SearchQuery("springfield"),
        "rare phrase": SearchQuery("platinum rewards"),
        "no such phrase": SearchQuery("purple elephant"),
    }


def pages(first_page: list[Any]) -> dict[str, ListFilters]:
    deep = first_page[-1] if first_page else None
    return {
        "list: first page": ListFilters(),
        "list: one agent": ListFilters(agent="agent-07"),
        "list: score 40-60, a month": ListFilters(score_min=40, score_max=60, date_from=(T0 + timedelta(days=30)).date(),
                                                  date_to=(T0 + timedelta(days=60)).date()),
        "list: next page": ListFilters(after=(deep.started_at, deep.call_id) if deep else None),
        "list: search box": ListFilters(phrase="cancel my account"),
        "list: lowest score first": ListFilters(sort="lowest_score"),
        "list: a category": ListFilters(category="escalation"),
    }


def run_search_bench(options: SearchBenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    stamp = utc_stamp()
    folder = run_folder("search", stamp) / "store"
    db = "callqa"
    client = connect(f"chdb://{folder.resolve()}", db)
    try:
        migrate(client, db)
        fill_s, segments = fill(client, options, console)
        began = time.perf_counter()
        for table in COLUMNS:
            client.command(f"OPTIMIZE TABLE {db}.{table} FINAL")
        merge_s = time.perf_counter() - began
        source = ClientRows(client, db, QueryLimits())  # the API's limits: one thread a query
        timed = time_queries(source, client, db, options.repeat, console)
    finally:
        client.close()
        if not options.keep:
            shutil.rmtree(folder, ignore_errors=True)
    figures = summarise(timed, options.calls, segments)
    figures.update(fill_s=round(fill_s, 1), merge_s=round(merge_s, 1), store=str(folder) if options.keep else None)
    doc = record("search", {"calls": options.calls, "repeat": options.repeat, "seed": options.seed}, figures,
                 started=stamp)
    return doc, write_result("search", doc, options.out)


def fill(client: Any, options: SearchBenchOptions, console: Console) -> tuple[float, int]:
    maker, segments, began = CallMaker(options.seed), 0, time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"filling the store with {options.calls:,} calls", total=options.calls)
        for first in range(0, options.calls, BATCH_CALLS):
            rows = maker.batch(first, min(BATCH_CALLS, options.calls - first))
            for table, columns in COLUMNS.items():
                if rows[table]:
                    client.insert(table, rows[table], column_names=columns)
            segments += len(rows["segments"])
            progress.advance(task, len(rows["calls"]))
    return time.perf_counter() - began, segments


def time_queries(source: ClientRows, client: Any, db: str, repeat: int, console: Console) -> dict[str, Any]:
    timed: dict[str, Any] = {"search": {}, "scan": {}, "list": {}}
    first_page = read_call_list(source, db, ListFilters(), 50)
    runs: list[tuple[str, str, Any]] = [("search", name, q) for name, q in searches().items()]
    runs += [("list", name, f) for name, f in pages(first_page).items()]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing the queries", total=len(runs) * repeat + len(searches()))
        for kind, name, query in runs:
            times, found = [], 0
            for _ in range(repeat):
                began = time.perf_counter()
                found = (len(search(source, db, query)) if kind == "search"
                         else len(read_call_list(source, db, query, 50)))
                times.append((time.perf_counter() - began) * 1000)
                progress.advance(task)
            timed[kind][name] = {"ms": times, "calls": found}
        for name, query in searches().items():  # once each: a scan of every segment
            sql, params = query.sql(db)
            began = time.perf_counter()
            client.query(sql, parameters=params, settings={"use_skip_indexes": 0, "max_threads": 1})
            timed["scan"][name] = {"ms": [(time.perf_counter() - began) * 1000]}
            progress.advance(task)
    return timed


def summarise(timed: dict[str, Any], calls: int, segments: int) -> dict[str, Any]:
    def pct(values: list[float], q: float) -> float:
        return round(float(np.percentile(values, q)), 1)

    kinds: dict[str, dict[str, Any]] = {}
    for kind, queries in timed.items():
        every = [t for q in queries.values() for t in q["ms"]]
        kinds[kind] = {"p50_ms": pct(every, 50), "p95_ms": pct(every, 95), "queries": {
            name: {"p50_ms": pct(q["ms"], 50), "p95_ms": pct(q["ms"], 95), **({"calls": q["calls"]} if "calls" in q
                                                                             else {})}
            for name, q in queries.items()}}
    met = kinds["search"]["p95_ms"] <= GOAL_P95_MS and kinds["list"]["p95_ms"] <= GOAL_P95_MS
    return {"calls": calls, "segments": segments, "p50_ms": kinds["search"]["p50_ms"],
            "p95_ms": kinds["search"]["p95_ms"], "list_p50_ms": kinds["list"]["p50_ms"],
            "list_p95_ms": kinds["list"]["p95_ms"], "kinds": kinds,
            "goals": {"p95_ms": GOAL_P95_MS}, "met": met}

