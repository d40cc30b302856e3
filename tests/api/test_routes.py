"""Deny by default: every route the worker serves is declared public or protected, and a route added without a
declaration still needs a principal."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer

import pipeline.worker.app as worker_app
from pipeline.api.auth import PUBLIC_PATHS, ApiAuth, auth_middleware, is_declared, is_public_route
from pipeline.config import Settings
from pipeline.store.client import connect

TOKEN = "r" * 40  # noqa: S105 - a test token


class _NoModel:
    """The transcriber's place in ``build_worker``: routes need no model."""

    engine = SimpleNamespace(open_front_end=lambda *args, **kwargs: None)
    batcher = SimpleNamespace(queued=0)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Any) -> _NoModel:
        return cls()


def test_every_route_of_the_worker_is_declared_public_or_protected(
    monkeypatch: pytest.MonkeyPatch, chdb_path: str, unique_name: str, tmp_path: Path
) -> None:
    monkeypatch.setattr(worker_app, "BatcherTranscriber", _NoModel)
    settings = Settings(api_token=TOKEN, clickhouse_url=f"chdb://{chdb_path}", clickhouse_database=unique_name,
                        state_dir=tmp_path, recordings=False, peer_watch=False, exactly_once=False)
    try:
        worker = worker_app.build_worker(settings)
        routes = {resource.canonical for resource in worker.app.web.web_app.router.resources()}
    finally:
        connect(f"chdb://{chdb_path}", unique_name).command(f"DROP DATABASE IF EXISTS {unique_name}")
    undeclared = sorted(r for r in routes if not is_declared(r))
    assert not undeclared, f"declare them public (auth.PUBLIC_PATHS) or under a protected root: {undeclared}"
    assert {r for r in routes if is_public_route(r)} == {"/login", "/logout", "/metrics", "/health"}
    assert "/calls/{call_id}/audio" in routes and "/api/users/{name}" in routes  # the list is the worker's


async def test_a_route_nobody_declared_needs_a_principal() -> None:
    auth = ApiAuth.from_settings(Settings(api_token=TOKEN))
    app = faust.App("routes-test", web_enabled=True, web_application_options={"middlewares": [auth_middleware(auth)]})

    @app.page("/reports")
    async def reports(web: Any, request: Any) -> Any:
        return web.json({"secret": 1})

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        return web.json({"open": 1})

    assert "/reports" not in PUBLIC_PATHS and not is_declared("/reports")
    async with TestClient(TestServer(app.web.web_app)) as client:
        refused = await client.get("/reports", allow_redirects=False)
        assert (refused.status, refused.headers["Location"]) == (303, "/login?next=%2Freports")
        allowed = await client.get("/reports", headers={"Authorization": f"Bearer {TOKEN}"})
        assert (allowed.status, await allowed.json()) == (200, {"secret": 1})
        assert (await client.get("/metrics")).status == 200  # declared public
        assert (await client.get("/no-such-page", allow_redirects=False)).status == 404  # nothing there to guard
        assert (await client.get("/api/no-such-view")).status == 401
