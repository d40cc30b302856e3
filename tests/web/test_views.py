"""The worker's call pages over HTTP, in process: the faust app's aiohttp server with the API server's auth
middleware and views (pipeline/api/), the call pages plugged into it as the worker does, reading a real
embedded store through the API's pool."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from http.cookies import SimpleCookie
from typing import Any

import faust
import numpy as np
import pytest
from aiohttp import DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer

from pipeline.api.auth import ApiAuth, auth_middleware
from pipeline.api.pool import QueryPool
from pipeline.api.server import register_api_views
from pipeline.api.sessions import SESSION_COOKIE
from pipeline.config import Settings
from pipeline.desk.search import SearchQuery, search
from pipeline.recordings.encode import decode_call, encode_call
from pipeline.recordings.storage import RecordingStore
from pipeline.report import WorkerApiError, WorkerApiSource
from pipeline.store.erasure import erasures_of, rows_of
from pipeline.web.render import SEEK_SCRIPT_HASH
from pipeline.web.views import register_web_views, safe_next

from .conftest import CARD, FilledStore

TOKEN = "p" * 40  # noqa: S105 - a test token
Client = TestClient  # type: ignore[type-arg]


@pytest.fixture
def serve(filled: FilledStore, chdb_path: str) -> Callable[..., Any]:
    """An in-process server of the worker's web views on the filled store (settings overridable)."""

    async def start(**overrides: Any) -> AsyncIterator[Client]:
        settings = Settings(**{"api_token": TOKEN, "clickhouse_url": f"chdb://{chdb_path}",
                               "clickhouse_database": filled.database, **overrides})
        auth = ApiAuth.from_settings(settings)
        app = faust.App(f"web-{filled.database}", web_enabled=True, web_application_options={
            "middlewares": [auth_middleware(auth)]})
        pool = QueryPool(2, 8)
        register_web_views(register_api_views(app, settings, pool, auth))
        try:
            # No cookie jar: each request carries exactly the cookie the test gives it.
            async with TestClient(TestServer(app.web.web_app), cookie_jar=DummyCookieJar()) as client:
                yield client
        finally:
            pool.shutdown()

    return start


async def _login(client: Client, token: str = TOKEN, next_path: str = "/calls") -> Any:
    return await client.post("/login", data={"token": token, "next": next_path}, allow_redirects=False)


def _session(response: Any) -> str:
    cookie = SimpleCookie()
    cookie.load(response.headers["Set-Cookie"])
    return cookie[SESSION_COOKIE].value


async def test_pages_need_a_login_and_the_login_sets_a_strict_http_only_cookie(serve: Callable[..., Any]) -> None:
    async for client in serve():
        for path, target in (("/calls?agent=agent-1", "/login?next=%2Fcalls%3Fagent%3Dagent-1"),
                             ("/calls/call-rude", "/login?next=%2Fcalls%2Fcall-rude")):
            refused = await client.get(path, allow_redirects=False)
            assert (refused.status, refused.headers["Location"]) == (303, target)
        form = await client.get("/login?next=/calls/call-rude")
        body = await form.text()
        assert form.status == 200 and 'method="post" action="/login"' in body and 'value="/calls/call-rude"' in body

        wrong = await _login(client, "x" * 40)
        assert wrong.status == 401 and "wrong token" in await wrong.text() and "Set-Cookie" not in wrong.headers
        ok = await _login(client, next_path="/calls/call-rude")
        assert (ok.status, ok.headers["Location"]) == (303, "/calls/call-rude")
        cookie = SimpleCookie()
        cookie.load(ok.headers["Set-Cookie"])
        morsel = cookie[SESSION_COOKIE]
        assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
        assert int(morsel["max-age"]) == 12 * 3600 and TOKEN not in ok.headers["Set-Cookie"]
        assert ApiAuth.from_settings(Settings(api_token=TOKEN)).page_allowed(morsel.value, None, 0.0)

        # Only pages of this worker after a login: never another site.
        for evil in ("//evil.example/calls", "https://evil.example/calls", "/\\evil.example", "/api/query"):
            assert (await _login(client, next_path=evil)).headers["Location"] == "/calls"


async def test_with_the_cookie_the_list_filters_and_the_page_shows_the_call(serve: Callable[..., Any]) -> None:
    async for client in serve():
        headers = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        listing = await client.get("/calls", headers=headers)
        body = await listing.text()
        assert listing.status == 200 and all(f'href="/calls/{c}"' in body for c in ("call-good", "call-rude",
                                                                                   "call-open"))
        assert listing.headers["Cache-Control"] == "no-store" and "frame-ancestors 'none'" in listing.headers[
            "Content-Security-Policy"]
        assert '<option selected>agent-2</option>' not in body and "<option>agent-2</option>" in body
        filtered = await (await client.get("/calls?agent=agent-2&score_max=50", headers=headers)).text()
        assert 'href="/calls/call-rude"' in filtered and 'href="/calls/call-good"' not in filtered
        assert "<option selected>agent-2</option>" in filtered and 'name="score_max" min="0" max="100" step="any" value="50"' in filtered
        bad = await client.get("/calls?score_min=lots", headers=headers)
        assert bad.status == 400 and "score_min must be a number" in await bad.text()

        page = await client.get("/calls/call-rude", headers=headers)
        html = await page.text()
        assert page.status == 200 and 'id="turn-3"' in html and "[PAN]" in html and CARD not in html
        assert 'action="/logout"' in html
        missing = await client.get("/calls/no-such-call", headers=headers)
        assert missing.status == 404 and "no call &#39;no-such-call&#39;" in await missing.text()

        # The bearer token opens the pages too (scripts, curl); a cookie does not open /api/*.
        assert (await client.get("/calls", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200
        api = await client.get("/api/query", params={"sql": "SELECT 1"}, headers=headers)
        assert api.status == 401


async def test_the_search_box_lists_the_calls_that_said_it_with_the_turns_marked(serve: Callable[..., Any]) -> None:
    async for client in serve():
        headers = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        found = await client.get("/calls?q=CANCEL+my+account&leg=customer", headers=headers)
        body = await found.text()
        assert found.status == 200 and 'href="/calls/call-rude"' in body and 'href="/calls/call-good"' not in body
        # The turn, escaped (the customer's "<script>" stays text), the phrase marked, and the form keeps it.
        assert "Then <mark>cancel my account</mark> &lt;script&gt;" in body and "<script>alert" not in body
        assert 'value="CANCEL my account"' in body and "<option selected>customer</option>" in body
        # With the other filters, and the older-calls link keeps the phrase.
        assert 'href="/calls/call-rude"' not in await (await client.get(
            "/calls?q=cancel+my+account&agent=agent-1", headers=headers)).text()
        none = await (await client.get("/calls?q=cancel+my+account&leg=agent", headers=headers)).text()
        assert 'href="/calls/call-rude"' not in none and "No calls match these filters" in none
        bad = await client.get("/calls?q=%3F%21", headers=headers)
        assert bad.status == 400 and "no word to search" in await bad.text()


async def test_an_agent_page_shows_the_weeks_beside_the_team_behind_the_login(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    async for client in serve():
        assert (await client.get("/agents/agent-2", allow_redirects=False)).status == 303  # the login first
        headers = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        listing = await (await client.get("/calls", headers=headers)).text()
        assert '<a href="/agents/agent-2">agent-2</a>' in listing
        page = await client.get("/agents/agent-2", headers=headers)
        body = await page.text()
        rude, good = filled.results["call-rude"], filled.results["call-good"]
        # One call of agent-2 in the week of 2 March; the team: three calls, two scored.
        assert page.status == 200 and "<td>2026-03-02</td>" in body
        assert f'{rude.score_pct:.0f} % <span class="muted">{(rude.score_pct + good.score_pct) / 2:.0f} %' in body
        assert '<td class="num">1 <span class="muted">3</span></td>' in body
        failed = [i.question for i in rude.items if i.passed is False]
        assert failed and f"<td>{failed[0].replace(chr(39), '&#39;')}</td>" in body
        missing = await client.get("/agents/nobody", headers=headers)
        assert missing.status == 404 and "no call of agent" in await missing.text()
        assert safe_next("/agents/agent-2") == "/agents/agent-2"


async def test_api_review_overturns_an_item_and_the_call_is_rescored(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    rude = filled.results["call-rude"]
    assert rude.auto_failed and rude.score_pct == 0.0
    async for client in serve():
        review = {"item": "prohibited_language", "verdict": "pass", "reason": "a quote of the customer", "reviewer": "li"}
        answer = await client.post("/api/calls/call-rude/reviews", json=review, headers=bearer)
        body = await answer.json()
        assert answer.status == 200, body
        assert body["review"]["automatic"] == "fail" and body["review"]["verdict"] == "pass"
        assert body["auto_failed"] is True and body["score_pct"] == 0.0  # the disclosure is missing too
        disclosure = {**review, "item": "recording_disclosure", "reason": "said before the transfer"}
        answer = await client.post("/api/calls/call-rude/reviews", json=disclosure, headers=bearer)
        body = await answer.json()
        assert body["automatic_score_pct"] == 0.0 and body["auto_failed"] is False and body["score_pct"] > 0
        summary = await (await client.get("/api/calls/call-rude", headers=bearer)).json()
        assert summary["summary"]["score_pct"] == pytest.approx(body["score_pct"], abs=0.01)
        assert summary["summary"]["auto_failed"] is False
        bad = await client.post("/api/calls/call-rude/reviews", json={**review, "item": "nope"}, headers=bearer)
        assert bad.status == 400 and "no item 'nope'" in (await bad.json())["error"]
        missing = await client.post("/api/calls/no-such/reviews", json=review, headers=bearer)
        assert missing.status == 404
        assert (await client.post("/api/calls/call-rude/reviews", json=review)).status == 401


async def test_api_erasure_removes_an_ended_call_and_refuses_an_open_one(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve():
        answer = await client.post("/api/calls/call-rude/erasure", json={"erased_by": "dpo"}, headers=bearer)
        body = await answer.json()
        assert answer.status == 200, body
        assert body["rows"]["segments"] >= 1 and body["rows"]["calls"] >= 1
        gone = await client.get("/api/calls/call-rude", headers=bearer)  # as its audio answers: no such call
        assert (gone.status, await gone.json()) == (404, {"error": "no call call-rude"})
        assert erasures_of(filled.client, filled.database, "call-rude")[0].erased_by == "dpo"
        opened = await client.post("/api/calls/call-open/erasure", json={"erased_by": "dpo"}, headers=bearer)
        assert opened.status == 409 and "has not ended" in (await opened.json())["error"]
        assert rows_of(filled.client, filled.database, ["call-open"])["call-open"]  # nothing removed
        assert (await client.post("/api/calls/call-good/erasure", json={})).status == 401


async def test_accounts_see_their_tenants_calls_or_their_own_through_every_api_door(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    """Calls of tenant acme (agent-1: call-good, call-open; agent-2: call-rude). A supervisor of another tenant gets
    nothing through any door; an agent of acme its own calls only; a supervisor of acme reviews, no one but an admin
    erases; a removed account's token is refused."""
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(web_logout_sync_s=0):
        tokens = {}
        for name, role, tenant, agent in (("sam", "supervisor", "other", ""), ("ann", "agent", "acme", "agent-1"),
                                          ("sue", "supervisor", "acme", ""), ("ada", "admin", "other", "")):
            added = await client.post("/api/users", json={"name": name, "role": role, "tenant": tenant,
                                                          "agent_id": agent}, headers=operator)
            body = await added.json()
            assert added.status == 200, body
            tokens[name] = {"Authorization": f"Bearer {body['token']}"}

        async def calls(who: str, client: Client = client, tokens: dict[str, dict[str, str]] = tokens) -> set[str]:
            answer = await client.get("/api/calls", headers=tokens[who])
            assert answer.status == 200, await answer.text()
            return {c["call_id"] for c in await answer.json()}

        async def sql(who: str, text: str, client: Client = client,
                      tokens: dict[str, dict[str, str]] = tokens) -> list[Any]:
            answer = await client.get("/api/query", params={"sql": text}, headers=tokens[who])
            assert answer.status == 200, await answer.text()
            return list((await answer.json())["rows"])

        assert await calls("sam") == set()
        hidden = await client.get("/api/calls/call-good", headers=tokens["sam"])
        assert (hidden.status, await hidden.json()) == (404, {"error": "no call call-good"})
        found = await client.get("/api/search", params={"q": "card"}, headers=tokens["sam"])
        assert found.status == 200 and await found.json() == []
        assert await sql("sam", "SELECT call_id, text FROM segments_deduped UNION ALL "
                                "SELECT call_id, toString(score_pct) FROM call_qa") == []
        review = {"item": "greeting", "verdict": "pass", "reason": "x", "reviewer": "sam"}
        assert (await client.post("/api/calls/call-rude/reviews", json=review, headers=tokens["sam"])).status == 404
        assert (await client.post("/api/calls/call-rude/erasure", json={}, headers=tokens["ada"])).status == 404

        assert await calls("ann") == {"call-good", "call-open"}
        assert {r[0] for r in await sql("ann", "SELECT DISTINCT call_id FROM segments")} == {"call-good", "call-open"}
        assert (await client.post("/api/calls/call-good/reviews", json=review, headers=tokens["ann"])).status == 403

        assert await calls("sue") == {"call-good", "call-rude", "call-open"}
        reviewed = await client.post("/api/calls/call-good/reviews", json={**review, "reviewer": "sue"},
                                     headers=tokens["sue"])
        assert reviewed.status == 200, await reviewed.text()
        assert (await client.post("/api/calls/call-good/erasure", json={}, headers=tokens["sue"])).status == 403
        assert (await client.get("/api/users", headers=tokens["sue"])).status == 403

        listed = await (await client.get("/api/users", headers=tokens["ada"])).json()
        assert {a["name"] for a in listed} == {"sam", "ada"}  # an admin sees its own tenant's accounts
        assert "token" not in str(listed) and "token_sha256" not in str(listed)
        assert (await client.delete("/api/users/ann", headers=tokens["ada"])).status == 404  # not its tenant
        assert (await client.delete("/api/users/sam", headers=tokens["ada"])).status == 200
        assert (await client.get("/api/calls", headers=tokens["sam"])).status == 401
        stored = filled.client.query("SELECT token_sha256 FROM users WHERE token_sha256 != ''").result_rows
        assert len(stored) == 4 and all(len(d) == 64 and set(d) <= set("0123456789abcdef") for (d,) in stored)


async def test_an_account_logs_into_the_pages_with_its_password_and_sees_its_scope_only(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(web_logout_sync_s=0):
        for name, role, tenant, agent in (("ann", "agent", "acme", "agent-1"), ("sam", "supervisor", "other", "")):
            added = await client.post("/api/users", json={"name": name, "role": role, "tenant": tenant,
                                                          "agent_id": agent, "password": f"{name} long password"},
                                      headers=operator)
            assert added.status == 200, await added.text()

        async def log_in(name: str, password: str, client: Client = client) -> Any:
            return await client.post("/login", data={"name": name, "password": password, "next": "/calls"},
                                     allow_redirects=False)

        answer = await log_in("ann", "ann long password")
        assert answer.status == 303
        ann = {"Cookie": f"{SESSION_COOKIE}={_session(answer)}"}
        listing = await (await client.get("/calls", headers=ann)).text()
        assert 'href="/calls/call-good"' in listing and 'href="/calls/call-rude"' not in listing  # agent-1's only
        assert (await client.get("/calls/call-rude", headers=ann)).status == 404  # as if there were none
        assert (await client.get("/calls/call-good", headers=ann)).status == 200
        assert (await client.get("/agents/agent-2", headers=ann)).status == 404
        page = await (await client.get("/calls/call-good", headers=ann)).text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        review = {"item": "greeting", "verdict": "pass", "reason": "x", "reviewer": "ann", "csrf": csrf.group(1)}
        refused = await client.post("/calls/call-good/reviews", data=review, headers=ann, allow_redirects=False)
        assert refused.status == 403  # an agent reads; it does not review

        sam = {"Cookie": f"{SESSION_COOKIE}={_session(await log_in('sam', 'sam long password'))}"}
        other = await (await client.get("/calls", headers=sam)).text()
        assert "call-good" not in other and "call-rude" not in other and "call-open" not in other

        wrong = await log_in("ann", "not the password")
        assert wrong.status == 401 and "wrong name or password" in await wrong.text()
        for _ in range(9):
            await log_in("ann", "still not it")
        throttled = await log_in("ann", "ann long password")  # the right one, after 10 failures: wait
        assert throttled.status == 429 and "too many failed logins" in await throttled.text()

        assert (await client.delete("/api/users/ann", headers=operator)).status == 200
        gone = await client.get("/calls", headers=ann, allow_redirects=False)
        assert gone.status == 303 and gone.headers["Location"].startswith("/login")  # its session ends with it


async def test_the_call_page_reviews_an_item_with_its_session_form_token(serve: Callable[..., Any]) -> None:
    async for client in serve():
        cookie = _session(await _login(client))
        headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"}
        page = await (await client.get("/calls/call-rude", headers=headers)).text()
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token and 'action="/calls/call-rude/reviews"' in page and '<option value="greeting">' in page
        form = {"item": "prohibited_language", "verdict": "pass", "reason": "quoting the customer", "reviewer": "li"}
        # Without the form's token, or with another session's, nothing is taken (a page of another site).
        other = _session(await _login(client))
        other_page = await (await client.get("/calls/call-rude", headers={"Cookie": f"{SESSION_COOKIE}={other}"})).text()
        other_token = re.search(r'name="csrf" value="([^"]+)"', other_page)
        assert other_token and other_token.group(1) != token.group(1)
        for bad in ({}, {"csrf": other_token.group(1)}):
            refused = await client.post("/calls/call-rude/reviews", data={**form, **bad}, headers=headers,
                                        allow_redirects=False)
            assert refused.status == 403
        taken = await client.post("/calls/call-rude/reviews", data={**form, "csrf": token.group(1)}, headers=headers,
                                  allow_redirects=False)
        assert taken.status == 303 and taken.headers["Location"] == "/calls/call-rude#scorecard"
        after = await (await client.get("/calls/call-rude", headers=headers)).text()
        assert "reviewed by li; automatic 0 %" in after and "quoting the customer" in after
        assert '<td>fail</td>' in after and '<td class="pass">pass</td>' in after  # machine, reviewer's
        unknown = await client.post("/calls/call-rude/reviews", data={**form, "item": "x", "csrf": token.group(1)},
                                    headers=headers)
        assert unknown.status == 400 and "no item &#39;x&#39;" in await unknown.text()
        # Not logged in: the login, before any form check.
        assert (await client.post("/calls/call-rude/reviews", data=form, allow_redirects=False)).status == 303
        assert (await client.get("/calibration", allow_redirects=False)).status == 303
        calibration = await (await client.get("/calibration", headers=headers)).text()
        assert "<td>Did the agent avoid prohibited language?</td><td class=\"num\">1</td>" in calibration
        assert "1 (100 %)" in calibration and 'href="/calibration"' in calibration


async def test_categories_filter_the_list_and_show_on_the_call(serve: Callable[..., Any], filled: FilledStore) -> None:
    assert filled.results["call-rude"].categories == ("cancellation", "escalation", "abusive_agent", "no_disclosure",
                                                      "unverified_caller")
    assert filled.results["call-good"].categories == ()
    async for client in serve():
        headers = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        listing = await (await client.get("/calls?category=escalation", headers=headers)).text()
        assert 'href="/calls/call-rude"' in listing and 'href="/calls/call-good"' not in listing
        assert "<option selected>escalation</option>" in listing and "<option>no_disclosure</option>" in listing
        assert '<span class="badge category">abusive_agent</span>' in listing
        page = await (await client.get("/calls/call-rude", headers=headers)).text()
        assert '<span class="badge category">cancellation</span>' in page
        found = await (await client.get("/api/search?q=manager&category=escalation",
                                        headers={"Authorization": f"Bearer {TOKEN}"})).json()
        assert [c["call_id"] for c in found] == ["call-rude"]


async def test_a_forged_or_logged_out_cookie_goes_back_to_the_login(serve: Callable[..., Any]) -> None:
    async for client in serve():
        value = _session(await _login(client))
        expires, nonce, mac = value.split(".")
        forged = f"{int(expires) + 86_400}.{nonce}.{mac}"
        assert (await client.get("/calls", headers={"Cookie": f"{SESSION_COOKIE}={forged}"},
                                 allow_redirects=False)).status == 303
        out = await client.post("/logout", headers={"Cookie": f"{SESSION_COOKIE}={value}"}, allow_redirects=False)
        cleared = SimpleCookie()
        cleared.load(out.headers["Set-Cookie"])
        assert (out.status, out.headers["Location"]) == (303, "/login") and cleared[SESSION_COOKIE].value == ""
    async for client in serve(api_token="q" * 40):  # a new token: every session made with the old one ends
        assert (await client.get("/calls", headers={"Cookie": f"{SESSION_COOKIE}={value}"},
                                 allow_redirects=False)).status == 303


async def test_a_logout_revokes_the_session_here_on_another_worker_and_after_a_restart(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    def cookie(value: str) -> dict[str, str]:
        return {"Cookie": f"{SESSION_COOKIE}={value}"}

    async for here in serve():
        value = _session(await _login(here))
        kept = _session(await _login(here))  # another browser's session, not logged out
        async for other in serve(web_logout_sync_s=0):  # a second worker on the same store
            assert (await other.get("/calls", headers=cookie(value), allow_redirects=False)).status == 200
            out = await here.post("/logout", headers=cookie(value), allow_redirects=False)
            assert (out.status, out.headers["Location"]) == (303, "/login")
            # Refused where it logged out at once, and by the other worker from the store: a copy of the
            # cookie taken before the logout opens nothing.
            assert (await here.get("/calls", headers=cookie(value), allow_redirects=False)).status == 303
            assert (await other.get("/calls", headers=cookie(value), allow_redirects=False)).status == 303
            assert (await other.get("/calls", headers=cookie(kept), allow_redirects=False)).status == 200
    stored = filled.client.query(f"SELECT session_id FROM {filled.database}.revoked_sessions").result_rows
    assert stored == [(value.split(".")[1],)]  # the nonce only: nothing a cookie can be made from
    async for restarted in serve():  # a worker started after the logout reads it on its first page
        assert (await restarted.get("/calls", headers=cookie(value), allow_redirects=False)).status == 303
        assert (await restarted.get("/calls", headers=cookie(kept), allow_redirects=False)).status == 200


async def test_api_calls_answers_in_pages_with_a_next_link_and_refuses_a_page_too_large(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    newest_first = [c for c, _ in sorted(filled.started.items(), key=lambda kv: (-kv[1].timestamp(), kv[0]))]
    async for client in serve(api_page_size=2, api_page_max=2):
        seen: list[str] = []
        url: str | None = "/api/calls"
        while url is not None:
            page = await client.get(url, headers=bearer)
            assert page.status == 200
            body = await page.json()
            assert 1 <= len(body) <= 2
            seen += [c["call_id"] for c in body]
            link = page.headers.get("Link")
            url = link[1:link.index(">")] if link else None
            assert link is None or link.endswith('; rel="next"')
        assert seen == newest_first and len(seen) == 3  # each call once, in the list's order, across two pages
        too_many = await client.get("/api/calls?limit=3", headers=bearer)
        assert too_many.status == 400 and "limit must be from 1 to 2" in (await too_many.json())["error"]
        forged = await client.get("/api/calls?after=not-a-cursor!", headers=bearer)
        assert forged.status == 400 and "cursor" in (await forged.json())["error"]


async def test_api_search_finds_a_phrase_in_the_redacted_turns_with_filters_and_pages(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(api_page_size=1, api_page_max=5):
        async def found(query: str, client: Client = client) -> list[dict[str, Any]]:
            answer = await client.get(f"/api/search?{query}", headers=bearer)
            assert answer.status == 200, await answer.text()
            return list(await answer.json())

        [rude] = await found("q=Cancel+my+account")
        assert rude["call_id"] == "call-rude" and rude["turns"] == 1
        assert [(h["leg"], h["start_ms"]) for h in rude["hits"]] == [("customer", 22000)]
        assert rude["score_pct"] == round(filled.results["call-rude"].score_pct, 2)
        # The card number the customer read out was redacted before it was stored: no door finds it.
        assert await found("q=" + CARD.replace(" ", "+") + "&limit=5") == []
        assert await found("q=4111&limit=5") == []
        assert [c["call_id"] for c in await found("q=charge&leg=customer&limit=5")] == []  # "charged" is not "charge"
        assert [c["call_id"] for c in await found("q=charged&leg=customer&limit=5")] == ["call-rude"]
        assert [c["call_id"] for c in await found("q=acme&agent=agent-1&limit=5")] == ["call-open", "call-good"]
        assert [c["call_id"] for c in await found("failed=recording_disclosure&limit=5")] == ["call-rude"]
        # One call a page (api_page_size=1): the next page through the Link header, as /api/calls.
        first = await client.get("/api/search?q=acme", headers=bearer)
        link = first.headers["Link"]
        second = await client.get(link[1:link.index(">")], headers=bearer)
        assert [c["call_id"] for c in await first.json() + await second.json()] == ["call-open", "call-good"]
        bad = await client.get("/api/search?q=x&leg=supervisor", headers=bearer)
        assert bad.status == 400 and "leg must be one of agent, customer" in (await bad.json())["error"]
        assert (await client.get("/api/search?q=acme")).status == 401  # the token, as every /api/*


async def test_search_through_the_query_api_as_the_cli_asks_a_running_worker(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    """`callqa search` while a worker holds the store: the same SQL through /api/query, every parameter text."""
    async for client in serve():
        source = WorkerApiSource(str(client.make_url("")).rstrip("/"), TOKEN)
        found = await asyncio.to_thread(search, source, filled.database, SearchQuery("acme", leg="agent"))
        assert [c.call_id for c in found] == ["call-open", "call-good"]
        assert [h.start_ms for h in found[1].hits] == [0] and found[1].hits[0].text.startswith("Good morning")


async def test_the_clis_worker_path_sends_json_with_the_token_and_says_a_refusal_in_one_line(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    """`callqa review`, `erase` and `users` while a worker holds the store: WorkerApiSource.send."""
    async for client in serve():
        worker = WorkerApiSource(str(client.make_url("")).rstrip("/"), TOKEN)
        review = {"item": "prohibited_language", "verdict": "pass", "reason": "a quote", "reviewer": "li"}
        answer = await asyncio.to_thread(worker.send, "POST", "/api/calls/call-rude/reviews", review)
        assert answer["review"]["verdict"] == "pass"
        with pytest.raises(WorkerApiError, match=r"^worker API answered 404: "):
            await asyncio.to_thread(worker.send, "POST", "/api/calls/no-such/reviews", review)
        stranger = WorkerApiSource(worker.base_url, "w" * 40)
        with pytest.raises(WorkerApiError, match="worker API answered 401: wrong bearer token"):
            await asyncio.to_thread(stranger.send, "GET", "/api/users")


async def test_the_list_sorts_by_score_or_age_a_page_at_a_time(serve: Callable[..., Any], filled: FilledStore) -> None:
    import html as html_lib

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    scores = {c: r.score_pct for c, r in filled.results.items()}  # the open call is not scored
    oldest = [c for c, _ in sorted(filled.started.items(), key=lambda kv: (kv[1].timestamp(), kv[0]))]
    orders = {"oldest": oldest, "lowest_score": sorted(scores, key=lambda c: scores[c]),
              "highest_score": sorted(scores, key=lambda c: -scores[c])}
    assert len(set(scores.values())) == 2
    async for client in serve(web_page_size=1):
        for sort, expected in orders.items():
            seen: list[str] = []
            url: str | None = f"/calls?sort={sort}"
            while url is not None:
                body = await (await client.get(url, headers=bearer)).text()
                seen += re.findall(r'<td><a href="/calls/([^"]+)">', body)
                older = re.search(r'<a id="older" href="([^"]+)">', body)
                url = html_lib.unescape(older.group(1)) if older else None
                assert len(seen) <= 3
            assert seen == expected, sort
        bad = await client.get("/calls?sort=random", headers=bearer)
        assert bad.status == 400 and "sort must be one of newest, oldest" in await bad.text()


async def test_the_calls_page_lists_a_page_at_a_time_and_links_the_older_calls(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    import html as html_lib
    import re

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    newest_first = [c for c, _ in sorted(filled.started.items(), key=lambda kv: (-kv[1].timestamp(), kv[0]))]
    async for client in serve(web_page_size=2):
        seen: list[str] = []
        url: str | None = "/calls"
        pages = 0
        while url is not None:
            page = await client.get(url, headers=bearer)
            body = await page.text()
            assert page.status == 200
            listed = re.findall(r'<td><a href="/calls/([^"]+)">', body)
            assert 1 <= len(listed) <= 2
            seen += listed
            pages += 1
            older = re.search(r'<a id="older" href="([^"]+)">', body)
            url = html_lib.unescape(older.group(1)) if older else None
            assert (pages > 1) == ("after the page before" in body)
        assert seen == newest_first and pages == 2  # each call once, in the list's order
        none = await (await client.get("/calls?queue=no-such-queue", headers=bearer)).text()
        assert 'id="older"' not in none and "No calls match these filters" in none
        bad = await client.get("/calls?after=not-a-cursor!", headers=bearer)
        assert bad.status == 400 and "cursor" in await bad.text()
    async for client in serve(web_page_size=1):  # the filters ride along the link
        agent_1 = [c for c in newest_first if c in ("call-good", "call-open")]
        first = await (await client.get("/calls?agent=agent-1", headers=bearer)).text()
        link = html_lib.unescape(re.search(r'<a id="older" href="([^"]+)">', first).group(1))  # type: ignore[union-attr]
        second = await (await client.get(link, headers=bearer)).text()
        assert "agent=agent-1" in link and "<option selected>agent-1</option>" in second
        assert [re.findall(r'<td><a href="/calls/([^"]+)">', p) for p in (first, second)] == [[c] for c in agent_1]


async def test_the_session_cookie_is_secure_behind_a_tls_proxy(serve: Callable[..., Any]) -> None:
    async for client in serve():
        for headers, secure in (({}, False), ({"X-Forwarded-Proto": "https"}, True),
                                ({"X-Forwarded-Proto": "http, https"}, True),
                                ({"Forwarded": 'for=10.0.0.1;proto="https"'}, True),
                                ({"Forwarded": "for=10.0.0.1;proto=http"}, False)):
            response = await client.post("/login", data={"token": TOKEN, "next": "/calls"}, headers=headers,
                                         allow_redirects=False)
            morsel = SimpleCookie(response.headers["Set-Cookie"])[SESSION_COOKIE]
            assert bool(morsel["secure"]) is secure, headers


async def test_pages_open_with_auth_off_and_say_what_is_missing_without_a_token(serve: Callable[..., Any]) -> None:
    async for client in serve(api_auth="off", api_token=""):
        assert (await client.get("/calls/call-good")).status == 200
        assert (await client.get("/login", allow_redirects=False)).headers["Location"] == "/calls"
    async for client in serve(api_token=""):
        refused = await client.get("/calls", allow_redirects=False)
        assert refused.status == 303
        login = await client.get(refused.headers["Location"])
        assert login.status == 503 and "no API token configured" in await login.text()
        assert (await _login(client, "")).status == 503


async def test_the_recording_is_served_in_ranges_to_who_may_see_the_call_and_played_on_its_page(
    serve: Callable[..., Any], filled: FilledStore, tmp_path: Any
) -> None:
    """call-rude (tenant acme) has a recording: the operator gets it whole and in ranges, a supervisor of another
    tenant a 404 as for a call with none, the page a player whose turn times seek; an erase removes the file."""
    legs = {"agent": np.sin(np.arange(16000) / 5).astype(np.float32) * 0.3, "customer": np.zeros(8000, np.float32)}
    data = encode_call(legs, 8000, 1.0)
    files = RecordingStore(str(tmp_path / "recordings"))
    files.put("call-rude", data)
    filled.client.insert("recordings", [["call-rude", "acme", files.url_for("call-rude"), "audio/ogg", len(data), 2000,
                                         ["agent", "customer"], [("customer", 100, 900, "PAN", "estimate")],
                                         filled.started["call-rude"], filled.started["call-rude"]]],
                         column_names=["call_id", "tenant", "url", "media_type", "bytes", "duration_ms", "channels",
                                       "cuts", "started_at", "written_at"], database=filled.database)
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(recordings_url=str(tmp_path / "recordings"), web_logout_sync_s=0):
        whole = await client.get("/api/calls/call-rude/audio", headers=operator)
        assert (whole.status, whole.headers["Content-Type"], whole.headers["Accept-Ranges"]) == (200, "audio/ogg", "bytes")
        assert await whole.read() == data and decode_call(data)[1] == 8000
        part = await client.get("/api/calls/call-rude/audio", headers={**operator, "Range": "bytes=10-99"})
        assert (part.status, part.headers["Content-Range"], await part.read()) == (
            206, f"bytes 10-99/{len(data)}", data[10:100])
        tail = await client.get("/api/calls/call-rude/audio", headers={**operator, "Range": "bytes=-16"})
        assert tail.status == 206 and await tail.read() == data[-16:]
        past = await client.get("/api/calls/call-rude/audio", headers={**operator, "Range": f"bytes={len(data)}-"})
        assert (past.status, past.headers["Content-Range"]) == (416, f"bytes */{len(data)}")
        huge = "9" * 5000  # more digits than int() reads
        far = await client.get("/api/calls/call-rude/audio", headers={**operator, "Range": f"bytes={huge}-"})
        assert (far.status, far.headers["Content-Range"]) == (416, f"bytes */{len(data)}")
        rest = await client.get("/api/calls/call-rude/audio", headers={**operator, "Range": f"bytes=10-{huge}"})
        assert (rest.status, await rest.read()) == (206, data[10:])
        assert (await client.get("/api/calls/call-good/audio", headers=operator)).status == 404  # none kept
        assert (await client.get("/api/calls/call-rude/audio")).status == 401

        added = await client.post("/api/users", json={"name": "sam", "role": "supervisor", "tenant": "other"},
                                  headers=operator)
        stranger = {"Authorization": f"Bearer {(await added.json())['token']}"}
        refused = await client.get("/api/calls/call-rude/audio", headers=stranger)
        assert refused.status == 404 and b"OggS" not in await refused.read()

        cookie = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        page = await (await client.get("/calls/call-rude", headers=cookie)).text()
        assert 'id="player"' in page and 'src="/calls/call-rude/audio"' in page and "1 stretch silenced" in page
        assert re.search(r'href="/calls/call-rude/audio#t=\d+\.\d\d" data-seek="\d+\.\d\d"', page)
        assert SEEK_SCRIPT_HASH in page  # the CSP allows the seek script by its hash, and nothing else
        heard = await client.get("/calls/call-rude/audio", headers={**cookie, "Range": "bytes=0-3"})
        assert (heard.status, await heard.read()) == (206, b"OggS")
        assert 'id="player"' not in await (await client.get("/calls/call-good", headers=cookie)).text()

        erased = await client.post("/api/calls/call-rude/erasure", json={"erased_by": "dpo"}, headers=operator)
        assert erased.status == 200 and (await erased.json())["rows"]["recording_files"] == 1
        assert not files.exists("call-rude")
        assert (await client.get("/api/calls/call-rude/audio", headers=operator)).status == 404


async def test_a_name_held_in_another_tenant_cannot_be_taken_over(serve: Callable[..., Any]) -> None:
    """An admin of tenant other adding "bob", whom tenant acme holds: refused, and bob keeps his tenant, his token
    and his page session. Once bob is removed and the name added again, bob's old session and token open nothing:
    a session names the account's id, not its name."""
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(web_logout_sync_s=0):
        tokens = {}
        for name, role, tenant in (("bob", "supervisor", "acme"), ("ada", "admin", "other")):
            added = await client.post("/api/users", json={"name": name, "role": role, "tenant": tenant,
                                                          "password": "a long password"}, headers=operator)
            assert added.status == 200, await added.text()
            tokens[name] = {"Authorization": f"Bearer {(await added.json())['token']}"}
        logged_in = await client.post("/login", data={"name": "bob", "password": "a long password", "next": "/calls"},
                                      allow_redirects=False)
        bob_session = {"Cookie": f"{SESSION_COOKIE}={_session(logged_in)}"}

        taken = await client.post("/api/users", json={"name": "bob", "role": "admin", "password": "ada's own password"},
                                  headers=tokens["ada"])
        assert (taken.status, await taken.json()) == (409, {"error": "account name 'bob' is taken (names are unique "
                                                                     "across tenants): choose another, or remove that "
                                                                     "account first"})
        again = await client.post("/api/users", json={"name": "bob", "role": "agent", "tenant": "acme",
                                                      "agent_id": "agent-1"}, headers=operator)
        assert again.status == 409  # the operator neither: bob's token would change under him
        listed = await (await client.get("/api/calls", headers=tokens["bob"])).json()
        assert {c["call_id"] for c in listed} == {"call-good", "call-rude", "call-open"}  # still acme's supervisor
        assert 'href="/calls/call-rude"' in await (await client.get("/calls", headers=bob_session)).text()
        other = await client.post("/login", data={"name": "bob", "password": "ada's own password", "next": "/calls"},
                                  allow_redirects=False)
        assert other.status == 401  # the password ada sent was never set

        assert (await client.delete("/api/users/bob", headers=operator)).status == 200
        readded = await client.post("/api/users", json={"name": "bob", "role": "admin", "tenant": "other"},
                                    headers=tokens["ada"])
        assert readded.status == 200, await readded.text()
        stale = await client.get("/calls", headers=bob_session, allow_redirects=False)
        assert stale.status == 303 and stale.headers["Location"].startswith("/login")  # not the new bob
        assert (await client.get("/api/calls", headers=tokens["bob"])).status == 401


async def test_reviews_and_erasures_name_the_account_signed_in_not_the_body(
    serve: Callable[..., Any], filled: FilledStore
) -> None:
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(web_logout_sync_s=0):
        tokens = {}
        for name, role in (("sue", "supervisor"), ("ada", "admin")):
            added = await client.post("/api/users", json={"name": name, "role": role, "tenant": "acme",
                                                          "password": "a long password"}, headers=operator)
            tokens[name] = {"Authorization": f"Bearer {(await added.json())['token']}"}
        review = {"item": "greeting", "verdict": "pass", "reason": "x", "reviewer": "the-ceo"}
        reviewed = await client.post("/api/calls/call-good/reviews", json=review, headers=tokens["sue"])
        assert reviewed.status == 200 and (await reviewed.json())["review"]["reviewer"] == "sue"
        # The operator's token is the local CLI's: it says whom it acts for (--reviewer, default $USER).
        by_cli = await client.post("/api/calls/call-good/reviews", json={**review, "reviewer": "li"}, headers=operator)
        assert (await by_cli.json())["review"]["reviewer"] == "li"
        unnamed = await client.post("/api/calls/call-good/reviews", json={**review, "reviewer": ""}, headers=operator)
        assert (await unnamed.json())["review"]["reviewer"] == "operator"

        logged_in = await client.post("/login", data={"name": "sue", "password": "a long password", "next": "/calls"},
                                      allow_redirects=False)
        cookie = {"Cookie": f"{SESSION_COOKIE}={_session(logged_in)}"}
        page = await (await client.get("/calls/call-rude", headers=cookie)).text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        form = {**review, "item": "prohibited_language", "reason": "page review", "csrf": csrf.group(1)}
        taken = await client.post("/calls/call-rude/reviews", data=form, headers=cookie, allow_redirects=False)
        assert taken.status == 303
        stored = filled.client.query("SELECT reviewer FROM reviews WHERE reason = 'page review'").result_rows
        assert stored == [("sue",)]

        erased = await client.post("/api/calls/call-good/erasure", json={"erased_by": "someone else"},
                                   headers=tokens["ada"])
        assert erased.status == 200, await erased.text()
        assert erasures_of(filled.client, filled.database, "call-good")[0].erased_by == "ada"


async def test_guesses_sent_together_are_held_to_the_login_limit(serve: Callable[..., Any]) -> None:
    """Fifteen wrong passwords at once for one name: ten are checked (each counted before its check), five refused
    at once; none fails for want of room on the pool (two threads, eight waiting)."""
    async for client in serve():
        added = await client.post("/api/users", json={"name": "ann", "role": "agent", "tenant": "acme",
                                                      "agent_id": "agent-1", "password": "ann long password"},
                                  headers={"Authorization": f"Bearer {TOKEN}"})
        assert added.status == 200
        answers = await asyncio.gather(*(client.post("/login", data={"name": "ann", "password": f"guess {n:02d} here",
                                                                     "next": "/calls"}, allow_redirects=False)
                                         for n in range(15)))
        assert sorted(a.status for a in answers) == [401] * 10 + [429] * 5
        right = await client.post("/login", data={"name": "ann", "password": "ann long password", "next": "/calls"},
                                  allow_redirects=False)
        assert right.status == 429  # ten failures in the window: the right password waits too


async def test_hostile_csrf_values_and_tokens_are_refused_not_failed(serve: Callable[..., Any]) -> None:
    async for client in serve():
        cookie = {"Cookie": f"{SESSION_COOKIE}={_session(await _login(client))}"}
        form = {"item": "greeting", "verdict": "pass", "reason": "x", "reviewer": "li"}
        for csrf in ("\u00e9" * 43, "\u4e2d", "\U0001f600"):
            refused = await client.post("/calls/call-rude/reviews", data={**form, "csrf": csrf}, headers=cookie,
                                        allow_redirects=False)
            assert refused.status == 403, csrf
        # Bytes that are not UTF-8 in the bearer token and the session cookie: a wrong token, a login.
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(b"GET /api/calls HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xed\r\n"
                     b"Connection: close\r\n\r\n")
        await writer.drain()
        status = (await reader.readline()).split()[1]
        writer.close()
        assert status == b"401"
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(b"GET /calls HTTP/1.1\r\nHost: x\r\nCookie: callqa_session=1.\xff.\xfe\r\n"
                     b"Connection: close\r\n\r\n")
        await writer.drain()
        status = (await reader.readline()).split()[1]
        writer.close()
        assert status == b"303"


async def test_unknown_bearer_tokens_from_one_source_are_refused_before_the_store_is_asked(
    serve: Callable[..., Any]
) -> None:
    operator = {"Authorization": f"Bearer {TOKEN}"}
    async for client in serve(web_logout_sync_s=600):
        added = await client.post("/api/users", json={"name": "sue", "role": "supervisor", "tenant": "acme"},
                                  headers=operator)
        sue = {"Authorization": f"Bearer {(await added.json())['token']}"}
        assert (await client.get("/api/calls", headers=sue)).status == 200  # known from here on
        for n in range(30):
            wrong = await client.get("/api/calls", headers={"Authorization": f"Bearer guess-{n:040d}"})
            assert wrong.status == 401
        throttled = await client.get("/api/calls", headers={"Authorization": f"Bearer guess-{30:040d}"})
        assert throttled.status == 429 and throttled.headers["Retry-After"] == "60"
        assert (await throttled.json())["error"].startswith("too many unknown bearer tokens from 127.0.0.1")
        assert (await client.get("/api/calls", headers=sue)).status == 200  # a known token still works
        assert (await client.get("/api/calls", headers=operator)).status == 200
