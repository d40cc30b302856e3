"""The call pages' data: read-only SQL through a ``RowSource``, into typed dataclasses.

A ``RowSource`` runs one checked SELECT (``pipeline/store/sqlguard.py``) and gives rows as dicts: in the
worker, the /api/query path on the API's own pool and read-only clients (``views.py``); for
`callqa report --html`, the worker's /api/query or the store's read-only account (``pipeline/report.py``).
Values come as the store gives them (datetimes, tuples) or as JSON gives them (ISO text, lists): both read.

Columns that a newer schema adds (sentiment per turn and per call, hold and monologue times) are read
when they are there: calls and segments are read with ``*``, so a store migrated before them still
renders, without those figures (None, shown as "–"), never with an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol

from pipeline.api.paging import PageError, decode_cursor, encode_cursor
from pipeline.desk.review import Review, read_reviews
from pipeline.desk.search import (
    MatchedTurn,
    SearchError,
    SearchQuery,
    phrase_condition,
    turns_found,
    words_of,
)
from pipeline.store.queries import after_call_sql


class RowSource(Protocol):
    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]: ...


class FilterError(ValueError):
    """A list filter that cannot be read (a score that is not a number, a date that is not YYYY-MM-DD)."""


LIST_LIMIT = 500
# The list's orders, and the keyset each pages by (the first key: when a call started, or its score in
# hundredths of a point, an integer so a page's last call is compared exactly; then started_at, call_id).
SCORE_KEY = "toInt32(round(toFloat64(q.score_pct) * 100))"
SORTS = {
    "newest": "c.started_at DESC, c.call_id",
    "oldest": "c.started_at ASC, c.call_id",
    "lowest_score": f"{SCORE_KEY} ASC, c.started_at DESC, c.call_id",
    "highest_score": f"{SCORE_KEY} DESC, c.started_at DESC, c.call_id",
}


@dataclass(frozen=True)
class ListFilters:
    """The call list's filters, from the page's query parameters (all optional)."""

    agent: str | None = None
    queue: str | None = None
    score_min: float | None = None
    score_max: float | None = None
    failed: str | None = None  # a scorecard question the call failed
    date_from: date | None = None  # started on or after this day (UTC)
    date_to: date | None = None  # started on or before this day (UTC)
    category: str | None = None  # a category the call is in (rules/categories/*.yaml)
    # `callqa report --html`'s own filters (--since, --call); not in the page's form.
    since: datetime | None = None
    call_id: str | None = None
    # The page's place in the list: after this call (started_at, call_id), from the "older calls" link.
    after: tuple[datetime, str] | None = None
    # The search box: calls with a turn (of ``leg``) holding this phrase (pipeline/desk/search.py).
    phrase: str | None = None
    leg: str | None = None
    sort: str = "newest"  # one of SORTS; by score: scored calls only
    after_score: int | None = None  # with a score sort: the page's last call's score key

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise FilterError(f"sort must be one of {', '.join(SORTS)}, not {self.sort[:20]!r}")
        try:  # the search's own checks (a leg it knows, a phrase with words), as the API makes them
            SearchQuery(self.phrase or "", self.leg)
        except SearchError as exc:
            raise FilterError(str(exc)) from None

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(words_of(self.phrase or ""))

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> ListFilters:
        def text(name: str) -> str | None:
            value = (query.get(name) or "").strip()
            return value or None

        def number(name: str) -> float | None:
            value = text(name)
            try:
                return None if value is None else float(value)
            except ValueError:
                raise FilterError(f"{name} must be a number, not {value!r}") from None

        def day(name: str) -> date | None:
            value = text(name)
            try:
                return None if value is None else date.fromisoformat(value)
            except ValueError:
                raise FilterError(f"{name} must be a date (YYYY-MM-DD), not {value!r}") from None

        def cursor() -> tuple[datetime, str] | None:
            value = text("after")
            try:
                return None if value is None else decode_cursor(value)
            except PageError as exc:
                raise FilterError(str(exc)) from None

        after_score = text("after_score")
        if after_score is not None and not after_score.lstrip("-").isdigit():
            raise FilterError(f"after_score must be a whole number, not {after_score[:20]!r}")
        return cls(text("agent"), text("queue"), number("score_min"), number("score_max"), text("failed"),
                   day("date_from"), day("date_to"), category=text("category"), after=cursor(), phrase=text("q"),
                   leg=text("leg"), sort=text("sort") or "newest",
                   after_score=None if after_score is None else int(after_score))

    def as_query(self) -> dict[str, str]:
        """The filters that are set, as query parameters (the inverse of ``from_query``, without the page)."""
        values = {"agent": self.agent, "queue": self.queue, "score_min": self.score_min,
                  "score_max": self.score_max, "failed": self.failed, "date_from": self.date_from,
                  "date_to": self.date_to, "category": self.category, "q": self.phrase, "leg": self.leg,
                  "sort": None if self.sort == "newest" else self.sort}
        return {k: (f"{v:g}" if isinstance(v, float) else str(v)) for k, v in values.items() if v is not None}

    def sql(self, db: str) -> tuple[str, dict[str, Any]]:
        """WHERE clause over ``c`` (calls) and ``q`` (call_qa) of database ``db``, with its parameters."""
        where, params = ["1"], dict[str, Any]()
        if self.words:
            condition, found = phrase_condition(db, self.words, self.leg)
            where.append(condition)
            params.update(found)
        for column, name, value in (("c.agent_id", "agent", self.agent), ("c.queue", "queue", self.queue)):
            if value is not None:
                where.append(f"{column} = {{{name}:String}}")
                params[name] = value
        if self.category is not None:
            where.append("has(c.categories, {category:String})")
            params["category"] = self.category
        if self.score_min is not None:
            where.append("NOT empty(q.call_id) AND q.score_pct >= {score_min:Float64}")
            params["score_min"] = self.score_min
        if self.score_max is not None:
            where.append("NOT empty(q.call_id) AND q.score_pct <= {score_max:Float64}")
            params["score_max"] = self.score_max
        if self.failed is not None:
            where.append("has(arrayFilter((qq, pp) -> pp = 0, q.`items.question`, q.`items.passed`), "
                         "{failed:String})")
            params["failed"] = self.failed
        if self.since is not None:
            where.append("c.started_at >= {since:DateTime64(3, 'UTC')}")
            since = self.since.astimezone(UTC) if self.since.tzinfo else self.since  # naive: UTC already
            params["since"] = since.strftime("%Y-%m-%d %H:%M:%S")
        if self.call_id is not None:
            where.append("c.call_id = {call_id:String}")
            params["call_id"] = self.call_id
        if self.sort in ("lowest_score", "highest_score"):
            where.append("NOT empty(q.call_id)")
        if self.after is not None:  # keyset: the calls after this one in the list's order (see SORTS)
            where.append(self._after_sql())
            params["after_t"] = self.after[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            params["after_c"] = self.after[1]
            if self.sort in ("lowest_score", "highest_score"):
                params["after_s"] = self.after_score or 0
        if self.date_from is not None:
            where.append("c.started_at >= {date_from:DateTime64(3, 'UTC')}")
            params["date_from"] = f"{self.date_from.isoformat()} 00:00:00"
        if self.date_to is not None:
            where.append("c.started_at < {date_to:DateTime64(3, 'UTC')}")
            params["date_to"] = f"{(self.date_to + timedelta(days=1)).isoformat()} 00:00:00"
        return " AND ".join(where), params

    def _after_sql(self) -> str:
        newer = after_call_sql("c.")  # started before, or at the same time with a later call id
        if self.sort == "oldest":
            t = "{after_t:DateTime64(3, 'UTC')}"
            return f"(c.started_at > {t} OR (c.started_at = {t} AND c.call_id > {{after_c:String}}))"
        if self.sort == "newest":
            return newer
        past = ">" if self.sort == "lowest_score" else "<"
        return f"({SCORE_KEY} {past} {{after_s:Int32}} OR ({SCORE_KEY} = {{after_s:Int32}} AND {newer}))"

    def next_page(self, last: CallRow) -> dict[str, str]:
        """The query parameters of the page after the one ending with ``last`` (filters and order kept)."""
        page = {**self.as_query(), "after": encode_cursor(last.started_at, last.call_id)}
        if self.sort in ("lowest_score", "highest_score") and last.score_pct is not None:
            page["after_score"] = str(round(last.score_pct * 100))
        return page


@dataclass(frozen=True)
class CallRow:
    """One call of the list."""

    call_id: str
    tenant: str
    agent_id: str
    queue: str
    started_at: datetime
    end_reason: str | None  # end, abort, timeout; None while the call is open
    duration_s: float | None
    score_pct: float | None  # None until the call is scored
    auto_failed: bool | None
    failed_items: tuple[str, ...]
    items: int
    alerts: int
    customer_sentiment: float | None  # None: not in this store's schema
    # With a phrase searched: how many of its turns hold it, and the first few (pipeline/desk/search.py).
    matched: tuple[int, tuple[MatchedTurn, ...]] = (0, ())
    categories: tuple[str, ...] = ()


@dataclass(frozen=True)
class FilterOptions:
    """What the list's filter form offers."""

    agents: tuple[str, ...]
    queues: tuple[str, ...]
    questions: tuple[str, ...]
    categories: tuple[str, ...] = ()


@dataclass(frozen=True)
class Turn:
    """One final segment of one leg: its redacted text and, when the store has it, its sentiment."""

    index: int
    leg: str
    start_ms: int
    end_ms: int
    text: str
    sentiment: float | None

    @property
    def anchor(self) -> str:
        return f"turn-{self.index}"


@dataclass(frozen=True)
class Finding:
    """A QA event (rule match, missing phrase, violation, live alert) and the turn it points at."""

    rule: str
    category: str
    leg: str
    kind: str
    offset_ms: int
    text: str
    severity: str
    anchor: str | None


@dataclass(frozen=True)
class ScoreItem:
    question: str
    weight: float
    passed: bool
    rationale: str
    evidence: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class SentimentSummary:
    """Per call, on the −5..+5 scale; None where the store has no such column."""

    customer: float | None = None
    customer_start: float | None = None
    customer_end: float | None = None
    agent_start: float | None = None
    agent_end: float | None = None

    @property
    def known(self) -> bool:
        return any(v is not None for v in (self.customer, self.customer_start, self.customer_end,
                                           self.agent_start, self.agent_end))


@dataclass(frozen=True)
class CallPage:
    """One call in full."""

    call_id: str
    tenant: str
    agent_id: str
    queue: str
    direction: str
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    duration_ms: int
    turns: tuple[Turn, ...]
    score_pct: float | None
    auto_failed: bool | None
    items: tuple[ScoreItem, ...]
    metrics: dict[str, float]
    findings: tuple[Finding, ...]
    sentiment: SentimentSummary
    hold_ms: int | None
    holds: tuple[tuple[int, int], ...] = ()  # hold intervals, where the store keeps them
    # Secure pauses: the call's capture paused on purpose (payment), its audio never captured; not holds.
    paused_ms: int | None = None
    pauses: tuple[tuple[int, int], ...] = ()
    # Keypad tones found in the audio and silenced, (leg, start_ms, end_ms): how many and when, never which keys.
    keypad: tuple[tuple[str, int, int], ...] = ()
    longest_monologue_ms: int | None = None
    automatic_score_pct: float | None = None  # the score before any review; None: never reviewed
    reviewed_by: str = ""
    reviews: tuple[Review, ...] = ()  # oldest first (pipeline/desk/review.py)
    categories: tuple[str, ...] = ()
    recording_ms: int | None = None  # its redacted recording's length; None: no recording kept
    recording_cuts: int = 0  # stretches silenced in it (what the transcript redacted)

    @property
    def alerts(self) -> tuple[Finding, ...]:
        """The live alerts, in call time."""
        return tuple(f for f in self.findings if f.kind == "alert")


# --- SQL ---------------------------------------------------------------------------------------------

LIST_SQL = """
SELECT c.*, if(empty(q.call_id), NULL, q.score_pct) AS qa_score_pct,
       if(empty(q.call_id), NULL, q.auto_failed) AS qa_auto_failed,
       arrayFilter((qq, pp) -> pp = 0, q.`items.question`, q.`items.passed`) AS qa_failed,
       length(q.`items.question`) AS qa_items, e.alerts AS qa_alerts, q.metrics AS qa_metrics
FROM {db}.calls_deduped AS c
LEFT JOIN (SELECT * FROM {db}.call_qa_deduped) AS q ON q.call_id = c.call_id
LEFT JOIN (SELECT call_id, count() AS alerts FROM {db}.qa_events_deduped WHERE kind = 'alert' GROUP BY call_id)
    AS e ON e.call_id = c.call_id
WHERE {where}
ORDER BY {order}
LIMIT {limit}
"""
OPTIONS_SQL = """
SELECT arraySort(groupUniqArray(agent_id)) AS agents, arraySort(groupUniqArray(queue)) AS queues,
       arraySort(groupUniqArrayArray(categories)) AS categories
FROM {db}.calls_deduped
"""
QUESTIONS_SQL = """
SELECT DISTINCT arrayJoin(`items.question`) AS question FROM {db}.call_qa_deduped ORDER BY question
"""
CALL_SQL = "SELECT * FROM {db}.calls_deduped WHERE call_id = {{call:String}}"
TURNS_SQL = """
SELECT * FROM {db}.segments_deduped WHERE call_id = {{call:String}} AND is_final = 1
ORDER BY start_ms, leg, segment_id
"""
QA_SQL = """
SELECT *, `items.question` AS q, `items.weight` AS w, `items.passed` AS p, `items.rationale` AS r
FROM {db}.call_qa_deduped WHERE call_id = {{call:String}}
"""
EVENTS_SQL = """
SELECT rule, category, leg, kind, offset_ms, text, severity FROM {db}.qa_events_deduped
WHERE call_id = {{call:String}} ORDER BY offset_ms, rule, leg, kind
"""


def read_call_list(source: RowSource, db: str, filters: ListFilters | None = None,
                   limit: int = LIST_LIMIT) -> list[CallRow]:
    """The newest ``limit`` calls matching ``filters``."""
    filters = filters or ListFilters()
    where, params = filters.sql(db)
    rows = source.rows(LIST_SQL.format(db=db, where=where, order=SORTS[filters.sort], limit=int(limit)), params)
    # ClickHouse names a column of c.* that another joined table also has "c.<name>".
    calls = [_call_row({k.removeprefix("c."): v for k, v in r.items()}) for r in rows]
    if not filters.words:
        return calls
    found = turns_found(source, db, [c.call_id for c in calls], filters.words, filters.leg)
    return [replace(c, matched=found.get(c.call_id, (0, ()))) for c in calls]


def read_filter_options(source: RowSource, db: str) -> FilterOptions:
    found = source.rows(OPTIONS_SQL.format(db=db), {})
    head = found[0] if found else {"agents": [], "queues": [], "categories": []}
    questions = [r["question"] for r in source.rows(QUESTIONS_SQL.format(db=db), {})]
    return FilterOptions(tuple(a for a in head["agents"] if a), tuple(q for q in head["queues"] if q),
                         tuple(questions), tuple(head["categories"]))


def read_call_page(source: RowSource, db: str, call_id: str) -> CallPage | None:
    """One call in full, or None when the store has no such call."""
    calls = source.rows(CALL_SQL.format(db=db), {"call": call_id})
    if not calls:
        return None
    call = calls[0]
    rows = source.rows(TURNS_SQL.format(db=db), {"call": call_id})
    scores = _unscored_as_none([_optional_float(r, "sentiment") for r in rows])
    turns = tuple(Turn(i, r["leg"], int(r["start_ms"]), int(r["end_ms"]), r["text"], score)
                  for i, (r, score) in enumerate(zip(rows, scores, strict=True)))
    findings = tuple(_finding(e, turns) for e in source.rows(EVENTS_SQL.format(db=db), {"call": call_id}))
    qa = source.rows(QA_SQL.format(db=db), {"call": call_id})
    q = qa[0] if qa else None
    metrics = {k: float(v) for k, v in sorted((q["metrics"] if q else {}).items())}
    items = tuple(_score_items(q, findings)) if q else ()
    started = _datetime(call["started_at"])
    ended = _datetime(call["ended_at"]) if call.get("ended_at") else None
    return CallPage(
        call_id=call["call_id"], tenant=call.get("tenant", ""), agent_id=call.get("agent_id", ""),
        queue=call.get("queue", ""), direction=call.get("direction", ""), started_at=started, ended_at=ended,
        end_reason=call.get("end_reason") or None,
        duration_ms=_duration_ms(metrics, turns, started, ended),
        turns=turns,
        score_pct=None if q is None else round(float(q["score_pct"]), 2),
        auto_failed=None if q is None else bool(q["auto_failed"]),
        items=items, metrics=metrics, findings=findings,
        sentiment=_sentiment_summary(call, metrics),
        hold_ms=_optional_int(call, "hold_ms", metrics.get("hold_ms")),
        holds=_holds(call.get("holds")),
        paused_ms=_optional_int(call, "paused_ms", metrics.get("paused_ms")) or None,
        pauses=_holds(call.get("pauses")),
        keypad=_keypad(call.get("keypad")),
        longest_monologue_ms=_optional_int(call, "longest_monologue_ms", metrics.get("longest_monologue_ms")),
        automatic_score_pct=_optional_float(q, "automatic_score_pct") if q else None,
        reviewed_by=(q or {}).get("reviewed_by") or "",
        reviews=tuple(read_reviews(source, db, call_id)) if q and "reviewed_by" in q else (),
        categories=tuple(call.get("categories") or ()),
        **_recording(source, db, call_id),
    )


RECORDING_SQL = "SELECT duration_ms, length(cuts) AS cuts FROM {db}.recordings FINAL WHERE call_id = {{call:String}}"


def _recording(source: RowSource, db: str, call_id: str) -> dict[str, Any]:
    rows = source.rows(RECORDING_SQL.format(db=db), {"call": call_id})
    return {"recording_ms": int(rows[0]["duration_ms"]), "recording_cuts": int(rows[0]["cuts"])} if rows else {}


# --- rows to dataclasses -----------------------------------------------------------------------------


def _datetime(value: Any) -> datetime:
    """A DateTime64 column (UTC) from the store (datetime) or through the API (ISO 8601 text)."""
    found = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def _optional_float(row: Mapping[str, Any], column: str) -> float | None:
    value = row.get(column)
    return None if value is None else round(float(value), 3)


def _optional_int(row: Mapping[str, Any], column: str, fallback: float | None = None) -> int | None:
    """The column's value; where it is absent or 0 (a column added before the worker filled it), ``fallback``."""
    value = row.get(column) or fallback
    return None if value is None else int(value)


def _unscored_as_none(values: Sequence[float | None]) -> list[float | None]:
    """Sentiment columns all at exactly 0 were added by a migration but never scored: not known, not neutral."""
    return [None] * len(values) if all(v == 0 for v in values) else list(values)


SUMMARY_COLUMNS = ("customer_sentiment", "customer_sentiment_start", "customer_sentiment_end",
                   "agent_sentiment_start", "agent_sentiment_end")


def _sentiment_summary(call: Mapping[str, Any], metrics: Mapping[str, float]) -> SentimentSummary:
    """From the call's sentiment columns, else from the QA metrics of the same names, else unknown."""
    values = _unscored_as_none([_optional_float(call, c) for c in SUMMARY_COLUMNS])
    if all(v is None for v in values):
        values = [_optional_float(metrics, c) for c in SUMMARY_COLUMNS]
    return SentimentSummary(*values)


def _holds(value: Any) -> tuple[tuple[int, int], ...]:
    """Hold intervals, [(start_ms, end_ms)], where the store keeps them (the ``holds`` column of migration 4;
    a store migrated before it has none: no intervals). The column's named tuples come from the store as
    mappings ({"start_ms", "end_ms"}), through JSON as objects or, from older clients, as plain pairs."""
    if not value:
        return ()
    pairs = ((h["start_ms"], h["end_ms"]) if isinstance(h, Mapping) else (h[0], h[1]) for h in value)
    return tuple(sorted((int(a), int(b)) for a, b in pairs))


def _keypad(value: Any) -> tuple[tuple[str, int, int], ...]:
    """Keypad tones, [(leg, start_ms, end_ms)], where the store keeps them (migration 16; none before), as
    ``_holds`` reads its intervals: mappings from the store or JSON objects, plain triples otherwise."""
    if not value:
        return ()
    tones = ((t["leg"], t["start_ms"], t["end_ms"]) if isinstance(t, Mapping) else (t[0], t[1], t[2]) for t in value)
    return tuple(sorted(((str(leg), int(a), int(b)) for leg, a, b in tones), key=lambda t: (t[1], t[0])))


def _duration_ms(metrics: Mapping[str, float], turns: Sequence[Turn], started: datetime,
                 ended: datetime | None) -> int:
    """The QA's call duration, else the call's wall time, else the end of its last turn."""
    if metrics.get("duration_ms"):
        return int(metrics["duration_ms"])
    last = max((t.end_ms for t in turns), default=0)
    if ended is not None:
        return max(last, int((ended - started).total_seconds() * 1000))
    return last


def _call_row(r: Mapping[str, Any]) -> CallRow:
    started = _datetime(r["started_at"])
    ended = _datetime(r["ended_at"]) if r.get("ended_at") else None
    metrics = r.get("qa_metrics") or {}
    if metrics.get("duration_ms"):
        duration: float | None = float(metrics["duration_ms"]) / 1000
    else:
        duration = None if ended is None else (ended - started).total_seconds()
    scored = r["qa_score_pct"] is not None
    return CallRow(
        call_id=r["call_id"], tenant=r.get("tenant", ""), agent_id=r.get("agent_id", ""), queue=r.get("queue", ""),
        started_at=started, end_reason=r.get("end_reason") or None, duration_s=duration,
        score_pct=round(float(r["qa_score_pct"]), 2) if scored else None,
        auto_failed=bool(r["qa_auto_failed"]) if scored else None,
        failed_items=tuple(r["qa_failed"] or ()), items=int(r["qa_items"] or 0), alerts=int(r["qa_alerts"] or 0),
        customer_sentiment=_optional_float(r, "customer_sentiment") if r.get("customer_sentiment")
        else _optional_float(metrics, "customer_sentiment"),
        categories=tuple(r.get("categories") or ()),
    )


def turn_at(turns: Sequence[Turn], offset_ms: int, leg: str = "") -> Turn | None:
    """The turn of ``leg`` (any leg when empty) holding ``offset_ms``, else the last one begun before it."""
    mine = [t for t in turns if not leg or t.leg == leg]
    holding = [t for t in mine if t.start_ms <= offset_ms < t.end_ms]
    if holding:
        return holding[0]
    before = [t for t in mine if t.start_ms <= offset_ms]
    return before[-1] if before else None


def _finding(e: Mapping[str, Any], turns: Sequence[Turn]) -> Finding:
    offset, kind = int(e["offset_ms"]), e["kind"]
    # A phrase that was never said has no turn to point at.
    turn = None if kind == "missing" else turn_at(turns, offset, e["leg"])
    return Finding(e["rule"], e["category"], e["leg"], kind, offset, e["text"], e["severity"],
                   turn.anchor if turn else None)


_RULE_OF_RATIONALE = re.compile(r"^rule (\S+): ")


def _score_items(q: Mapping[str, Any], findings: Sequence[Finding]) -> list[ScoreItem]:
    """The scorecard; an item answered by a rule gets that rule's findings as evidence (the rationale
    names the rule: pipeline/qa/scorecard.py)."""
    items = []
    for question, weight, passed, rationale in zip(q["q"], q["w"], q["p"], q["r"], strict=True):
        found = _RULE_OF_RATIONALE.match(rationale)
        evidence = tuple(f for f in findings if found and f.rule == found.group(1) and f.anchor)
        items.append(ScoreItem(question, float(weight), bool(passed), rationale, evidence))
    return items
