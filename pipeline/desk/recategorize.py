"""`callqa recategorize`: the categories of rules/categories/*.yaml applied again to stored calls.

Categories are written with a call's calls row when it ends (and by each post-call pass). After the
categories (or the rules they combine) change, this applies them to the calls already stored, from the QA
events each call's latest revision holds — no audio is decoded again, so a month of calls takes seconds.
A call whose categories change gets its calls row written again (a later ``updated_at`` replaces it);
the others are left as they are. It writes with the store's writer account (``CALLQA_CLICKHOUSE_URL``: a
server, or a stopped worker's embedded store, as `callqa retranscribe`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.qa.categories import Category, categorize
from pipeline.qa.rules import QaEvent

BATCH = 1000
_CALLS_SQL = """
SELECT * FROM {db}.calls_deduped WHERE end_reason != '' AND started_at >= {{since:DateTime64(3, 'UTC')}}
ORDER BY started_at, call_id
"""
_EVENTS_SQL = """
SELECT call_id, rule, kind FROM {db}.qa_events_deduped
WHERE call_id IN (SELECT call_id FROM {db}.calls_deduped WHERE end_reason != ''
                  AND started_at >= {{since:DateTime64(3, 'UTC')}})
"""


@dataclass(frozen=True)
class Recategorized:
    calls: int  # ended calls looked at
    changed: dict[str, tuple[list[str], list[str]]]  # call id -> (categories before, after)


def recategorize(client: Client, db: str, categories: tuple[Category, ...], since: datetime | None = None,
                 progress: Callable[[int, int], None] = lambda done, total: None) -> Recategorized:
    moment = (since or datetime(1970, 1, 1, tzinfo=UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    held: dict[str, list[QaEvent]] = defaultdict(list)
    for row in client.query(_EVENTS_SQL.format(db=db), parameters={"since": moment}).named_results():
        held[row["call_id"]].append(QaEvent(row["rule"], "", "", row["kind"], 0, "", ""))
    result = client.query(_CALLS_SQL.format(db=db), parameters={"since": moment})
    columns, rows = list(result.column_names), result.result_rows
    changed: dict[str, tuple[list[str], list[str]]] = {}
    pending: list[list[Any]] = []
    now = datetime.now(UTC)
    for n, values in enumerate(rows, start=1):
        call = dict(zip(columns, values, strict=True))
        after = categorize(held.get(call["call_id"], ()), categories)
        if list(call["categories"]) != after:
            changed[call["call_id"]] = (list(call["categories"]), after)
            pending.append(list({**call, "categories": after, "updated_at": now}.values()))
        if len(pending) >= BATCH or n == len(rows):
            if pending:
                client.insert(f"{db}.calls", pending, column_names=columns)
            pending = []
            progress(n, len(rows))
    return Recategorized(len(rows), changed)
