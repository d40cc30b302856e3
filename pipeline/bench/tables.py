"""Every result's tables, declared once: printed after a run (``show``) and in bench/README.md (``render``).

Each benchmark has a small spec in SPECS (which figures, headers with units); one without shows its
top-level figures and its lists of rows. A benchmark module therefore has no printing of its own beyond
progress: what it measured reaches the console and the README through the same spec.

Why bench/README.md is generated: hand-written result tables in the main README drifted from the runs they
cited and grew it past its length limit. Every figure here is read from a result document
(pipeline/bench/results.py): a new run reaches the tables by running `callqa bench readme` again, and
tests/bench/test_tables.py fails when the committed file is not what the committed results make.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable

from pipeline.bench.results import ENVELOPE, RESULTS, ROOT
from pipeline.tables import print_figures

Get = str | Callable[[Any], Any]  # a dotted path into a row or document, or a function of it


@dataclass(frozen=True)
class Col:
    header: str  # with its unit
    get: Get
    digits: int | None = None  # decimals shown; None: three significant figures
    scale: float = 1.0  # 100: a rate shown as %


@dataclass(frozen=True)
class Table:
    cols: tuple[Col, ...]
    rows: Get | None = None  # a list of rows, or a mapping of them (the key as "key"); None: the document's figures


@dataclass(frozen=True)
class Pivot:
    """A row per distinct ``keys``, a column per value of ``across`` (headed ``label``), ``cell`` where they meet."""

    title: str
    keys: tuple[Col, ...]
    across: str
    label: str
    cell: Col


def _met(row: Any) -> str:
    why = "; ".join(row.get("why_not") or ())
    return "yes" if row.get("met") else f"no ({why})" if why else "no"


def _part(p: Any) -> str:
    if p.get("status") != "ok":
        return f"failed: {p.get('error')}"
    if "ratio" in p:
        one, two = p["one_worker"]["call_audio_s_per_wall_s"], p["two_workers"]["call_audio_s_per_wall_s"]
        return f"{p['ratio']}× ({one} → {two} call-audio s/s; {p['ratio_by_worker_cpu']}× by the workers' CPU)"
    return f"{p.get('pause_s', p.get('redecoded_s'))} s"


PLAIN, WER, SYSTEM = Col("", ""), Col("WER %", "wer", 1, 100), Col("system", "system")
SPECS: dict[str, tuple[str, tuple[Table | Pivot, ...]]] = {
    "check": ("Checks (`make bench-check`)", (Table((Col("all met", "met"),)), Table((
        Col("check", "name"), Col("what", "what"), Col("met", "met"),
        Col("figures", lambda c: ", ".join(f"{k} {_fmt(v)}" for k, v in c["figures"].items())),
        Col("limits", "limits"), Col("misses", "misses"), Col("s", "seconds", 0)), "checks"))),
    "live": ("Capacity", (Table((
        Col("legs per core", "search.legs_per_core"), Col("at 200 GFLOP/s per core", "search.legs_per_core_normalized", 1),
        Col("engine alone, speech s/s", "engine_alone.speech_s_per_s", 1),
        Col("pipeline / engine alone", "engine_alone.pipeline_efficiency", 2))), Table((
            Col("calls", "calls"), Col("legs", "legs"), Col("max batch", "max_batch"),
            Col("setting", lambda r: f"`{r['variant']}`" if r.get("variant") else "default"),
            Col("P50 s", "latency.p50_s", 2), Col("P95 s", "latency.p95_s", 2), Col("P99 s", "latency.p99_s", 2),
            # As a read_committed consumer reads finals: with exactly once, at the commit after them.
            Col("read_committed P99 s", "read_committed_latency.p99_s", 2),
            Col("speech s/s", "throughput.speech_s_per_s", 1), Col("worker cores", "worker.cores_used", 2),
            Col("CPU s per speech s", "worker.cpu_s_per_speech_s.total", 4), Col("met", _met)), "levels"), Table((
                # Where the workers' cores went (pipeline/bench/probes.py's split by thread), and the sender's lag.
                Col("calls", "calls"), Col("max batch", "max_batch"), Col("event loop cores", "worker.cores.event_loop", 2),
                Col("inference cores", "worker.cores.inference", 2), Col("native pools", "worker.cores.native_pools", 2),
                Col("other", "worker.cores.other", 2), Col("RSS MB max", "worker.rss_mb.max", 0),
                Col("mean batch", "batches.mean_size", 2), Col("frames sent late P99 ms", "sender.tick_late.p99_ms", 1)),
                "levels"), Table((
                Col("variant", "variant"), Col("calls", "calls"), Col("CPU s per speech s", "cpu_s_per_speech_s", 4),
                Col("base's", "base_cpu_s_per_speech_s", 4), Col("ratio", "cpu_ratio_to_base", 3),
                Col("P99 s", "p99_s", 2), Col("base's P99 s", "base_p99_s", 2), Col("met", _met)), "variants"), Table((
                # --desk: from a spoken word's end (faster-whisper's word times) to its first event on a desk's stream.
                Col("calls", "calls"), Col("setting", lambda r: f"`{r['variant']}`" if r.get("variant") else "default"),
                Col("words spoken", "words_on_screen.words_spoken"), Col("shown", "words_on_screen.words_shown"),
                Col("first in a partial", "words_on_screen.first_by_partial"),
                Col("word to screen P50 s", "words_on_screen.first_shown.p50_s", 2),
                Col("P95 s", "words_on_screen.first_shown.p95_s", 2),
                Col("P99 s", "words_on_screen.first_shown.p99_s", 2),
                Col("P99 s, words a partial showed", "words_on_screen.first_shown_by_partial.p99_s", 2),
                Col("goal P99 s", "words_on_screen.goal_p99_s")),
                lambda d: [lv for lv in d["levels"] if lv.get("words_on_screen")]))),
    "memory": ("Memory per leg", (Table((
        Col("MB per leg", "result.mb_per_leg", 2), Col("goal, MB per leg", "result.goal_mb_per_leg"),
        Col("met", "result.met"))), Table((
            Col("from legs", "from_legs", 0), Col("to legs", "to_legs", 0), Col("RSS added MB", "rss_mb_added", 1),
            Col("MB per leg", "mb_per_leg", 2), Col("MB per leg (medians)", "mb_per_leg_median", 2)), "per_step"))),
    "accuracy": ("Accuracy", (
        Pivot("WER % by condition", (Col("set (words)", lambda r: f"{r['set']} ({r['reference_words']:,})"), SYSTEM),
              "condition", "{}", WER),
        Pivot("digit sequences exact", (Col("set", "set"), SYSTEM), "condition", "{}",
              Col("", lambda r: f"{r['digit_sequences_exact']} of {r['digit_sequences']}")))),
    "chaos": ("Churn", (Table((
        Col("finished exactly once %", "finished_exactly_once_pct", 1),
        Col("finals equal to `callqa analyze` %", "finals_equal_offline_pct", 1),
        Col("verdicts equal to `callqa analyze` %", "verdicts_equal_offline_pct", 1), Col("PII found", "pii_leaks"),
        Col("PII scanned", lambda d: ", ".join(f"{v:,} {k}" for k, v in d["pii_scanned"].items())),
        Col("kills, SIGTERMs, broker restarts, store outages",
            lambda d: f"{d['kills']}, {d['sigterms']}, {d['broker_restarts']}, {d['outages']}"),
        Col("leg audio re-decoded s", "redecoded_s", 0), Col("re-decoded per worker fault s", "redecoded_per_worker_fault_s", 1),
        Col("longest stall of live finals s", "stall.max_s", 1), Col("stall P99 s", "stall.p99_s", 1),
        Col("take-over s after each kill -9", lambda d: ", ".join(
            "none" if t is None else f"{t:.2f}" for t in d["takeover_s"]) if d.get("takeover_s") else "not measured"),
        Col("checkpoint topic MB", "checkpoint_topic.bytes", 1, 1e-6), Col("problems", lambda d: len(d["problems"])))),)),
    "soak": ("Soak", (Table((
        Col("calls", "settings.calls"), Col("minutes", "settings.minutes"), Col("restarts", lambda d: len(d["restarts"])),
        Col("RSS MB of the long-lived worker, first → last", lambda d: f"{d['rss_mb']['first']} → {d['rss_mb']['last']}"),
        Col("RSS growth %", "rss_mb.growth_pct"), Col("RSS MB/h after the first window",
                                                      lambda d: d["rss_mb"].get("slope_after_first_mb_per_h")),
        Col("P99 s, first → last", lambda d: f"{d['p99_s']['first']} → "
                                                                                      f"{d['p99_s']['last']}"),
        Col("P99 drift %", "p99_s.drift_pct"),
        Col("P99 s between restarts", lambda d: d["p99_s"].get("between_restarts", {}).get("whole_run")),
        Col("worst restart minute's P99 s (x between)", lambda d: None if d["p99_s"].get("after_restart_ratio") is None
            else f"{d['p99_s']['worst_after_restart']} ({d['p99_s']['after_restart_ratio']}x)"),
        Col("turns without a final", "turns.without_final"),
        Col("met", _met))), Table((
            Col("restart t s", "t_s", 0), Col("worker", "worker"), Col("pause s", "took_s", 2),
            Col("next minute's P99 s", "p99_after_s", 2),
            Col("slowest final: latency = close + wait + inference + after s", lambda r: next((
                f"{f['latency_s']} = {f['close_s']} + {f['wait_s']} + {f['inference_s']} + {f['after_s']} "
                f"({f['leg']}, speech ended {f['speech_end_after_s']} s after)"
                for f in r.get("slowest_after") or []), ""))),
            "restarts"), Table((
            Col("t s", "t_s", 0), Col("RSS MB", lambda r: ", ".join(f"{k} {v}" for k, v in r["rss_mb"].items())),
            Col("open files", lambda r: ", ".join(f"{k} {v}" for k, v in r["open_files"].items())),
            Col("finals", "finals"), Col("P99 s", "p99_s", 2), Col("lag frames", "audio_lag_frames"),
            Col("checkpoint offsets", lambda r: r.get("checkpoint_offsets")),
            Col("topics MB", lambda r: sum((r["topic_bytes"] or {}).values()), 1, 1e-6)),
            "timeline"))),
    "live-desk": ("Live desk", (Table((
        Col("calls in progress", "calls"), Col("finals seen", "finals_seen"), Col("final P50 ms", "final_p50_ms", 1),
        Col("final P99 ms", "final_p99_ms", 1), Col("partial P99 ms", "partial_p99_ms", 1),
        # Into the DOM of the call pages open in Chromium (their own script), where that was measured.
        Col("call pages", "browser_pages"), Col("in page: finals", "browser_finals_seen"),
        Col("in page: final P50 ms", "browser_final_p50_ms", 1), Col("in page: final P99 ms", "browser_final_p99_ms", 1),
        Col("desk core share", "desk_cpu_core", 3), Col("desk CPU ms per call s", "desk_cpu_ms_per_call_s", 3),
        Col("wall rows", "wall_rows"), Col("browser script ms/s", "browser_script_ms_per_s", 1),
        Col("browser task ms/s", "browser_task_ms_per_s", 1)), "levels"),
        Table((Col("goal: final P99 ms at 100 calls", "goals.final_p99_ms_at_100", 0), Col("met", "met"))))),
    "search": ("Search and the call list", (Table((
        Col("calls", "calls"), Col("segments", "segments"), Col("search P50 ms", "p50_ms", 1),
        Col("search P95 ms", "p95_ms", 1), Col("list P50 ms", "list_p50_ms", 1), Col("list P95 ms", "list_p95_ms", 1),
        Col("goal P95 ms", "goals.p95_ms", 0), Col("met", "met"))), Table((
            Col("query", "key"), Col("calls found", lambda q: q.get("calls", "")), Col("P50 ms", "p50_ms", 1),
            Col("P95 ms", "p95_ms", 1)),
            lambda d: {**d["kinds"]["search"]["queries"], **d["kinds"]["list"]["queries"],
                       **{f"scan: {k}": v for k, v in d["kinds"]["scan"]["queries"].items()}}))),
    "scale-out": ("Scale-out", (Table((
        Col("part", "key"), Col("goal", lambda p: p.get("goal") or f"<= {p.get('bound_s')} s"),
        Col("measured", _part), Col("met", "met"), Col("run", "run")), "parts"),)),
    "gateway": ("Gateway", (Table((
        Col("legs", "legs"), Col("core share", "gateway_cpu_core_fraction", 2), Col("legs per core", "legs_per_core"),
        Col("CPU ms per leg s", "cpu_ms_per_leg_s", 2), Col("RSS KB per leg", "rss_kb_per_leg", 1),
        Col("P50 ms", "latency_p50_ms", 1), Col("P99 ms", "latency_p99_ms", 1),
        Col("frames dropped", "frames_dropped"), Col("calls lost", "calls_lost"),
        Col("simulators late P99 ms", "simulator_late_p99_ms", 0)), "levels"),
        Table((Col("goal: legs per core", "goals.legs_per_core"), Col("goal: P99 ms", "goals.latency_p99_ms"),
               Col("goal: RSS KB per leg", "goals.rss_kb_per_leg"))))),
    "gateway-siprec": ("Gateway, SIPREC sessions", (Table((
        Col("SIPREC sessions", "sessions"), Col("core share", "gateway_cpu_core_fraction", 2),
        Col("sessions per core", "sessions_per_core"), Col("RSS KB per session", "rss_kb_per_session", 1),
        Col("P50 ms", "latency_p50_ms", 1), Col("P99 ms", "latency_p99_ms", 1),
        Col("RTP packets lost, late", lambda r: f"{r['rtp_packets_lost']}, {r['rtp_packets_late']}"),
        Col("calls lost", "calls_lost")), "levels"),
        Table((Col("goal: sessions per core", "goals.sessions_per_core"), Col("goal: P99 ms", "goals.latency_p99_ms"),
               Col("goal: RSS KB per session", "goals.rss_kb_per_session"))))),
    "recordings": ("Redacted recordings", (Table((
        # "calls" holds each call's figures (recordings.py), so the count is its length.
        Col("calls", lambda d: len(d["calls"])), Col("minutes", "minutes", 1), Col("PII spans", "pii_spans"),
        Col("PII heard again", "leaks"),
        Col("cuts: estimate, widened, whole segment", lambda d: ", ".join(str(v) for v in d["cuts_by_step"].values())),
        Col("silenced s", "silenced_s", 1),
        Col("whole-turn spans fully covered", lambda d: f"{d['whole_turn_spans_fully_covered']} of {d['whole_turn_spans']}"),
        Col("cut start before / end after the turn, median ms", lambda d: f"{d['median_before_ms']:g} / {d['median_after_ms']:g}"),
        Col("WER %, audio / recording", lambda d: f"{100 * d['wer_original']:.1f} / {100 * d['wer_recording']:.1f}"),
        Col("kB per minute by Opus level", lambda d: ", ".join(f"{k}: {v}" for k, v in d["kbytes_per_minute"].items())),
        Col("worst crosstalk dB by level", lambda d: ", ".join(f"{k}: {v}" for k, v in d["worst_crosstalk_db"].items())))),
        Table((Col("call", "call"), Col("minutes", "minutes", 2), Col("PII spans", "pii_spans"),
               Col("cuts", lambda c: len(c["cuts"])), Col("PII heard again", lambda c: len(c["leaks"])),
               Col("whole-turn spans covered", lambda c: f"{sum(p['covered'] >= 1 for p in c['placement'])} of "
                                                         f"{len(c['placement'])}"),
               Col("WER % audio", "wer_original", 1, 100), Col("WER % recording", "wer_recording", 1, 100),
               Col("kB per minute", lambda c: next(iter(c["kbytes_per_minute"].values())))), "calls"))),
    "asr": ("ASR speed", (
        Pivot("audio s per wall s (per CPU s)", (SYSTEM, WER), "batch", "batch {}",
              Col("", lambda r: f"{r['audio_s_per_s']:.1f} ({r['audio_s_per_cpu_s']:.1f})")),
        Table((Col("batcher: audio s/s offered", "batcher.offered_audio_s_per_s"),
               Col("latency P50 / P90 / P99 ms", lambda d: " / ".join(
                   f"{d['batcher'][f'latency_{q}_ms']:.0f}" for q in ("p50", "p90", "p99")) if d.get("batcher") else None),
               Col("mean batch", "batcher.mean_batch_size", 1),
               Col("ours batch 16 / faster-whisper batched", "ratios.ours_b16_vs_faster_whisper_batched", 2),
               Col("ours batch 16 / ours batch 1", "ratios.ours_b16_vs_ours_b1", 2),
               Col("peak RSS MB, ours", "peak_rss_mb.ours", 0))))),
    "inference-process": ("Decoding in child processes", (Table((
        Col("configuration", "key"), Col("speech s/s (median)", "speech_s_per_wall_s_median", 1),
        Col("event-loop lag P99 ms", "event_loop_lag_p99_ms_median", 1),
        Col("latency P99 ms", "latency_p99_ms_median", 0)), "summary"),)),
    "consumer": ("faust's agent against a batch consumer in the faust app", (Table((
        Col("span ms", "span_ms"), Col("traffic", "traffic"), Col("path", "path"), Col("messages", "messages"),
        Col("CPU s per 1,000 messages", "cpu_s_per_1000_messages", 4), Col("CPU ms per audio s", "cpu_ms_per_audio_s", 3),
        Col("event loop CPU ms per audio s", "event_loop_cpu_ms_per_audio_s", 3), Col("messages/s", "messages_per_s", 0),
        Col("batch / agent CPU", "batch_over_agent_cpu", 2),
        Col("batch / agent event loop CPU", "batch_over_agent_event_loop_cpu", 2),
        Col("each message once", "exactly_once")), "rows"),)),
    "segments": ("Segments cut", (Table((
        Col("settings", "label"), Col("set", "set"), Col("segments", "segments"),
        Col("per recording", "segments_per_recording", 2), Col("mean s", "length_s.mean", 1),
        Col("P90 s", "length_s.p90", 1), Col("max s", "length_s.max", 1), Col("over 10 s", "over_10_s"),
        Col("cut at max length", "cut_at_max_length")),
        lambda d: [{"label": r["label"], "set": s, **v} for r in d["runs"] for s, v in r["sets"].items()]),)),
}


def _get(obj: Any, get: Get) -> Any:
    if callable(get):
        try:
            return get(obj)
        except (KeyError, IndexError, TypeError, ValueError):  # a figure the run did not reach (a failed part): "–"
            return None
    for key in get.split("."):
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def _fmt(value: Any, col: Col = PLAIN) -> str:
    if value is None or value == []:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "; ".join(_fmt(v) for v in value)
    if not isinstance(value, int | float):
        return str(value).replace("\n", " ")
    v = value * col.scale if col.scale != 1 else value
    if col.digits is not None or isinstance(v, int):
        return f"{v:,.{col.digits or 0}f}"
    text = f"{v:,.{max(0, 2 - math.floor(math.log10(abs(v)))) if v else 0}f}"  # three significant figures
    return text.rstrip("0").rstrip(".") if "." in text else text


@dataclass(frozen=True)
class Grid:
    """One table of a result, its cells formatted: what both outputs draw."""

    title: str
    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> list[str]:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        head = [f"**{self.title}**", ""] if self.title else []
        return [*head, line(self.headers), "|" + "---|" * len(self.headers), *map(line, self.rows), ""]

    def rich(self) -> RichTable:
        table = RichTable(*self.headers, title=self.title or None, box=box.SIMPLE_HEAD, show_edge=False)
        for row in self.rows:
            table.add_row(*row)
        return table


def _rows(doc: Any, rows: Get) -> list[Any]:
    found = _get(doc, rows) or []
    return [{"key": k, **v} for k, v in found.items()] if isinstance(found, Mapping) else list(found)


def _grid(doc: Any, part: Table | Pivot) -> Grid | None:
    if isinstance(part, Pivot):
        return _pivot(doc, part)
    if part.rows is None:
        shown = [[c.header, _fmt(v, c)] for c in part.cols if (v := _get(doc, c.get)) is not None]
        return Grid("", ["figure", "value"], shown) if shown else None
    rows = [[_fmt(_get(r, c.get), c) for c in part.cols] for r in _rows(doc, part.rows)]
    return Grid("", [c.header for c in part.cols], rows) if rows else None


def _pivot(doc: Any, part: Pivot) -> Grid:
    cells: dict[tuple[str, ...], dict[str, str]] = {}
    for row in _rows(doc, "rows"):
        key = tuple(_fmt(_get(row, c.get), c) for c in part.keys)
        cells.setdefault(key, {})[str(row[part.across])] = _fmt(_get(row, part.cell.get), part.cell)
    across = list(dict.fromkeys(a for by in cells.values() for a in by))
    return Grid(part.title, [c.header for c in part.keys] + [part.label.format(a) for a in across],
                [[*k, *(by.get(a, "–") for a in across)] for k, by in cells.items()])


def grids(doc: Mapping[str, Any], name: str) -> list[Grid]:
    """The tables of result ``name`` (its file's stem) made from ``doc``."""
    return [g for part in SPECS.get(name, ("", ()))[1] or _generic(doc) if (g := _grid(doc, part)) is not None]


def show(doc: Mapping[str, Any], console: Console, name: str | None = None) -> None:
    """A run's tables on the console, as bench/README.md will show them (``name``: the result's, when its
    ``benchmark`` does not say it)."""
    for grid in grids(doc, name or str(doc.get("benchmark", "")).removeprefix("callqa bench ")):
        print_figures(console, grid.rich())


def _auto(key: str) -> Col:
    words = re.split(r"[_.]", key)
    wer = "wer" in words  # a word error rate, shown as %
    header = " ".join(w.upper() if w in {"wer", "cpu", "rss", "mb", "kb", "p50", "p90", "p95", "p99"} else w
                      for w in words)
    return Col(header + " %" * wer, key, 1 if wer else None, 100 if wer else 1)


def _generic(doc: Mapping[str, Any]) -> tuple[Table, ...]:
    """Without a spec: the top-level figures, then each top-level list of rows (with ``latency.p99_s`` and the
    like: the figures one mapping down)."""
    def flat(row: Mapping[str, Any]) -> list[str]:
        return [f"{k}.{k2}" if isinstance(v, dict) else k for k, v in row.items()
                for k2, v2 in (v.items() if isinstance(v, dict) else [("", v)]) if not isinstance(v2, dict | list)]

    tables = [Table(tuple(_auto(k) for k in dict.fromkeys(k for r in rows for k in flat(r))), name)
              for name, rows in doc.items() if isinstance(rows, list) and rows and isinstance(rows[0], dict)]
    top = [k for k, v in doc.items() if k not in (*ENVELOPE, "note") and not isinstance(v, dict | list)]
    return (Table(tuple(_auto(k) for k in top)), *tables)


def _when_what(doc: Mapping[str, Any], path: Path, link: str) -> str:
    git, m = doc.get("git") or {}, doc.get("machine") or {}
    commit = (f"commit `{git['commit'][:7]}`" + " with uncommitted changes" * bool(git.get("dirty"))
              if git.get("commit") else f"no commit recorded (committed in `{str(git.get('committed_in'))[:7]}`)")
    try:
        when = datetime.strptime(doc["started"], "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d %H:%M UTC")
    except (KeyError, TypeError, ValueError):
        when = str(doc.get("started"))
    cores, gemm = m.get("cores") or m.get("cpus"), m.get("gemm_gflops_per_core")
    machine = ", ".join(x for x in (m.get("cpu_model"), cores and f"{cores} cores",
                                    gemm and f"fp32 GEMM {gemm} GFLOP/s per core") if x) or "machine not recorded"
    return f"`{doc.get('benchmark') or 'callqa bench ' + path.stem}` · {when} · {commit} · {machine} · [{path.name}]({link})"


def _latest_parts(doc: dict[str, Any], history: Path) -> dict[str, Any]:
    """A benchmark of parts (scale-out) may run one part alone: each part's latest run that completed."""
    runs = [json.loads(line) for line in history.read_text().splitlines() if line.strip()] if history.exists() else []
    parts: dict[str, Any] = {}
    for run in sorted([*runs, doc], key=lambda r: str(r.get("started"))):
        parts |= {name: {**p, "run": run.get("started")} for name, p in (run.get("parts") or {}).items()
                  if p.get("status") == "ok"}
    return {**doc, "parts": parts}


def section(path: Path, heading: str, out: Path) -> list[str]:
    """One result document: ``heading`` and the spec's title, when and on what, then its tables."""
    doc = json.loads(path.read_text())
    doc = _latest_parts(doc, path.with_suffix(".jsonl")) if "parts" in doc else doc
    title = SPECS.get(path.stem, ("", ()))[0]
    lines = [f"{heading}{title}".rstrip(": "), "", _when_what(doc, path, os.path.relpath(path, out.parent)), ""]
    lines += [f"Note: {doc['note']}.", ""] if doc.get("note") else []
    return lines + [line for grid in grids(doc, path.stem) for line in grid.markdown()]


def render(results: Path = RESULTS, out: Path = RESULTS.parent / "README.md") -> str:
    top = sorted(results.glob("*.json"), key=lambda p: (list(SPECS).index(p.stem) if p.stem in SPECS else 99, p.stem))
    studies = sorted(results.glob("*/**/*.json"))
    links = {name: os.path.relpath(path, out.parent) for name, path in (
        ("results", results), ("how", ROOT / "pipeline/bench/README.md"), ("history", ROOT / "bench/HISTORY.md"))}
    lines = ["_Generated by `callqa bench readme` from bench/results/: do not edit by hand; run it again after a "
             "benchmark._", "", "# Benchmark results", "",
             f"Each benchmark's latest run ([results]({links['results']})), then the studies'. How each benchmark "
             f"measures: [pipeline/bench/README.md]({links['how']}); earlier runs and levers since removed: "
             f"[bench/HISTORY.md]({links['history']}). Machines differ between runs (shared 2-core machines, the "
             "broker and traffic on the same cores): compare within a run.", ""]
    for path in top:
        lines += section(path, "## " if path.stem in SPECS else f"## {path.stem}", out)
    if studies:
        lines += ["## Studies", "", "Runs of one question each (a lever, a model), a folder per study; what each "
                  "found is in bench/HISTORY.md.", ""]
    for path in studies:
        lines += section(path, f"### {path.relative_to(results).with_suffix('')}: ", out)
    return "\n".join(lines).rstrip() + "\n"

