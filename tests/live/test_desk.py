"""The live desk over HTTP, in process: the API server's auth and views with the live desk plugged in as the worker
plugs it, following real topics on the real broker (messages written here as a worker writes them) and looking
accounts up in a real embedded store. Expectations written by hand."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from http.cookies import SimpleCookie
from typing import Any

import faust
import pytest
from aiohttp import DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Producer

from pipeline.api.auth import ApiAuth, auth_middleware
from pipeline.api.limits import SourceLimit, source_limit_middleware
from pipeline.api.pool import QueryPool
from pipeline.api.server import register_api_views
from pipeline.api.sessions import SESSION_COOKIE
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import LiveCall, Message, QaAlert, TranscriptSegment
from pipeline.live.desk import LiveDesk
from pipeline.live.views import register_live_views
from pipeline.web.live import CALL_SCRIPT, WALL_SCRIPT, script_hash
from pipeline.web.views import register_web_views

pytestmark = [pytest.mark.broker]

TOKEN = "q" * 40  # noqa: S105 - a test token
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
Client = TestClient  # type: ignore[type-arg]
Event = tuple[str, str, dict[str, Any]]  # id, kind, data


class Topics:
    """Writes to the test's topics as workers do: summaries and tombstones, transcripts, alerts."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = Producer({"bootstrap.servers": settings.bootstrap})
        self.serde = Serde.from_settings()

    def send(self, topic: str, key: str, message: Message | None) -> None:
        self.producer.produce(topic, key=key.encode(), value=None if message is None else self.serde.encode(message))
        self.producer.flush(10)

    def summary(self, call_id: str, tenant: str = "acme", agent: str = "a7", **figures: Any) -> None:
        now = int(time.time() * 1000)
        self.send(self.settings.topic_live_calls, call_id, LiveCall(call_id, now - 30_000, now, tenant=tenant,
                                                                    agent_id=agent, queue="billing", **figures))

    def ended(self, call_id: str) -> None:
        self.send(self.settings.topic_live_calls, call_id, None)

    def turn(self, call_id: str, start_ms: int, text: str, final: bool = True, leg: str = "customer") -> None:
        self.send(self.settings.topic_transcripts, call_id, TranscriptSegment(
            f"{call_id}/{leg}/{start_ms:09d}", call_id, leg, start_ms, start_ms + 1_500, text, final,  # type: ignore[arg-type]
            0.9, -0.1, 0.0, "moonshine-base", 1, produced_at_ms=int(time.time() * 1000), sentiment=-2.5))

    def alert(self, call_id: str, offset_ms: int) -> None:
        self.send(self.settings.topic_qa, call_id, QaAlert(call_id, "escalation_request", "intent", "customer",
                                                           "detect", offset_ms, "speak to a manager"))


@pytest.fixture
def topics(kafka_settings: Settings) -> Iterator[Topics]:
    yield Topics(kafka_settings)


@pytest.fixture
def serve(kafka_settings: Settings, chdb_path: str, store: Any, unique_name: str) -> Callable[..., Any]:
    """The API server with the call pages and the live desk on this test's topics; accounts sue (supervisor of
    acme), ann (agent a7 of acme) and gil (supervisor of globex) added through /api/users."""

    async def start(**overrides: Any) -> AsyncIterator[tuple[Client, dict[str, dict[str, str]]]]:
        topic_names = {name: getattr(kafka_settings, name) for name in Settings.model_fields if name.startswith("topic_")}
        settings = Settings(**{**topic_names, "bootstrap_servers": kafka_settings.bootstrap, "api_token": TOKEN,
                               "clickhouse_url": f"chdb://{chdb_path}", "clickhouse_database": unique_name,
                               "live_heartbeat_s": 0.5, **overrides})
        auth = ApiAuth.from_settings(settings)
        app = faust.App(f"live-{unique_name}", web_enabled=True, web_application_options={
            "middlewares": [source_limit_middleware(SourceLimit(settings.api_source_max_concurrent), auth.refusals),
                            auth_middleware(auth)]})
        pool = QueryPool(2, 8)
        server = register_api_views(app, settings, pool, auth)
        register_web_views(server)
        desk = LiveDesk(settings, always=True)
        register_live_views(server, desk)
        try:
            async with TestClient(TestServer(app.web.web_app), cookie_jar=DummyCookieJar()) as client:
                tokens = {}
                for name, role, tenant, agent in (("sue", "supervisor", "acme", ""), ("ann", "agent", "acme", "a7"),
                                                  ("gil", "supervisor", "globex", "")):
                    added = await client.post("/api/users", json={"name": name, "role": role, "tenant": tenant,
                                                                  "agent_id": agent, "password": f"{name} long password"},
                                              headers=OPERATOR)
                    assert added.status == 200, await added.text()
                    tokens[name] = {"Authorization": f"Bearer {(await added.json())['token']}"}
                    # A browser: the pages' session cookie, from the login form.
                    login = await client.post("/login", data={"name": name, "password": f"{name} long password",
                                                              "next": "/live"}, allow_redirects=False)
                    assert login.status == 303, await login.text()
                    cookie = SimpleCookie()
                    cookie.load(login.headers["Set-Cookie"])
                    tokens[f"{name}-browser"] = {"Cookie": f"{SESSION_COOKIE}={cookie[SESSION_COOKIE].value}"}
                yield client, tokens
        finally:
            await desk.close()
            pool.shutdown()

    return start


async def listed(client: Client, who: dict[str, str]) -> set[str]:
    answer = await client.get("/api/live/calls", headers=who)
    assert answer.status == 200, await answer.text()
    return {c["call_id"] for c in (await answer.json())["calls"]}


async def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Polls ``check`` (async) until it returns something true: the desk follows the topics a moment behind."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


async def read_events(response: Any, count: int, timeout_s: float = 30.0) -> list[Event]:
    """The next ``count`` events of a Server-Sent Events stream (comments skipped)."""
    out: list[Event] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(timeout_s):
        while len(out) < count:
            line = (await response.content.readline()).decode().rstrip("\n")
            if line.startswith(":"):
                continue
            if not line:
                if fields:
                    out.append((fields["id"], fields["event"], json.loads(fields["data"])))
                    fields = {}
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    return out


async def test_each_viewer_sees_the_calls_in_progress_of_its_scope_and_an_ended_call_leaves(
    serve: Callable[..., Any], topics: Topics
) -> None:
    async for client, tokens in serve():
        topics.summary("c1", agent="a7")
        topics.summary("c2", agent="a9")
        topics.summary("c3", tenant="globex")
        assert await until(partial(_listed_is, client, OPERATOR, {"c1", "c2", "c3"}))
        assert await listed(client, tokens["sue"]) == {"c1", "c2"}
        assert await listed(client, tokens["ann"]) == {"c1"}
        assert await listed(client, tokens["gil"]) == {"c3"}
        assert (await client.get("/api/live/calls/c1", headers=tokens["gil"])).status == 404  # not its tenant
        assert (await client.get("/api/live/calls/nope", headers=OPERATOR)).status == 404
        assert (await client.get("/api/live/calls")).status == 401  # the API wants its token

        topics.ended("c1")
        assert await until(partial(_listed_is, client, tokens["sue"], {"c2"}))
        ended = await client.get("/api/live/calls/c1", headers=tokens["sue"])
        assert ended.status == 200 and (await ended.json())["page"] == "/calls/c1"
        assert (await client.get("/api/live/calls/c1", headers=tokens["gil"])).status == 404


async def test_a_calls_stream_brings_its_turns_and_alerts_and_resumes_after_a_reconnect_without_gaps_or_twice(
    serve: Callable[..., Any], topics: Topics
) -> None:
    async for client, tokens in serve():
        topics.summary("c1")
        assert await until(partial(_listed_is, client, tokens["sue"], {"c1"}))
        stream = await client.get("/api/live/events", params={"call": "c1"}, headers=tokens["sue"])
        assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
        [(_, kind, snapshot)] = await read_events(stream, 1)
        assert kind == "snapshot" and snapshot["summary"]["call_id"] == "c1" and snapshot["turns"] == []

        topics.turn("c1", 4_000, "I want to speak", final=False)
        topics.turn("c1", 4_000, "I want to speak to a manager")
        topics.alert("c1", 5_200)
        got = await read_events(stream, 3)
        # In order within a topic (the turns share a partition); an alert, on another topic, may come first.
        seen = [(k, d.get("text"), d.get("final")) for _, k, d in got]
        assert [e for e in seen if e[0] == "turn"] == [
            ("turn", "I want to speak", False), ("turn", "I want to speak to a manager", True)]
        assert [e for e in seen if e[0] != "turn"] == [("alert", "speak to a manager", None)]
        stream.close()

        # Gone for a while: what came meanwhile comes on the reconnect, after the last event it had, once each.
        topics.turn("c1", 9_000, "this is the third time I call", leg="customer")
        topics.turn("c1", 11_000, "I am sorry to hear that", leg="agent")
        topics.summary("c1", turns=3)
        await until(partial(_has_turns, client, tokens["sue"], 3))
        again = await client.get("/api/live/events", params={"call": "c1"},
                                 headers={**tokens["sue"], "Last-Event-ID": got[-1][0]})
        resumed = await read_events(again, 3)
        assert [(k, d.get("text")) for _, k, d in resumed if k == "turn"] == [
            ("turn", "this is the third time I call"), ("turn", "I am sorry to hear that")]
        assert [k for _, k, _ in resumed if k != "turn"] == ["call"]  # the summary: its own topic, any place
        topics.ended("c1")
        [(_, kind, data)] = await read_events(again, 1)
        assert (kind, data) == ("ended", {"call_id": "c1", "page": "/calls/c1"})
        again.close()

        # A stream of a call outside the viewer's scope, or unknown: 404, as if it did not exist.
        topics.summary("c3", tenant="globex")
        await until(partial(_listed_is, client, OPERATOR, {"c3"}))
        assert (await client.get("/api/live/events", params={"call": "c3"}, headers=tokens["sue"])).status == 404
        assert (await client.get("/api/live/events", params={"kinds": "turn,secrets"}, headers=OPERATOR)).status == 400


async def test_the_wall_stream_of_one_tenant_carries_none_of_anothers_calls(
    serve: Callable[..., Any], topics: Topics
) -> None:
    async for client, tokens in serve():
        wall = await client.get("/api/live/events", headers=tokens["gil"])
        [(_, kind, snapshot)] = await read_events(wall, 1)
        assert (kind, snapshot) == ("snapshot", {"calls": []})
        topics.summary("a1", tenant="acme")
        topics.alert("a1", 1_000)
        topics.turn("a1", 500, "my card number is [CARD]")
        topics.summary("g1", tenant="globex", agent="g7")
        topics.alert("g1", 2_000)
        got = await read_events(wall, 2)
        assert [(k, d["call_id"]) for _, k, d in got] == [("call", "g1"), ("alert", "g1")]
        wall.close()


async def test_the_pages_need_a_login_and_allow_their_own_script_and_connection_only(
    serve: Callable[..., Any], topics: Topics
) -> None:
    async for client, tokens in serve():
        topics.summary("c1", customer_sentiment=-2.5, customer_scores=[0.0, -2.5], alerts=1,
                       last_alert_rule="escalation_request", last_alert_ms=5_200)
        topics.turn("c1", 4_000, "I want to speak to <b>a manager</b>")
        assert await until(partial(_has_turns, client, tokens["sue"], 1))
        for path in ("/live", "/live/c1", "/live/events"):
            refused = await client.get(path, allow_redirects=False)
            assert refused.status == 303 and refused.headers["Location"].startswith("/login?next=")
        browser = tokens["sue-browser"]
        wall = await client.get("/live", headers=browser)
        body = await wall.text()
        csp = wall.headers["Content-Security-Policy"]
        assert wall.status == 200 and "connect-src 'self'" in csp and "default-src 'none'" in csp
        scripts = csp.split("script-src")[1].split(";")[0]
        assert scripts.split() == [f"'{script_hash(WALL_SCRIPT)}'", f"'{script_hash(CALL_SCRIPT)}'"]
        assert 'href="/live/c1"' in body and "escalation_request" in body and "-2.5" in body
        assert f"<script>{WALL_SCRIPT}</script>" in body  # the script exactly as hashed
        page = await client.get("/live/c1", headers=browser)
        text = await page.text()
        assert page.status == 200 and "I want to speak to &lt;b&gt;a manager&lt;/b&gt;" in text  # escaped
        assert f"<script>{CALL_SCRIPT}</script>" in text
        assert (await client.get("/live/c1", headers=tokens["gil-browser"])).status == 404
        assert (await client.get("/live/nope", headers=browser)).status == 404
        assert "c1" not in await (await client.get("/live", headers=tokens["gil-browser"])).text()
        # The browser's stream: the session cookie opens it (EventSource sends no bearer token).
        stream = await client.get("/live/events", params={"call": "c1"}, headers=browser)
        [(_, kind, snapshot)] = await read_events(stream, 1)
        assert kind == "snapshot" and [t["text"] for t in snapshot["turns"]] == ["I want to speak to <b>a manager</b>"]
        stream.close()
        assert (await client.get("/api/live/calls", headers=browser)).status == 401  # the API wants its token


async def test_open_streams_do_not_hold_the_requests_a_source_may_have_in_flight_and_are_bounded_themselves(
    serve: Callable[..., Any], topics: Topics
) -> None:
    async for client, tokens in serve(api_source_max_concurrent=1, live_source_max_streams=2):
        streams = [await client.get("/api/live/events", headers=tokens["sue"]) for _ in range(2)]
        for stream in streams:
            [(_, kind, _)] = await read_events(stream, 1)
            assert kind == "snapshot"
        third = await client.get("/api/live/events", headers=tokens["sue"])
        assert third.status == 429 and "CALLQA_LIVE_SOURCE_MAX_STREAMS" in (await third.json())["error"]
        assert (await client.get("/api/live/calls", headers=tokens["sue"])).status == 200  # not held by them
        for stream in streams:
            stream.close()
        await asyncio.sleep(0.5)
        again = await client.get("/api/live/events", headers=tokens["sue"])
        assert again.status == 200  # a closed stream gave its place back
        again.close()


async def _listed_is(client: Client, who: dict[str, str], expected: set[str]) -> bool:
    return await listed(client, who) == expected


async def _has_turns(client: Client, who: dict[str, str], count: int) -> bool:
    answer = await client.get("/api/live/calls/c1", headers=who)
    return answer.status == 200 and len((await answer.json()).get("turns", [])) >= count
