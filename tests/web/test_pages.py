"""The call list and call page from a real store (embedded ClickHouse, the checked read-only path): what
they read, how they filter, link and escape, with and without the sentiment columns, and the static site
`callqa report --html` writes."""

from __future__ import annotations

import re
from datetime import date, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings
from pipeline.report import StoreSource, write_html
from pipeline.web.data import FilterError, ListFilters, read_call_list, read_call_page, turn_at
from pipeline.web.render import (
    PageContext,
    ServerLinks,
    StaticLinks,
    render_call_list,
    render_call_page,
    sentiment_class,
    static_file_name,
)

from .conftest import CARD, HOLDS, FilledStore, StoreRows


class Links(HTMLParser):
    """Every href and every element id of a page."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("href") and not str(found["href"]).startswith("data:"):  # the empty icon
            self.hrefs.append(str(found["href"]))
        if found.get("id"):
            self.ids.add(str(found["id"]))


def test_the_list_holds_each_call_once_newest_first_with_its_qa(filled: FilledStore, source: StoreRows) -> None:
    calls = read_call_list(source, filled.database)
    assert [c.call_id for c in calls] == ["call-open", "call-rude", "call-good"]
    by_id = {c.call_id: c for c in calls}
    rude, good, open_ = by_id["call-rude"], by_id["call-good"], by_id["call-open"]
    result = filled.results["call-rude"]
    assert (rude.score_pct, rude.auto_failed, rude.alerts) == (round(result.score_pct, 2), True, 2)
    assert set(rude.failed_items) == {i.question for i in result.items if i.passed is False}
    assert rude.items == sum(i.passed is not None for i in result.items)
    assert good.duration_s == 37.0 and good.end_reason == "end"
    assert (open_.score_pct, open_.end_reason, open_.failed_items) == (None, None, ())


@pytest.mark.parametrize(("query", "expected"), [
    ({"agent": "agent-1"}, {"call-good", "call-open"}),
    ({"queue": "sales"}, {"call-rude", "call-open"}),
    ({"score_min": "50"}, {"call-good"}),
    ({"score_max": "50"}, {"call-rude"}),  # an unscored call has no score to compare
    ({"failed": "Did the agent avoid prohibited language?"}, {"call-rude"}),
    ({"date_from": "2026-03-03"}, {"call-rude", "call-open"}),
    ({"date_to": "2026-03-03"}, {"call-good", "call-rude"}),
    ({"date_from": "2026-03-03", "date_to": "2026-03-03", "agent": "agent-2"}, {"call-rude"}),
    ({"agent": "nobody"}, set()),
])
def test_the_list_filters(source: StoreRows, filled: FilledStore, query: dict[str, str], expected: set[str]) -> None:
    filters = ListFilters.from_query(query)
    assert filters.as_query() == query
    assert {c.call_id for c in read_call_list(source, filled.database, filters)} == expected


@pytest.mark.parametrize(("query", "error"), [({"score_min": "high"}, "score_min must be a number"),
                                              ({"date_to": "3/3/2026"}, "date_to must be a date")])
def test_a_filter_that_cannot_be_read_says_which(query: dict[str, str], error: str) -> None:
    with pytest.raises(FilterError, match=error):
        ListFilters.from_query(query)


def test_the_call_page_links_alerts_and_evidence_to_their_turns(filled: FilledStore, source: StoreRows) -> None:
    page = read_call_page(source, filled.database, "call-rude")
    assert page is not None and read_call_page(source, filled.database, "no-such-call") is None
    assert [(t.leg, t.start_ms) for t in page.turns] == [("agent", 0), ("customer", 4_500), ("agent", 11_000),
                                                         ("customer", 22_000)]
    result = filled.results["call-rude"]
    assert [(a.rule, a.offset_ms) for a in page.alerts] == [(e.rule, e.offset_ms) for e in result.events
                                                             if e.kind == "alert"]
    anchors = {t.anchor: t for t in page.turns}
    for alert in page.alerts:
        turn = anchors[alert.anchor or ""]
        assert turn.leg == alert.leg and turn.start_ms <= alert.offset_ms < turn.end_ms
    prohibited = next(i for i in page.items if i.question == "Did the agent avoid prohibited language?")
    assert not prohibited.passed and [e.anchor for e in prohibited.evidence] == ["turn-2"]
    assert all(not i.evidence for i in page.items if "not found" in i.rationale)
    assert page.metrics["duration_ms"] == 26_000 and page.duration_ms == 26_000

    html = render_call_page(page, PageContext(ServerLinks()))
    parsed = Links(html)
    assert {h[1:] for h in parsed.hrefs if h.startswith("#")} <= parsed.ids  # every in-page link lands
    assert {"turn-0", "turn-1", "turn-2", "turn-3", "timeline", "scorecard", "alerts"} <= parsed.ids
    assert html.count('class="evidence" href="#turn-2"') == 1
    assert html.count('<rect class="agent"') == 2 and html.count('<rect class="customer"') == 2
    assert html.count('class="alert-mark"') == 2


def test_pages_hold_redacted_text_only_and_escape_it(filled: FilledStore, source: StoreRows) -> None:
    page = read_call_page(source, filled.database, "call-rude")
    assert page is not None
    html = render_call_page(page, PageContext(ServerLinks()))
    digits = re.sub(r"\D", "", CARD)
    assert "[PAN]" in html and CARD not in html and digits not in re.sub(r"\D", "", html)
    assert "<script>" not in html and "&lt;script&gt;alert(document.cookie)&lt;/script&gt;" in html
    listing = render_call_list(read_call_list(source, filled.database), PageContext(ServerLinks()))
    assert "<script" not in listing and CARD not in listing


def test_sentiment_colours_the_turns_once_the_store_has_it(filled: FilledStore, source: StoreRows) -> None:
    page = read_call_page(source, filled.database, "call-rude")
    assert page is not None
    if "sentiment" not in filled.client.query(f"SELECT * FROM {filled.database}.segments LIMIT 0").column_names:
        assert all(t.sentiment is None for t in page.turns)
        assert 'class="sentiment"' not in render_call_page(page, PageContext(ServerLinks()))
    # The columns the sentiment migration adds (pipeline/store/migrations.py), filled as the worker fills them.
    db = filled.database
    filled.client.command(f"ALTER TABLE {db}.segments ADD COLUMN IF NOT EXISTS sentiment Float32")
    for column in ("customer_sentiment", "customer_sentiment_start", "customer_sentiment_end",
                   "agent_sentiment_start", "agent_sentiment_end"):
        filled.client.command(f"ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS {column} Float32")
    scores = {0: 0.4, 4_500: -3.1, 11_000: -1.2, 22_000: 2.0}
    rows = filled.client.query(f"SELECT * FROM {db}.segments FINAL WHERE call_id = 'call-rude'").named_results()
    renewed = [{**r, "sentiment": scores[r["start_ms"]], "produced_at": r["produced_at"].replace(year=2027)}
               for r in rows]
    filled.client.insert("segments", [list(r.values()) for r in renewed], column_names=list(renewed[0]), database=db)
    call = next(filled.client.query(f"SELECT * FROM {db}.calls FINAL WHERE call_id = 'call-rude'").named_results())
    call.update(customer_sentiment=-0.6, customer_sentiment_start=-3.1, customer_sentiment_end=2.0,
                agent_sentiment_start=0.4, agent_sentiment_end=-1.2, updated_at=call["updated_at"].replace(year=2027))
    filled.client.insert("calls", [list(call.values())], column_names=list(call), database=db)

    page = read_call_page(source, db, "call-rude")
    assert page is not None
    assert [t.sentiment for t in page.turns] == [pytest.approx(v, abs=1e-3) for v in scores.values()]
    assert (page.sentiment.customer_start, page.sentiment.customer_end) == (pytest.approx(-3.1), 2.0)
    html = render_call_page(page, PageContext(ServerLinks()))
    classes = re.findall(r'<div class="turn leg-\w+ (sent-\w+)" id="(turn-\d)"', html)
    assert classes == [("sent-neu", "turn-0"), ("sent-neg2", "turn-1"), ("sent-neg1", "turn-2"),
                       ("sent-pos1", "turn-3")]
    assert html.count('<polyline class="trend') == 2  # one trend line per leg in the timeline
    rude = next(c for c in read_call_list(source, db) if c.call_id == "call-rude")
    assert rude.customer_sentiment == pytest.approx(-0.6)


def test_a_held_call_shows_each_hold_as_a_band_with_its_times(filled: FilledStore, source: StoreRows) -> None:
    page = read_call_page(source, filled.database, "call-good")
    assert page is not None and page.holds == tuple(HOLDS["call-good"]) and page.hold_ms == 5_500
    html = render_call_page(page, PageContext(ServerLinks()))
    bands = re.findall(r'<rect class="hold" data-kind="hold"[^>]*><title>([^<]*)</title>', html)
    assert bands == ["on hold 0:25–0:31 (5.5 s)"]
    assert 'id="hold-hatch"' in html and "on hold (both legs)</span>" in html
    unheld = read_call_page(source, filled.database, "call-rude")
    assert unheld is not None and unheld.holds == ()
    assert '<rect class="hold"' not in render_call_page(unheld, PageContext(ServerLinks()))


class WithoutHolds:
    """The rows of a store migrated before the ``holds`` column (migration 4): ``SELECT *`` has no such key."""

    def __init__(self, source: StoreRows) -> None:
        self.source = source

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "holds"} for r in self.source.rows(sql, params)]


def test_a_store_without_hold_times_shows_the_total_only(filled: FilledStore, source: StoreRows) -> None:
    page = read_call_page(WithoutHolds(source), filled.database, "call-good")
    assert page is not None and page.holds == () and page.hold_ms == 5_500
    html = render_call_page(page, PageContext(ServerLinks()))
    assert '<rect class="hold"' not in html
    assert "on hold (both legs) (total 5.5 s; this store keeps no hold times)</span>" in html


def test_sentiment_bands() -> None:
    assert [sentiment_class(v) for v in (None, -5, -2.5, -1.0, -0.9, 0, 0.99, 1.0, 2.49, 2.5, 5)] == [
        "sent-none", "sent-neg2", "sent-neg2", "sent-neg1", "sent-neu", "sent-neu", "sent-neu", "sent-pos1",
        "sent-pos1", "sent-pos2", "sent-pos2"]


def test_turn_at_prefers_the_turn_holding_the_offset_on_its_leg() -> None:
    from pipeline.web.data import Turn

    turns = [Turn(0, "agent", 0, 5_000, "a", None), Turn(1, "customer", 3_000, 8_000, "b", None),
             Turn(2, "agent", 9_000, 10_000, "c", None)]
    assert turn_at(turns, 4_000, "customer") == turns[1]
    assert turn_at(turns, 4_000, "agent") == turns[0]
    assert turn_at(turns, 8_500, "agent") == turns[0]  # between turns: the last one begun
    assert turn_at(turns, 2_000, "customer") is None


def test_report_html_writes_a_static_site_whose_links_all_land(filled: FilledStore, chdb_path: str,
                                                               tmp_path: Path) -> None:
    settings = Settings(clickhouse_url=f"chdb://{chdb_path}", clickhouse_database=filled.database)
    index, count = write_html(StoreSource(settings), settings, tmp_path / "site")
    assert (index, count) == (tmp_path / "site" / "index.html", 3)
    listing = index.read_text()
    assert "<form" not in listing  # nothing to filter with on a static page
    hrefs = Links(listing).hrefs
    assert sorted(hrefs) == sorted(["index.html", *(f"calls/{static_file_name(c)}" for c in filled.started)])
    for href in hrefs:
        target = index.parent / href
        assert target.is_file(), href
        if href == "index.html":
            continue
        page = Links(target.read_text())
        assert "../index.html" in page.hrefs and "/calls" not in page.hrefs
        assert {h[1:] for h in page.hrefs if h.startswith("#")} <= page.ids
    one, count = write_html(StoreSource(settings), settings, tmp_path / "one", call_id="call-good")
    assert count == 1 and [p.name for p in (tmp_path / "one" / "calls").iterdir()] == ["call-good.html"]
    _, count = write_html(StoreSource(settings), settings, tmp_path / "since",
                          since=datetime(2026, 3, 3, 9, 7))
    assert count == 2


def test_static_file_names_are_safe_and_distinct() -> None:
    assert static_file_name("CA1234abcd") == "CA1234abcd.html"
    odd = [static_file_name(i) for i in ("a/b", "a_b", "../x", "a b", "é")]
    assert len(set(odd)) == len(odd) and odd[1] == "a_b.html"
    assert all(re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\.html", name) for name in odd)
    assert StaticLinks(on_call_page=True).calls() == "../index.html"
    assert ServerLinks().call("a/b c") == "/calls/a%2Fb%20c"
    assert ServerLinks().calls({"date_from": date(2026, 3, 3).isoformat()}) == "/calls?date_from=2026-03-03"


def test_marked_puts_the_whole_phrase_in_mark_and_escapes_the_rest() -> None:
    from pipeline.web.render import marked

    assert str(marked("Cancel it? cancellation, CANCEL-IT <b>", ("cancel", "it"))) == (
        "<mark>Cancel it</mark>? cancellation, <mark>CANCEL-IT</mark> &lt;b&gt;")
    assert str(marked("a <b>", ())) == "a &lt;b&gt;"
