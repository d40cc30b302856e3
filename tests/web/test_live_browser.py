"""The live desk in a real browser (Debian's chromium-headless-shell through Playwright), as a supervisor uses it:
a library call replayed in real time to a real worker; the supervisor's wall, open before the call started,
shows it without a reload; its page shows its turns and the escalation alert, highlighted, before the call has
ended, and the alert's webhook arrives signed; another tenant's supervisor sees none of it; when the call ends
it leaves the wall and its page links to the finished call. CALLQA_DOCS_SCREENSHOT=1 writes the wall's
screenshot to docs/live-wall.png for the README."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from tests.conftest import drop_topics
from tests.notify.test_webhooks import Receiver

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CALL = LIBRARY_DIR / "07_escalation_manager.wav"  # 60 s; the customer asks for a manager at about 15 s
SECRET = "w" * 32  # noqa: S105 - a test key


def _log_in(context: Any, base: str, name: str) -> Any:
    page = context.new_page()
    page.goto(f"{base}/live")  # not logged in: the login page, back to /live after
    page.fill("#name", name)
    page.fill("#password", f"{name} long password")
    page.click("form.login:has(#name) button[type=submit]")
    page.wait_for_url(f"{base}/live")
    return page


def test_a_supervisor_watches_a_call_live_and_gets_its_alert(broker: str, tmp_path: Path, browser: Any) -> None:
    prefix = f"test.live{uuid.uuid4().hex[:10]}"
    topics = {name: f"{prefix}.{name.removeprefix('topic_')}" for name in Settings.model_fields
              if name.startswith("topic_")}
    settings = Settings(bootstrap_servers=broker, worker_id=f"{prefix}.worker", **topics)  # type: ignore[arg-type]
    ensure_topics(settings)
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "rules", rules)
    intent = (rules / "intent.yaml").read_text()
    (rules / "intent.yaml").write_text(intent.replace("  - name: escalation_request\n",
                                                      "  - name: escalation_request\n    notify: [supervisors]\n", 1))
    receiver = Receiver()
    port = free_port()
    env = worker_env({"bootstrap_servers": broker, "worker_id": settings.worker_id, **topics,
                      "state_dir": str(tmp_path / "state"), "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}",
                      "web_port": str(port), "web_host": "127.0.0.1", "commit_interval_s": "1.0",
                      "model_watch_interval_s": "0", "recordings": "false", "rules_dir": str(rules),
                      "qa_scorecard_file": str(rules / "scorecards" / "default.yaml"),
                      "webhooks": json.dumps({"supervisors": receiver.url}), "webhook_secret": SECRET,
                      "desk_url": f"http://127.0.0.1:{port}"})
    worker = WorkerProcess(env, port, tmp_path / "worker.log")
    worker.start()
    try:
        for name, tenant in (("sue", "acme"), ("gil", "globex")):
            worker.api().send("POST", "/api/users", {"name": name, "role": "supervisor", "tenant": tenant,
                                                      "password": f"{name} long password"})
        sue_context, gil_context = browser.new_context(), browser.new_context()
        wall = _log_in(sue_context, worker.base_url, "sue")
        other = _log_in(gil_context, worker.base_url, "gil")
        errors: list[str] = []
        wall.on("console", lambda m: m.type == "error" and errors.append(m.text))
        wall.on("pageerror", lambda e: errors.append(str(e)))

        options = ReplayOptions(encoding="mulaw", frame_ms=200, realtime=True, tenant="acme", call_id_prefix="wall")
        player = TelephonyReplay(ContractProducer(broker, Serde.from_settings()), settings.topic_audio,
                                 settings.topic_call_events)
        sender = threading.Thread(target=player.run, args=([load_recording(CALL, options)], options), daemon=True)
        sender.start()

        # The wall, loaded before the call began, shows it without a reload.
        row = wall.wait_for_selector("#live-calls tr[data-call]", timeout=90_000)
        call_id = row.get_attribute("data-call")
        assert call_id and call_id.startswith("wall")
        # Its page: turns before the call has ended, then the escalation alert, highlighted.
        page = sue_context.new_page()
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{worker.base_url}/live/{call_id}")
        page.wait_for_selector("#turns .turn", timeout=60_000)
        page.wait_for_selector("#alerts li:has-text('escalation_request')", timeout=60_000)
        alerts = page.locator("#alerts li")
        assert page.locator("#alerts li.fired").count() == 1  # the newest alert stands out, only it
        assert "fired" in (alerts.nth(alerts.count() - 1).get_attribute("class") or "")
        assert sender.is_alive(), "the call ended before its page showed its turns and alert"
        turns = page.locator("#turns .turn .text").all_text_contents()
        assert len(turns) >= 2 and all(t.strip() for t in turns)
        wall.wait_for_selector(f'#live-calls tr.newest[data-call="{call_id}"]', timeout=30_000)
        if os.environ.get("CALLQA_DOCS_SCREENSHOT"):
            wall.screenshot(path=str(REPO / "docs" / "live-wall.png"), full_page=True)
        # The alert's webhook, signed (checked here with the key, over the raw body).
        [(headers, body)] = receiver.wait(1, timeout_s=60)
        t, v1 = (part.split("=", 1)[1] for part in headers["x-callqa-signature"].split(","))
        assert hmac.compare_digest(v1, hmac.new(SECRET.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest())
        sent = json.loads(body)
        assert (sent["call_id"], sent["rule"]) == (call_id, "escalation_request")
        assert sent["live_url"] == f"{worker.base_url}/live/{call_id}"
        # Another tenant's supervisor: nothing on the wall, and the call's page is not there for them.
        assert other.locator("#live-calls tr").count() == 0
        assert other.goto(f"{worker.base_url}/live/{call_id}").status == 404

        sender.join(120)
        page.wait_for_selector("#ended:not([hidden])", timeout=180_000)
        assert page.get_attribute("#ended a", "href") == f"/calls/{call_id}"
        expect(wall.locator("#live-calls tr")).to_have_count(0, timeout=60_000)  # (the CSP forbids an eval'd wait)
        assert errors == []
        assert len(receiver.got) == 1  # once per alert
    finally:
        worker.stop()
        receiver.server.shutdown()
        drop_topics(broker, prefix)
