"""`callqa bench live-desk`: the live desk under many calls in progress.

A `callqa desk` process follows topics a generator fills as workers would for N calls at once (a summary per
call every second, a partial every second and a final every 4 s, alternating legs, an alert now and then),
each transcript carrying the time it was produced in its text. Measured per level, over a window:
- from a final's (and a partial's) release to its arrival at a stream client, and to the DOM of call pages open
  in Chromium (``/live/{call}``, its own script putting the turn in) (the desk's share of a turn's way to the
  screen; the worker's share, from speech to release, is `callqa bench live`'s, and `bench live --desk` times
  spoken words to the stream end to end);
- Chromium with the wall open on all N calls: its script and task time per second (Performance metrics over
  CDP) and the rows it shows: the page staying responsive;
- the desk's CPU per call in progress.
Goals: 200 calls on one wall responsive; final release to browser P99 <= 300 ms at 100 calls (judged in the
pages where Chromium ran).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Producer
from rich.console import Console

from pipeline.bench import probes
from pipeline.bench.desk import TurnStream, start_desk
from pipeline.bench.results import RESULTS, record, run_folder, write_result
from pipeline.broker.local import LocalKafka, free_port
from pipeline.broker.security import ClientErrors, admin_client
from pipeline.broker.topics import drop_topics, ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import LiveCall, QaAlert, TranscriptSegment

GOALS = {"final_p99_ms_at_100": 300.0}
CHROMIUM_PATHS = ("chromium-headless-shell", "/usr/lib/chromium/chromium-headless-shell")


@dataclass(frozen=True)
class LiveDeskOptions:
    calls: tuple[int, ...] = (100, 200)
    window_s: float = 30.0
    warmup_s: float = 8.0
    browser: bool = True
    pages: int = 20  # call pages open in Chromium beside the wall, timing each turn into the page
    out: Path = RESULTS


@dataclass
class Traffic:
    """Messages of ``calls`` calls in progress, as workers publish them, until stopped."""

    settings: Settings
    calls: int
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        s, serde = self.settings, Serde.from_settings()
        producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5})
        started = int(time.time() * 1000)
        ids = [f"desk-{i:04d}" for i in range(self.calls)]
        rng = random.Random(7)
        offsets = {c: rng.random() for c in ids}  # spread each call's second
        tick = 0
        while not self.stop.is_set():
            now = int(time.time() * 1000)
            for c in ids:
                phase = (tick / 10 + offsets[c]) % 4.0  # 4 s per turn
                call_ms = now - started
                if abs(phase % 1.0) < 0.1:  # once a second: summary and a partial
                    scores = [round(rng.uniform(-4, 4), 2) for _ in range(6)]
                    producer.produce(s.topic_live_calls, key=c.encode(), value=serde.encode(LiveCall(
                        c, started, now, tenant="acme", agent_id=f"agent-{hash(c) % 40}", queue="billing",
                        call_ms=call_ms, turns=call_ms // 4000, customer_sentiment=scores[-1], customer_scores=scores,
                        alerts=call_ms // 60000)))
                    leg = "agent" if (call_ms // 4000) % 2 else "customer"
                    start = call_ms // 4000 * 4000
                    kind = "final" if phase < 0.1 else "partial"
                    producer.produce(s.topic_transcripts, key=c.encode(), value=serde.encode(TranscriptSegment(
                        f"{c}/{leg}/{start}", c, leg, start, call_ms, f"{kind} {now} words so far", kind == "final",  # type: ignore[arg-type]
                        0.9, -0.1, 0.0, "synthetic", 1, produced_at_ms=now)))
                    if kind == "final" and rng.random() < 0.02:
                        producer.produce(s.topic_qa, key=c.encode(), value=serde.encode(QaAlert(
                            c, "escalation_request", "intent", "customer", "detect", call_ms, "speak to a manager")))
            producer.poll(0)
            tick += 1
            self.stop.wait(max(0.0, started / 1000 + tick / 10 - time.time()))
        producer.flush(10)


class TurnDelays:
    """Each turn's delay from its release (the time in its text) to its arrival at a stream client."""

    def __init__(self) -> None:
        self.delays: dict[str, list[float]] = {"final": [], "partial": []}
        self.measuring = False

    def __call__(self, turn: dict[str, Any], received_s: float) -> None:
        if self.measuring:
            kind, sent = turn["text"].split()[:2]
            self.delays[kind].append(received_s * 1000 - int(sent))


class Wall:
    """Chromium with the wall open (the operator's token on every request), its CDP Performance metrics."""

    def __init__(self, port: int, token: str) -> None:
        from playwright.sync_api import sync_playwright

        chromium = next((p for p in (shutil.which(c) or c for c in CHROMIUM_PATHS) if Path(p).is_file()), None)
        if chromium is None:
            raise RuntimeError("chromium-headless-shell is not installed: `make system` installs it")
        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = self.browser.new_context(extra_http_headers={"Authorization": f"Bearer {token}"})
        self.page = context.new_page()
        self.cdp = context.new_cdp_session(self.page)
        self.cdp.send("Performance.enable")
        self.page.goto(f"http://127.0.0.1:{port}/live")

    def metrics(self) -> dict[str, float]:
        return {m["name"]: m["value"] for m in self.cdp.send("Performance.getMetrics")["metrics"]}

    def rows(self) -> int:
        return int(self.page.locator("#live-calls tr").count())

    def close(self) -> None:
        self.browser.close()
        self._playwright.stop()


# Stamps each turn the page's own script puts into #turns (a new one, or a partial replaced by its final) with
# the wall clock at that DOM change. Injected by the browser (CSP bypassed for the measurement alone: the
# pages' policy allows only their hashed script); the page and its script are the ones supervisors get.
TURN_STAMPS = """
window.__shown = [];
document.addEventListener("DOMContentLoaded", () => {
  const turns = document.getElementById("turns");
  if (!turns) return;
  new MutationObserver(records => {
    const now = Date.now();
    for (const r of records) for (const n of r.addedNodes) {
      const text = n.querySelector && n.querySelector(".text");
      if (text) window.__shown.push([now, text.textContent]);
    }
  }).observe(turns, {childList: true});
});
"""


class CallPages:
    """Chromium with the live pages of some calls open (``/live/{call}``): when each turn reached the page."""

    def __init__(self, wall: Wall, port: int, token: str, call_ids: list[str]) -> None:
        self.pages = []
        for call_id in call_ids:
            # A context each, as each supervisor has a browser of their own: one profile holds at most 6
            # HTTP/1.1 connections to a host, and each open page keeps one for its event stream.
            context = wall.browser.new_context(extra_http_headers={"Authorization": f"Bearer {token}"},
                                               bypass_csp=True)
            context.add_init_script(TURN_STAMPS)
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{port}/live/{call_id}")
            self.pages.append(page)

    def take(self) -> dict[str, list[float]]:
        """The delays (ms) from each turn's release (the time in its text) to its page, since the last take."""
        delays: dict[str, list[float]] = {"final": [], "partial": []}
        for page in self.pages:
            for at, text in page.evaluate("window.__shown.splice(0)"):
                kind, sent = text.split()[:2]
                delays[kind].append(at - int(sent))
        return delays


def _level(settings: Settings, calls: int, desk: subprocess.Popen[bytes], port: int, token: str,
           options: LiveDeskOptions, console: Console) -> dict[str, Any]:
    traffic = Traffic(settings, calls)
    sender = threading.Thread(target=traffic.run, daemon=True)
    client = TurnDelays()
    stream = TurnStream(port, token, client)
    stream.start()
    sender.start()
    wall = Wall(port, token) if options.browser else None
    pages = CallPages(wall, port, token, [f"desk-{i:04d}" for i in range(min(calls, options.pages))]) if wall else None
    try:
        time.sleep(options.warmup_s)
        before_cpu, before = probes.cpu_snapshot(desk.pid).process_s, time.monotonic()
        metrics_before = wall.metrics() if wall else {}
        if pages is not None:
            pages.take()  # the warm-up's
        client.measuring = True
        time.sleep(options.window_s)
        client.measuring = False
        elapsed = time.monotonic() - before
        cpu = probes.cpu_snapshot(desk.pid).process_s - before_cpu
        metrics_after = wall.metrics() if wall else {}
        rows = wall.rows() if wall else None
        in_browser = pages.take() if pages else None
    finally:
        traffic.stop.set()
        sender.join(30)
        stream.stopped.set()
        if wall is not None:
            wall.close()
    finals, partials = client.delays["final"], client.delays["partial"]
    level: dict[str, Any] = {
        "calls": calls, "window_s": round(elapsed, 1), "finals_seen": len(finals), "partials_seen": len(partials),
        "final_p50_ms": round(float(np.percentile(finals, 50)), 1) if finals else None,
        "final_p99_ms": round(float(np.percentile(finals, 99)), 1) if finals else None,
        "partial_p99_ms": round(float(np.percentile(partials, 99)), 1) if partials else None,
        "desk_cpu_core": round(cpu / elapsed, 3), "desk_cpu_ms_per_call_s": round(1000 * cpu / elapsed / calls, 3),
        "wall_rows": rows,
    }
    if in_browser is not None:
        shown = in_browser["final"]
        level["browser_pages"] = len(pages.pages) if pages else 0
        level["browser_finals_seen"] = len(shown)
        level["browser_final_p50_ms"] = round(float(np.percentile(shown, 50)), 1) if shown else None
        level["browser_final_p99_ms"] = round(float(np.percentile(shown, 99)), 1) if shown else None
    if wall is not None:
        span = elapsed
        level["browser_script_ms_per_s"] = round(1000 * (metrics_after["ScriptDuration"]
                                                         - metrics_before["ScriptDuration"]) / span, 1)
        level["browser_task_ms_per_s"] = round(1000 * (metrics_after["TaskDuration"]
                                                       - metrics_before["TaskDuration"]) / span, 1)
    console.print(f"  {calls} calls: final P99 {level['final_p99_ms']} ms to the stream, "
                  f"{level.get('browser_final_p99_ms')} ms into the pages, desk {level['desk_cpu_core']} core, "
                  f"wall rows {rows}, script {level.get('browser_script_ms_per_s')} ms/s")
    return level


def run_live_desk(options: LiveDeskOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    base = Settings()
    LocalKafka(base).start()
    prefix = f"bench.desk{uuid.uuid4().hex[:8]}"
    topics = {name: f"{prefix}.{name.removeprefix('topic_')}" for name in Settings.model_fields
              if name.startswith("topic_")}
    settings = Settings(**topics)  # type: ignore[arg-type]
    ensure_topics(settings)
    work = run_folder("live-desk")
    work.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "CALLQA_API_TOKEN": token, "CALLQA_BOOTSTRAP_SERVERS": settings.bootstrap,
           "CALLQA_CLICKHOUSE_URL": f"chdb://{(work / 'chdb').resolve()}", "CALLQA_STATE_DIR": str(work / "state"),
           **{f"CALLQA_{k.upper()}": v for k, v in topics.items()}}
    port = free_port()
    levels = []
    desk = start_desk(env, port, work / "desk.log")
    try:
        for calls in options.calls:
            console.print(f"[bold]{calls} calls in progress[/bold] ({options.window_s:.0f} s window)")
            levels.append(_level(settings, calls, desk, port, token, options, console))
    finally:
        desk.send_signal(signal.SIGTERM)
        desk.wait(30)
        drop_topics(admin_client(settings, ClientErrors(settings)), prefix)
    at_100 = next((lv for lv in levels if lv["calls"] == 100), None)
    # Judged in the browser where it was open; the stream client's figure otherwise.
    judged = None if at_100 is None else at_100.get("browser_final_p99_ms") or at_100["final_p99_ms"]
    met = judged is not None and judged <= GOALS["final_p99_ms_at_100"]
    figures = {"levels": levels, "goals": GOALS, "met": met,
               "note": "release to a stream client, and to the DOM of the call pages open in Chromium beside the "
                       "wall on all calls"}
    doc = record("live-desk", {"window_s": options.window_s, "live_heartbeat_s": base.live_heartbeat_s}, figures)
    return doc, write_result("live-desk", doc, options.out)
