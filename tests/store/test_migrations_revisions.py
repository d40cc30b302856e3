"""Migrations 5 and 6: calls, call_qa, segments and qa_events key on the revision of the pass that wrote them, and
every reader (the views, the query functions, the call pages, `callqa report`, the dashboards) shows each
call's latest revision: the post-call pass's result where there is one, else the live one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.report import read_report
from pipeline.store.client import connect
from pipeline.store.migrations import MIGRATIONS, migrate
from pipeline.store.queries import call_summary, transcript
from pipeline.web.data import read_call_list, read_call_page

Insert = Callable[[Client, str, list[dict[str, Any]]], None]


class ClientRows:
    """The readers' RowSource over a clickhouse-connect client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        result = self.client.query(sql, parameters=params)
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def _qa(call_id: str, score: float, computed_at: datetime, revision: int | None = None) -> dict[str, Any]:
    row = {"call_id": call_id, "tenant": "acme", "agent_id": "agent-7", "auto_failed": 0, "score_pct": score,
           "metrics": {"silence_pct": 10.0}, "items.question": ["greeted"], "items.weight": [1.0],
           "items.passed": [1 if score > 50 else 0], "items.rationale": ["-"], "computed_at": computed_at}
    return row if revision is None else dict(row, revision=revision)


def _event(call_id: str, rule: str, kind: str, at: datetime, revision: int | None = None) -> dict[str, Any]:
    row = {"call_id": call_id, "rule": rule, "category": "compliance", "leg": "agent", "kind": kind, "offset_ms": 900,
           "text": "-", "severity": "high", "detected_at": at}
    return row if revision is None else dict(row, revision=revision)


def test_rows_written_before_are_the_live_pass_and_a_later_revision_replaces_them_for_readers(
        t0: datetime, store_url: str, database: str, insert: Insert, make_call: Callable[..., Any],
        make_segment: Callable[..., Any]) -> None:
    client = connect(store_url, database)
    try:
        migrate(client, database, MIGRATIONS[:4])  # a store as it was, with two calls in it
        for call in ("c1", "c2"):
            insert(client, "calls", [make_call(call, ended=True, updated_at=t0 + timedelta(minutes=3))])
            insert(client, "segments", [make_segment(call, "agent", 0, "hello there"),
                                        make_segment(call, "customer", 900, "my card is lost")])
            insert(client, "call_qa", [_qa(call, 40.0, t0 + timedelta(minutes=4))])
            insert(client, "qa_events", [_event(call, "disclosure", "missing", t0 + timedelta(minutes=4)),
                                         _event(call, "abuse", "alert", t0 + timedelta(minutes=2))])
        assert migrate(client, database) == [m.version for m in MIGRATIONS[4:]]
        assert client.query("SELECT DISTINCT revision FROM segments").result_rows == [(0,)]

        # The post-call pass of c1 (revision 1): other segment boundaries, other words, another score.
        insert(client, "calls", [make_call("c1", ended=True, updated_at=t0 + timedelta(minutes=9)) | {"revision": 1}])
        insert(client, "segments", [make_segment("c1", "agent", 0, "hello there sir") | {"revision": 1}])
        insert(client, "call_qa", [_qa("c1", 90.0, t0 + timedelta(minutes=9), revision=1)])
        # Its verdicts (migration 6): the disclosure was found this time, and the abuse alert was a misheard word.
        insert(client, "qa_events", [_event("c1", "disclosure", "match", t0 + timedelta(minutes=9), revision=1)])
        # A replay of the live pass after it (at-least-once) must not bring the live result back.
        insert(client, "call_qa", [_qa("c1", 40.0, t0 + timedelta(minutes=20))])

        assert [line.text for line in transcript(client, "c1")] == ["hello there sir"]
        assert [line.text for line in transcript(client, "c2")] == ["hello there", "my card is lost"]
        c1 = call_summary(client, "c1")
        assert c1 is not None and c1.score_pct == 90.0 and c1.final_segments == 1
        assert client.query("SELECT revision, count() FROM segments FINAL WHERE call_id = 'c1' GROUP BY revision "
                            "ORDER BY revision").result_rows == [(0, 2), (1, 1)]  # both passes kept

        source = ClientRows(client)
        listed = {row.call_id: row for row in read_call_list(source, database)}
        assert set(listed) == {"c1", "c2"} and listed["c1"].score_pct == 90.0 and listed["c2"].score_pct == 40.0
        assert listed["c1"].alerts == 0 and listed["c2"].alerts == 1  # the live alert is c2's only
        page = read_call_page(source, database, "c1")
        assert page is not None and [turn.text for turn in page.turns] == ["hello there sir"]
        assert [(f.rule, f.kind) for f in page.findings] == [("disclosure", "match")]
        assert client.query("SELECT revision, count() FROM qa_events FINAL WHERE call_id = 'c1' GROUP BY revision "
                            "ORDER BY revision").result_rows == [(0, 2), (1, 1)]
        report = read_report(source, database, call_id="c1")
        assert report.calls[0].score_pct == 90.0 and report.call is not None
        assert report.call.score_pct == 90.0 and [line.text for line in report.call.transcript] == ["hello there sir"]

        # Running the migration's statements again changes nothing (two workers may migrate at once).
        for statement in (*MIGRATIONS[4].statements, *MIGRATIONS[5].statements):
            client.command(statement.format(db=database))
        assert [line.text for line in transcript(client, "c1")] == ["hello there sir"]
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")
