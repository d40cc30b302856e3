"""The call pages in a real browser (Debian's chromium-headless-shell, driven by Playwright over CDP), against
a real worker holding two calls of the call library, replayed through the real broker.

The worker starts as a newcomer starts one: bound to loopback, with no CALLQA_API_TOKEN. It makes its token
in <state_dir>/api-token; the test logs in with the token read from there, and `callqa report` (plain and
--html) runs with no token either, finding the file. Then, in the browser: /calls without the cookie lands
on /login, a wrong token is refused, the right one sets an HttpOnly SameSite=Strict cookie; each call page
loads with no console error, shows every stored final turn coloured by its sentiment, the timeline, the
scorecard's evidence links landing on their turns, and no PII span of the library's manifest; the static
pages `callqa report --html` writes load from file:// the same way. A screenshot of a call page is saved
(CALLQA_DOCS_SCREENSHOT=1 writes it to docs/call-page.png for the README).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pipeline.api.sessions import SESSION_COOKIE
from pipeline.api.token_file import read_token_file, token_path
from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR, find_leaks, holds_of, load_manifest
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.web.render import sentiment_class, static_file_name
from tests.conftest import drop_topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CALLS = ("02_card_payment", "05_rude_agent")  # a card payment (PII spans) and a rude agent (live alerts)
SCREENSHOT_CALL = "05_rude_agent"
# Sentiment colours of the turns (pipeline/web/templates/base.html), as the browser computes them.
BACKGROUND = {"sent-neg2": "rgb(244, 182, 182)", "sent-neg1": "rgb(251, 224, 224)", "sent-neu": "rgb(240, 241, 243)",
              "sent-pos1": "rgb(220, 241, 224)", "sent-pos2": "rgb(173, 224, 184)", "sent-none": "rgb(255, 255, 255)"}


@dataclass
class LibraryWorker:
    worker: WorkerProcess
    env: dict[str, str]  # the worker's environment: no CALLQA_API_TOKEN
    token: str  # read from the token file the worker made
    calls: dict[str, dict[str, Any]]  # call id -> its manifest entry

    @property
    def url(self) -> str:
        return self.worker.base_url


@pytest.fixture(scope="module")
def library_worker(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibraryWorker]:
    tmp = tmp_path_factory.mktemp("web")
    prefix = f"test.web{uuid.uuid4().hex[:10]}"
    topics = {"topic_audio": f"{prefix}.audio", "topic_call_events": f"{prefix}.events",
              "topic_transcripts": f"{prefix}.transcripts", "topic_latency": f"{prefix}.latency",
              "topic_qa": f"{prefix}.qa", "topic_dead_letters": f"{prefix}.dlq",
              "topic_checkpoints": f"{prefix}.checkpoints"}
    settings = Settings(bootstrap_servers=broker, worker_id=f"{prefix}.worker", **topics)
    ensure_topics(settings)
    port = free_port()
    env = worker_env({"bootstrap_servers": broker, "worker_id": settings.worker_id, **topics,
                      "state_dir": str(tmp / "state"), "clickhouse_url": f"chdb://{(tmp / 'chdb').resolve()}",
                      "web_port": str(port), "web_host": "127.0.0.1", "commit_interval_s": "1.0",
                      "model_watch_interval_s": "0"})
    env.pop("CALLQA_API_TOKEN")  # a newcomer's worker: no token configured
    worker = WorkerProcess(dict(env), port, tmp / "worker.log")
    worker.start()
    try:
        token = read_token_file(token_path(tmp / "state"))
        assert token is not None, "the loopback worker made no token file"
        worker.env["CALLQA_API_TOKEN"] = token  # for this test's own reads (WorkerProcess.query)
        manifest = {c["id"]: c for c in load_manifest()["calls"]}
        options = ReplayOptions(encoding="mulaw", frame_ms=20, call_id_prefix="web")
        recordings = []
        for name in CALLS:
            recording = load_recording(LIBRARY_DIR / manifest[name]["file"], options)
            recording.holds_ms = holds_of(manifest[name])
            recordings.append(recording)
        player = TelephonyReplay(ContractProducer(broker, Serde.from_settings()), settings.topic_audio,
                                 settings.topic_call_events)
        ids = player.run(recordings, replace(options, realtime=False)).call_ids
        worker.wait_for_calls(ids, timeout_s=300)
        yield LibraryWorker(worker, env, token, {i: manifest[n] for i, n in zip(ids, CALLS, strict=True)})
    finally:
        worker.stop()
        drop_topics(broker, prefix)


class Watched:
    """A page whose console errors, uncaught errors and failed requests are kept."""

    def __init__(self, context: Any) -> None:
        self.page = context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", self._request_failed)

    def _request_failed(self, request: Any) -> None:
        # A navigation the test starts while the last one is still loading cancels it (net::ERR_ABORTED):
        # the browser gave the request up, the server did not fail it. The pages have no script that could.
        failure = request.failure or ""
        if "ERR_ABORTED" not in failure:
            self.problems.append(f"request failed: {request.url} ({failure})")


def _log_in(page: Any, base: str, token: str) -> None:
    page.goto(f"{base}/calls")
    page.fill("#token", token)
    page.click("button[type=submit]")


def _stored_turns(lw: LibraryWorker, call_id: str) -> list[dict[str, Any]]:
    return lw.worker.query("SELECT * FROM segments FINAL WHERE call_id = {c:String} AND is_final = 1 "
                           "ORDER BY start_ms, leg, segment_id", c=call_id)


def test_the_local_default_needs_no_token_setting(library_worker: LibraryWorker, tmp_path: Path) -> None:
    """`callqa report` next to a loopback worker with no CALLQA_API_TOKEN: it reads the worker's token file."""
    env = {k: v for k, v in library_worker.env.items() if k != "CALLQA_API_TOKEN"}
    state = Path(env["CALLQA_STATE_DIR"])
    assert (token_path(state).stat().st_mode & 0o777) == 0o600
    report = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--json"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    assert set(library_worker.calls) <= {c["call_id"] for c in json.loads(report.stdout)["calls"]}
    written = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--html", str(tmp_path / "site")],
                             env=env, capture_output=True, text=True, timeout=300, check=False)
    assert written.returncode == 0, written.stderr
    assert str((tmp_path / "site" / "index.html").resolve()) in " ".join(written.stdout.split())
    for call_id in library_worker.calls:
        assert (tmp_path / "site" / "calls" / static_file_name(call_id)).is_file()


def test_login_flow(library_worker: LibraryWorker, browser: Any) -> None:
    context = browser.new_context()
    watched = Watched(context)
    page = watched.page
    page.goto(f"{library_worker.url}/calls")
    assert page.url == f"{library_worker.url}/login?next=%2Fcalls"  # no cookie: the login form
    page.fill("#token", "not-the-token-but-long-enough")
    page.click("button[type=submit]")
    assert page.inner_text("#login-error") == "wrong token"
    assert context.cookies() == []
    page.fill("#token", library_worker.token)
    page.click("button[type=submit]")
    assert page.url == f"{library_worker.url}/calls"
    (cookie,) = context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (SESSION_COOKIE, True, "Strict")
    assert library_worker.token not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
    listed = page.locator("#calls tbody a[href^='/calls/']").all_inner_texts()
    assert sorted(listed) == sorted(library_worker.calls)
    page.click("text=Log out")
    page.wait_for_load_state()
    assert page.url.startswith(f"{library_worker.url}/login")
    page.goto(f"{library_worker.url}/calls")
    assert page.url.startswith(f"{library_worker.url}/login?next=")
    # Expected failures: the wrong token's 401 answer is logged by the browser as a failed resource.
    assert [p for p in watched.problems if "401" not in p] == []
    context.close()


def _check_call_page(lw: LibraryWorker, page: Any, call_id: str) -> None:
    stored = _stored_turns(lw, call_id)
    turns = page.locator("#transcript .turn")
    assert turns.count() == len(stored) > 0
    assert page.locator("#transcript .turn .text").all_inner_texts() == [t["text"] for t in stored]
    classes = [c.split() for c in turns.evaluate_all("els => els.map(e => e.className)")]
    colours = turns.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    for turn, cls, colour in zip(stored, classes, colours, strict=True):
        score = turn.get("sentiment")
        expected = sentiment_class(None if score is None or all(not t.get("sentiment") for t in stored) else score)
        assert expected in cls and colour == BACKGROUND[expected], (turn["text"], cls, colour)
    timeline = page.locator("svg#timeline")
    assert timeline.is_visible() and timeline.bounding_box()["width"] > 600
    for leg in ("agent", "customer"):
        assert page.locator(f"svg#timeline rect[data-kind={leg}]").count() == sum(t["leg"] == leg for t in stored)
    # PII: not in the free text (4 digits of a card are a leak), nor anywhere on the page (8 digits).
    spans = lw.calls[call_id]["pii"]
    texts = [(f"{call_id} turn", t) for t in page.locator("#transcript .text").all_inner_texts()]
    texts += [(f"{call_id} scorecard", t) for t in page.locator("#scorecard td").all_inner_texts()]
    texts += [(f"{call_id} alert", t) for t in page.locator("#alerts td").all_inner_texts()]
    assert find_leaks(call_id, spans, texts, in_text=True) == []
    assert find_leaks(call_id, spans, [(f"{call_id} page", page.inner_text("body"))], in_text=False) == []


def test_call_pages_show_every_turn_sentiment_timeline_and_no_pii(library_worker: LibraryWorker, browser: Any,
                                                                  tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 1200, "height": 1500})
    watched = Watched(context)
    page = watched.page
    _log_in(page, library_worker.url, library_worker.token)
    for call_id in library_worker.calls:
        page.click(f"#calls a:text-is('{call_id}')")
        assert page.url == f"{library_worker.url}/calls/{call_id}"
        _check_call_page(library_worker, page, call_id)
        evidence = page.locator("a.evidence")
        if evidence.count():
            anchor = evidence.first.get_attribute("href")
            evidence.first.click()
            assert page.evaluate("location.hash") == anchor
            assert page.locator(f"{anchor}:target").count() == 1
        if library_worker.calls[call_id]["id"] == SCREENSHOT_CALL:
            alerts = page.locator("#alerts tbody tr").count()
            assert alerts >= 1 and page.locator("svg#timeline .alert-mark").count() == alerts
            page.goto(f"{library_worker.url}/calls/{call_id}")  # as it opens: no turn targeted, at the top
            shot = tmp_path / "call-page.png"
            page.screenshot(path=str(shot))
            if os.environ.get("CALLQA_DOCS_SCREENSHOT"):
                shutil.copyfile(shot, REPO / "docs" / "call-page.png")
        page.goto(f"{library_worker.url}/calls")
    assert watched.problems == []
    context.close()


def test_static_pages_load_from_files(library_worker: LibraryWorker, browser: Any, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--html", str(tmp_path)],
                          env=library_worker.worker.env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    context = browser.new_context()
    watched = Watched(context)
    page = watched.page
    page.goto((tmp_path / "index.html").as_uri())
    assert page.locator("form").count() == 0
    for call_id in library_worker.calls:
        page.click(f"#calls a:text-is('{call_id}')")
        assert page.url == (tmp_path / "calls" / static_file_name(call_id)).as_uri()
        _check_call_page(library_worker, page, call_id)
        page.click("text=← all calls")
        assert page.url == (tmp_path / "index.html").as_uri()
    assert watched.problems == []
    context.close()


def test_search_open_overturn_and_see_it_in_the_score_calibration_and_trend(library_worker: LibraryWorker,
                                                                             browser: Any) -> None:
    """The QA desk's loop in a browser: search a phrase the rude agent said, open the call, overturn its
    prohibited-language verdict, and the call's score, the calibration page and the agent's trend show it."""
    lw = library_worker
    rude = next(c for c, entry in lw.calls.items() if entry["id"] == "05_rude_agent")
    said = [t["text"] for t in _stored_turns(lw, rude) if t["leg"] == "agent"]
    turn = next((t for t in said if "problem" in t.lower()), max(said, key=len))
    phrase = " ".join(turn.split()[:3])  # what ASR stored, whatever it made of the script
    [qa] = lw.worker.query("SELECT agent_id, score_pct FROM call_qa_deduped WHERE call_id = {c:String}", c=rude)
    context = browser.new_context(viewport={"width": 1200, "height": 1500})
    watched = Watched(context)
    page = watched.page
    _log_in(page, lw.url, lw.token)
    page.fill("#q", phrase)
    page.select_option("select[name=leg]", "agent")
    page.click("form.filters button[type=submit]")
    assert rude in page.locator("#calls tbody a[href^='/calls/']").all_inner_texts()
    assert page.locator("tr.hits mark").count() >= 1
    page.click(f"#calls a:text-is('{rude}')")
    page.select_option("#review select[name=item]", "prohibited_language")
    page.select_option("#review select[name=verdict]", "pass")
    page.fill("#review input[name=reason]", "quoting the customer's words back")
    page.fill("#review input[name=reviewer]", "dana")
    page.click("#review button[type=submit]")
    assert page.url == f"{lw.url}/calls/{rude}#scorecard"
    [after] = lw.worker.query("SELECT score_pct, automatic_score_pct FROM call_qa_deduped WHERE call_id = {c:String}",
                              c=rude)
    assert after["automatic_score_pct"] == pytest.approx(qa["score_pct"], abs=0.01)
    assert page.inner_text("#score") == f"{after['score_pct']:.0f} %"
    assert f"reviewed by dana; automatic {qa['score_pct']:.0f} %" in page.inner_text("#reviewed")
    page.click("header a:text-is('calibration')")
    row = page.locator("#calibration tbody tr").filter(has_text="prohibited language")
    assert row.locator("td").nth(1).inner_text() == "1" and "100 %" in row.locator("td").nth(2).inner_text()
    page.goto(f"{lw.url}/agents/{qa['agent_id']}")
    [mean] = lw.worker.query("SELECT avg(score_pct) AS s FROM call_qa_deduped WHERE agent_id = {a:String}",
                             a=qa["agent_id"])
    last_week = page.locator("#weeks tbody tr").last.locator("td").nth(2).inner_text()
    assert last_week.startswith(f"{mean['s']:.0f} %")
    assert watched.problems == []
    context.close()
