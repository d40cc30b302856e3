"""The worker's /api/*: bearer token (missing, wrong, right) on a real worker process, auth off refused
off loopback, no token configured answered 503, and the API's own bounded thread pool."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web as aioweb
from aiohttp.test_utils import TestClient, TestServer

from pipeline.config import Settings
from pipeline.worker.api import (
    ApiAuth,
    ApiBusyError,
    ApiConfigError,
    QueryPool,
    auth_middleware,
    check_api_settings,
    is_loopback,
)
from pipeline.worker.process import WorkerProcess

TOKEN = "t" * 40  # noqa: S105 - a test token


def _get(worker: WorkerProcess, path: str, token: str | None = None, **query: str) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of GET path, with ``Authorization: Bearer token`` when given."""
    url = f"{worker.base_url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.startswith(b"{") else body.decode(), exc.headers


def test_api_needs_the_token_and_refuses_reads_outside_the_project_tables(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    worker = start_worker(api_token=TOKEN)
    assert "callqa_" in worker.metrics_text()  # /metrics stays open for Prometheus
    for path in ("/api/query", "/api/calls", "/api/calls/c1", "/api/no-such-view"):
        status, body, headers = _get(worker, path, sql="SELECT 1")
        assert (status, body["error"]) == (401, "missing bearer token: send 'Authorization: Bearer <CALLQA_API_TOKEN>'")
        assert headers["WWW-Authenticate"] == "Bearer"
    assert _get(worker, "/api/query", "x" * 40, sql="SELECT 1")[:2] == (401, {"error": "wrong bearer token"})
    assert _get(worker, "/api/query", TOKEN[:-1], sql="SELECT 1")[0] == 401  # a prefix is not the token

    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT count() AS n FROM calls WHERE call_id = {c:String}",
                           param_c="nope")
    assert (status, body["columns"], body["rows"], body["truncated"]) == (200, ["n"], [[0]], False)
    assert _get(worker, "/api/calls", TOKEN)[:2] == (200, [])
    assert worker.query("SELECT count() AS n FROM segments_deduped") == [{"n": 0}]  # WorkerProcess sends it

    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT file('/etc/hostname')")
    assert (status, body) == (403, {"error": "function file() is not allowed in the query API"})
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT name FROM system.tables")
    assert (status, body) == (403, {"error": "database system is not allowed: only callqa"})
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT 1; DROP TABLE calls")
    assert status == 403 and "only one statement" in body["error"]
    assert _get(worker, "/router/")[0] == 404  # faust's own pages are not served


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"CALLQA_API_AUTH": "off", "CALLQA_WEB_HOST": "0.0.0.0"},
         "CALLQA_API_AUTH=off is only allowed with a loopback CALLQA_WEB_HOST, not '0.0.0.0'"),
        ({"CALLQA_API_TOKEN": "short", "CALLQA_WEB_HOST": "127.0.0.1"}, "CALLQA_API_TOKEN has 5 characters"),
    ],
)
@pytest.mark.slow
def test_worker_refuses_to_start_with_an_exposed_api(env: dict[str, str], refusal: str) -> None:
    """Checked before the worker touches Kafka or the store: no broker is needed for this."""
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "worker"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and refusal in lines[0], proc.stderr


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True),
                                                 ("localhost", True), ("0.0.0.0", False), ("::", False),
                                                 ("", False), ("10.1.2.3", False), ("worker.example", False)])
def test_only_loopback_binds_may_turn_auth_off(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    settings = Settings(api_auth="off", web_host=host)
    if loopback:
        check_api_settings(settings)
    else:
        with pytest.raises(ApiConfigError, match="CALLQA_API_AUTH=off is only allowed"):
            check_api_settings(settings)


async def test_without_a_token_api_answers_503_and_metrics_stay_open() -> None:
    """The middleware on a real aiohttp server (the same one the worker installs)."""

    async def ok(request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response({"ok": True})

    web_app = aioweb.Application(middlewares=[auth_middleware(ApiAuth.from_settings(Settings(api_token="")))])
    web_app.router.add_get("/api/query", ok)
    web_app.router.add_get("/metrics", ok)
    async with TestClient(TestServer(web_app)) as client:
        refused = await client.get("/api/query")
        assert refused.status == 503
        assert (await refused.json())["error"] == "the API has no token configured: set CALLQA_API_TOKEN on the worker"
        assert (await client.get("/metrics")).status == 200
        assert (await client.get("/api/no-such-view")).status == 503  # unmatched /api paths too
    off = ApiAuth.from_settings(Settings(api_auth="off"))
    assert off.refusal(None) is None


def test_token_check_accepts_only_the_token() -> None:
    auth = ApiAuth.from_settings(Settings(api_token=TOKEN))
    assert auth.refusal(f"Bearer {TOKEN}") is None
    assert auth.refusal(f"bearer  {TOKEN} ") is None
    for header in (None, "", TOKEN, f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:20]}"):
        refused = auth.refusal(header)
        assert refused is not None and refused[0] == 401, header
    assert TOKEN not in repr(auth) and TOKEN not in repr(Settings(api_token=TOKEN).api_token)


async def test_the_query_pool_answers_busy_when_its_line_is_full() -> None:
    pool = QueryPool(threads=2, max_waiting=1)
    release = threading.Event()
    try:
        held = [asyncio.ensure_future(pool.run(release.wait, 30)) for _ in range(3)]  # 2 running, 1 waiting
        await asyncio.sleep(0)
        with pytest.raises(ApiBusyError, match=r"busy \(2 queries running, 1 waiting\)"):
            await pool.run(lambda: None)
        release.set()
        assert await asyncio.gather(*held) == [True, True, True]
        assert await pool.run(lambda: "after") == "after"  # the line drained
    finally:
        release.set()
        pool.shutdown()
