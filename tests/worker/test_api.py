"""The worker's /api/*: bearer token (missing, wrong, right) on a real worker process, auth off refused
off loopback, no token configured answered 503, the API's own bounded thread pool, and many requests at
once answered right, each pool thread on a store client of its own."""

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web as aioweb
from aiohttp.test_utils import TestClient, TestServer
from clickhouse_connect.driver.exceptions import OperationalError

from pipeline.api.auth import ApiAuth, ApiConfigError, auth_middleware, check_api_settings, is_loopback
from pipeline.api.pool import ApiBusyError, QueryPool, ThreadClients
from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.config import Settings

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
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT hostName(), version()")
    assert (status, body) == (403, {"error": "function version() is not allowed in the query API"})
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT count() FROM calls WHERE audio_ms IN numbers(10)")
    assert (status, body) == (403, {"error": "table function numbers() is not allowed on the right of IN: read the "
                                             "callqa tables by name"})
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT length(randomString(1e9))")
    assert (status, body) == (403, {"error": "function randomString() is not allowed in the query API"})
    status, body, _ = _get(worker, "/api/query", TOKEN, sql="SELECT length(repeat('x', 1e9))")
    assert (status, body) == (403, {"error": "repeat(): argument 2 is 1,000,000,000; the query API allows at most "
                                             "1,000,000"})
    assert _get(worker, "/router/")[0] == 404  # faust's own pages are not served
    assert _get(worker, "/api/calls", TOKEN, limit="0")[0] == 400
    # Each refusal counted by why, on the worker's /metrics.
    refusals = {reason: worker.metric("callqa_api_refusals_total", reason=reason)
                for reason in ("unauthorized", "query_refused", "bad_request")}
    assert refusals == {"unauthorized": 6, "query_refused": 7, "bad_request": 1}


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


CALLS = 12
_FILL = """
import sys
from datetime import UTC, datetime, timedelta
from pipeline.config import get_settings
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
database = get_settings().clickhouse_database
client = connect(None, database)
migrate(client, database)
t0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
calls, segments = [], []
for i in range(int(sys.argv[1])):
    cid = f"c{i:02d}"
    calls.append([cid, "acme", "agent-a" if i % 2 else "agent-b", "billing", "inbound", ["agent", "customer"],
                  t0 + timedelta(minutes=i), t0 + timedelta(minutes=i, seconds=30), "end", i + 1, 30_000, t0])
    segments += [[f"{cid}:agent:{j}", cid, "agent", j * 1000, j * 1000 + 900, f"{cid} line {j}", 0.9, -0.1, 0.01,
                  1, "whisper", 1, 0, t0] for j in range(i + 1)]
client.insert("calls", calls, column_names=["call_id", "tenant", "agent_id", "queue", "direction", "legs",
                                            "started_at", "ended_at", "end_reason", "segments", "audio_ms",
                                            "updated_at"])
client.insert("segments", segments, column_names=["segment_id", "call_id", "leg", "start_ms", "end_ms", "text",
                                                  "confidence", "avg_logprob", "no_speech_prob", "is_final",
                                                  "model_name", "model_version", "redactions", "produced_at"])
"""


def _filled_store(folder: Path) -> str:
    """An embedded store holding calls c00..c11, call i with i+1 final segments and agent-a for odd i;
    written by a child process, as chdb opens a folder from one process only."""
    url = f"chdb://{folder.resolve()}"
    done = subprocess.run([sys.executable, "-c", _FILL, str(CALLS)], env=worker_env({"clickhouse_url": url}),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return url


def _expected(path: str, query: dict[str, str], body: Any) -> None:
    """Assert ``body`` is what the filled store holds for this request."""
    if path == "/api/calls":
        agent = query.get("agent")
        ids = [f"c{i:02d}" for i in reversed(range(CALLS)) if agent is None or (agent == "agent-a") == (i % 2 == 1)]
        assert [c["call_id"] for c in body] == ids
        assert [c["final_segments"] for c in body] == [int(i[1:]) + 1 for i in ids]
    elif path.startswith("/api/calls/"):
        call_id = path.rsplit("/", 1)[1]
        n = int(call_id[1:]) + 1
        assert (body["summary"]["call_id"], body["summary"]["final_segments"]) == (call_id, n)
        assert [line["text"] for line in body["transcript"]] == [f"{call_id} line {j}" for j in range(n)]
    else:
        call_id = query["param_c"]
        n = int(call_id[1:]) + 1
        assert body["rows"] == [[n, sum(len(f"{call_id} line {j}") for j in range(n))]]


def test_many_requests_at_once_each_get_their_own_answer(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """96 requests from 16 threads at once on the API's 4 threads, on the real worker and its chdb store:
    every answer is the one of its own request (another request's rows, an error or an empty answer
    would show), whichever pool thread and client ran it."""
    url = _filled_store(tmp_path / "filled")
    # One source sending 16 at once: the per-source bound (api_source_max_concurrent) is not what this tests.
    worker = start_worker(api_token=TOKEN, clickhouse_url=url, api_query_threads="4", api_query_max_waiting="96",
                          api_source_max_concurrent="0")
    sql = ("SELECT count() AS n, sum(length(text)) AS chars FROM segments FINAL "
           "WHERE call_id = {c:String} AND is_final = 1")
    requests: list[tuple[str, dict[str, str]]] = []
    for i in range(96):
        call_id = f"c{i % CALLS:02d}"
        requests.append([("/api/calls", {}), ("/api/calls", {"agent": "agent-a"}), (f"/api/calls/{call_id}", {}),
                         ("/api/query", {"sql": sql, "param_c": call_id})][i % 4])
    with ThreadPoolExecutor(16) as senders:
        answers = list(senders.map(lambda r: _get(worker, r[0], TOKEN, **r[1]), requests))
    for (path, query), (status, body, _) in zip(requests, answers, strict=True):
        assert status == 200, (path, body)
        _expected(path, query, body)


class _Client:
    """Stands in for a store client: ThreadClients only opens, hands out and closes them."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_each_pool_thread_reads_through_a_client_of_its_own() -> None:
    opened: list[_Client] = []

    def factory() -> Any:
        opened.append(_Client())
        return opened[-1]

    clients = ThreadClients(factory)
    pool = QueryPool(threads=3, max_waiting=10)
    pool.on_shutdown(clients.close)
    together = threading.Barrier(3, timeout=30)

    def use() -> tuple[int, int]:
        with clients.client() as client:
            together.wait()  # the three pool threads hold their clients at the same time
            return threading.get_ident(), id(client)

    first = await asyncio.gather(*(pool.run(use) for _ in range(3)))
    second = await asyncio.gather(*(pool.run(use) for _ in range(3)))
    assert len({thread for thread, _ in first}) == 3 and len({client for _, client in first}) == 3
    assert dict(first) == dict(second) and len(opened) == 3  # a thread keeps its client
    pool.shutdown()
    assert all(c.closed for c in opened)


async def test_a_client_whose_connection_failed_is_replaced() -> None:
    opened: list[_Client] = []

    def factory() -> Any:
        opened.append(_Client())
        return opened[-1]

    clients = ThreadClients(factory)
    pool = QueryPool(threads=1, max_waiting=1)

    def fail() -> None:
        with clients.client():
            raise OperationalError("connection refused")

    def use() -> int:
        with clients.client() as client:
            return id(client)

    try:
        with pytest.raises(OperationalError):
            await pool.run(fail)
        assert opened[0].closed
        assert await pool.run(use) == id(opened[1]) and not opened[1].closed
    finally:
        pool.shutdown()
