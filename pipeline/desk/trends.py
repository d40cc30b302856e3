"""An agent's trend over weeks, the team beside it: what a supervisor coaches from.

Per ISO week (Monday, UTC) of the calls' starts, for the agent and for every agent of the store (the team):
calls, mean QA score, auto-fail share, the customer's mean sentiment (−5..+5), the agent's share of the
talk, non-talk (silence) share, overtalk share of the call, and each scorecard item's pass rate. Scored calls
only count towards the QA figures; a call's latest revision is read (the ``*_deduped`` views). The window:
``weeks`` weeks up to the agent's latest call, so a store of past calls shows their weeks, not empty ones.
Every read is one checked SELECT through a ``RowSource``, as the call pages read (``/api/query``'s path).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pipeline.desk.search import RowSource

WEEKS = 12
# (figure, label, unit) in the order the page shows them; the keys of WeekFigures.values.
FIGURES = (
    ("score_pct", "QA score", "%"),
    ("auto_fail_pct", "auto-failed calls", "%"),
    ("customer_sentiment", "customer sentiment", ""),
    ("agent_talk_share_pct", "agent's share of talk", "%"),
    ("non_talk_pct", "non-talk (silence)", "%"),
    ("overtalk_pct", "overtalk", "%"),
)


@dataclass(frozen=True)
class WeekFigures:
    calls: int = 0
    values: dict[str, float | None] = field(default_factory=dict)  # FIGURES' keys; None: no scored call
    items: dict[str, float] = field(default_factory=dict)  # scorecard question -> pass rate %


@dataclass(frozen=True)
class AgentTrend:
    agent_id: str
    weeks: tuple[date, ...]  # Mondays, oldest first
    agent: dict[date, WeekFigures]
    team: dict[date, WeekFigures]

    @property
    def questions(self) -> list[str]:
        """Every scorecard item the agent or the team was scored on in the window."""
        return sorted({q for figures in (*self.agent.values(), *self.team.values()) for q in figures.items})

    def calls(self) -> int:
        return sum(f.calls for f in self.agent.values())


_LATEST_SQL = "SELECT max(started_at) AS latest FROM {db}.calls_deduped WHERE agent_id = {{agent:String}}"

_WEEKS_SQL = """
SELECT toMonday(c.started_at) AS week, count() AS calls,
       avgIf(q.score_pct, NOT empty(q.call_id)) AS score_pct,
       100 * avgIf(q.auto_failed, NOT empty(q.call_id)) AS auto_fail_pct,
       avgIf(c.customer_sentiment, NOT empty(q.call_id)) AS customer_sentiment,
       avgIf(q.metrics['agent_talk_share_pct'], mapContains(q.metrics, 'agent_talk_share_pct')) AS agent_talk_share_pct,
       avgIf(q.metrics['non_talk_pct'], mapContains(q.metrics, 'non_talk_pct')) AS non_talk_pct,
       avgIf(100 * q.metrics['overtalk_ms'] / q.metrics['duration_ms'], q.metrics['duration_ms'] > 0) AS overtalk_pct
FROM {db}.calls_deduped AS c
LEFT JOIN (SELECT call_id, score_pct, auto_failed, metrics FROM {db}.call_qa_deduped) AS q ON q.call_id = c.call_id
WHERE {where}
GROUP BY week ORDER BY week
"""

_ITEMS_SQL = """
SELECT toMonday(c.started_at) AS week, item.1 AS question, 100 * avg(item.2) AS pass_pct
FROM {db}.calls_deduped AS c
INNER JOIN (SELECT call_id, arrayZip(`items.question`, `items.passed`) AS items FROM {db}.call_qa_deduped) AS q
    ON q.call_id = c.call_id
ARRAY JOIN q.items AS item
WHERE {where}
GROUP BY week, question ORDER BY week, question
"""


def read_agent_trend(source: RowSource, db: str, agent_id: str, weeks: int = WEEKS) -> AgentTrend | None:
    """The agent's weeks and the team's, or None when the store has no call of the agent."""
    latest = source.rows(_LATEST_SQL.format(db=db), {"agent": agent_id})
    if not latest or not latest[0]["latest"] or _moment(latest[0]["latest"]).year < 1980:  # max() of no rows
        return None
    last_monday = _moment(latest[0]["latest"]).date() - timedelta(days=_moment(latest[0]["latest"]).weekday())
    mondays = tuple(last_monday - timedelta(weeks=n) for n in range(weeks - 1, -1, -1))
    window = {"since": f"{mondays[0].isoformat()} 00:00:00", "until": f"{(last_monday + timedelta(weeks=1)).isoformat()} 00:00:00"}
    span = "c.started_at >= {since:DateTime64(3, 'UTC')} AND c.started_at < {until:DateTime64(3, 'UTC')}"
    mine = f"{span} AND c.agent_id = {{agent:String}}"
    return AgentTrend(agent_id, mondays, _weeks(source, db, mine, {**window, "agent": agent_id}),
                      _weeks(source, db, span, window))


def _weeks(source: RowSource, db: str, where: str, params: dict[str, Any]) -> dict[date, WeekFigures]:
    items: dict[date, dict[str, float]] = defaultdict(dict)
    for row in source.rows(_ITEMS_SQL.format(db=db, where=where), params):
        items[_day(row["week"])][row["question"]] = round(float(row["pass_pct"]), 1)
    return {_day(row["week"]): WeekFigures(int(row["calls"]), {key: _number(row[key]) for key, _, _ in FIGURES},
                                           items.get(_day(row["week"]), {}))
            for row in source.rows(_WEEKS_SQL.format(db=db, where=where), params)}


def _number(value: Any) -> float | None:
    # avgIf of no row is NaN (nan through JSON is null): no scored call that week.
    if value is None or value != value:
        return None
    return round(float(value), 2)


def _moment(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _day(value: Any) -> date:
    return value if isinstance(value, date) and not isinstance(value, datetime) else date.fromisoformat(str(value)[:10])
