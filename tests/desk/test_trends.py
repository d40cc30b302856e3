"""An agent's weeks beside the team's (pipeline/desk/trends.py), on the embedded engine through the query
API's check: each figure computed by hand from the calls put in."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from pipeline.desk.trends import read_agent_trend
from tests.desk.conftest import CheckedRows

WEEK = 7 * 24 * 60  # minutes
GREET, CLOSE = "Did the agent greet the caller?", "Did the agent close the call properly?"


def test_an_agents_weeks_beside_the_teams(source: CheckedRows, add_call: Callable[..., None]) -> None:
    talk = {"agent_talk_share_pct": 60.0, "non_talk_pct": 10.0, "overtalk_ms": 3000.0, "duration_ms": 60_000.0}
    # Week of 2026-03-02: agent-7 scored 80 and 60 (the second auto-failed), one open call unscored.
    add_call("a1", [], score=80.0, items=((GREET, 1), (CLOSE, 1)), metrics=talk, sentiment=2.0)
    add_call("a2", [], minute=60, score=60.0, items=((GREET, 1), (CLOSE, 0)), auto_failed=True,
             metrics={**talk, "agent_talk_share_pct": 40.0, "overtalk_ms": 0.0}, sentiment=-1.0)
    add_call("a3", [], minute=90, score=None)
    # A colleague that week, and agent-7 two weeks later.
    add_call("b1", [], agent="agent-9", minute=30, score=30.0, items=((GREET, 0),), sentiment=-4.0)
    add_call("a4", [], minute=2 * WEEK, score=100.0, items=((GREET, 1),))

    trend = read_agent_trend(source, source.database, "agent-7", weeks=4)
    assert trend is not None and trend.calls() == 4
    first, last = date(2026, 3, 2), date(2026, 3, 16)
    assert trend.weeks == (date(2026, 2, 23), first, date(2026, 3, 9), last)  # up to the agent's latest call
    mine, team = trend.agent[first], trend.team[first]
    assert mine.calls == 3 and team.calls == 4
    assert mine.values["score_pct"] == 70.0 and team.values["score_pct"] == round((80 + 60 + 30) / 3, 2)
    assert mine.values["auto_fail_pct"] == 50.0 and mine.values["customer_sentiment"] == 0.5
    assert mine.values["agent_talk_share_pct"] == 50.0 and mine.values["non_talk_pct"] == 10.0
    assert mine.values["overtalk_pct"] == 2.5  # (5 % + 0 %) / 2
    assert team.values["agent_talk_share_pct"] == 50.0  # b1 has no such metric: not counted as 0
    assert mine.items == {GREET: 100.0, CLOSE: 50.0} and team.items == {GREET: round(200 / 3, 1), CLOSE: 50.0}
    assert date(2026, 3, 9) not in trend.agent and trend.agent[last].values["score_pct"] == 100.0
    assert trend.questions == [CLOSE, GREET]
    assert read_agent_trend(source, source.database, "nobody") is None
