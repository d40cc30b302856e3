"""Requests in flight per source (pipeline/api/limits.py): one client past its share gets 429 at once and
is counted; the others, and /metrics, still get through. A plain aiohttp app, handlers held by the test."""

from __future__ import annotations

import asyncio

from aiohttp import web as aioweb
from aiohttp.test_utils import TestClient, TestServer

from pipeline.api.limits import SourceLimit, request_size_middleware, source_limit_middleware
from pipeline.api.refusals import ApiRefusals


async def test_a_source_past_its_requests_in_flight_gets_429_and_the_limit_frees_as_they_end() -> None:
    gate, refusals, limit = asyncio.Event(), ApiRefusals(), SourceLimit(2)

    async def slow(request: aioweb.Request) -> aioweb.Response:
        await gate.wait()
        return aioweb.json_response({"ok": True})

    async def metrics(request: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(text="up 1")

    app = aioweb.Application(middlewares=[source_limit_middleware(limit, refusals)])
    app.router.add_get("/api/query", slow)
    app.router.add_get("/calls", slow)
    app.router.add_get("/metrics", metrics)
    async with TestClient(TestServer(app)) as client:
        held = [asyncio.create_task(client.get(path)) for path in ("/api/query", "/calls")]
        while limit.in_flight("127.0.0.1") < 2:
            await asyncio.sleep(0.01)
        refused = await client.get("/api/query")
        assert refused.status == 429 and refused.headers["Retry-After"] == "1"
        assert "CALLQA_API_SOURCE_MAX_CONCURRENT" in (await refused.json())["error"]
        assert (await client.get("/metrics")).status == 200  # open paths are not held to it
        gate.set()
        assert [r.status for r in await asyncio.gather(*held)] == [200, 200]
        assert limit.in_flight("127.0.0.1") == 0 and (await client.get("/api/query")).status == 200
    assert refusals.counter.labels("source_busy")._value.get() == 1


def test_no_limit_with_zero() -> None:
    limit = SourceLimit(0)
    assert all(limit.enter("10.0.0.1") for _ in range(100))


async def test_a_request_over_the_size_limit_gets_413_and_is_counted() -> None:
    refusals = ApiRefusals()

    async def query(request: aioweb.Request) -> aioweb.Response:
        return aioweb.json_response({"sql": request.query.get("sql", "")})

    app = aioweb.Application(middlewares=[request_size_middleware(1024, refusals)], client_max_size=1024)
    app.router.add_get("/api/query", query)
    app.router.add_post("/login", query)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/api/query", params={"sql": "SELECT 1"})).status == 200
        long_sql = await client.get("/api/query", params={"sql": "SELECT " + "1, " * 400 + "1"})
        assert long_sql.status == 413 and "CALLQA_API_MAX_REQUEST_BYTES" in (await long_sql.json())["error"]
        assert (await client.post("/login", data={"token": "x" * 2000})).status == 413
    assert refusals.counter.labels("too_large")._value.get() == 2


async def test_logins_are_held_to_the_source_limit_as_pages_are() -> None:
    """A password's check is a scrypt hash on the API's pool: /login counts against its source like a page."""
    gate, refusals, limit = asyncio.Event(), ApiRefusals(), SourceLimit(1)

    async def check_password(request: aioweb.Request) -> aioweb.Response:
        await gate.wait()
        return aioweb.Response(status=401)

    app = aioweb.Application(middlewares=[source_limit_middleware(limit, refusals)])
    app.router.add_post("/login", check_password)
    async with TestClient(TestServer(app)) as client:
        held = asyncio.create_task(client.post("/login", data={"name": "ann", "password": "guess"}))
        while limit.in_flight("127.0.0.1") < 1:
            await asyncio.sleep(0.01)
        assert (await client.post("/login", data={"name": "ann", "password": "guess"})).status == 429
        gate.set()
        assert (await held).status == 401
