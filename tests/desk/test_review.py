"""Human review (pipeline/desk/review.py) on the embedded engine: a review is kept with the verdict it
overturned, the call is re-scored as the scorecard scores, the automatic score stays beside it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.desk.review import ReviewError, read_reviews, submit_review
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import Scorecard, load_scorecard
from tests.desk.conftest import T0, CheckedRows

RULES = Path(__file__).resolve().parents[2] / "rules"
GREETING = "Did the agent greet the caller within the first 30 seconds?"
DISCLOSURE = "Was the caller told that the call is recorded?"


@pytest.fixture(scope="module")
def scorecard() -> Scorecard:
    return load_scorecard(RULES / "scorecards" / "default.yaml", load_rules(RULES))


def qa_row(store: Client, call_id: str) -> dict[str, object]:
    found = store.query("SELECT * FROM call_qa_deduped WHERE call_id = {c:String}", parameters={"c": call_id})
    return dict(zip(found.column_names, found.result_rows[0], strict=True))


def test_an_overturned_item_rescores_the_call_and_keeps_the_automatic_verdict(
    store: Client, source: CheckedRows, scorecard: Scorecard, add_call: Callable[..., None]
) -> None:
    # The machine missed the disclosure: an auto-fail, score 0.
    add_call("c1", [], score=0.0, auto_failed=True, items=((GREETING, 1), (DISCLOSURE, 0)))
    db = source.database
    submit_review(store, db, scorecard, "c1", "recording_disclosure", "pass", "said at 0:42, ASR missed it", "maria",
                  now=T0 + timedelta(hours=1))
    row = qa_row(store, "c1")
    assert row["score_pct"] == 100.0 and row["auto_failed"] == 0  # 10 + 15 of 25
    assert row["automatic_score_pct"] == 0.0 and row["reviewed_by"] == "maria"
    assert row["items.passed"] == [1, 1] and row["items.rationale"][1] == "reviewed by maria: said at 0:42, ASR missed it"

    submit_review(store, db, scorecard, "c1", "greeting", "fail", "no greeting, only 'yes?'", "li",
                  now=T0 + timedelta(hours=2))
    row = qa_row(store, "c1")
    assert row["score_pct"] == 60.0 and row["automatic_score_pct"] == 0.0 and row["reviewed_by"] == "li"
    # Not applicable after all: the item leaves the score; its automatic verdict is still the machine's.
    submit_review(store, db, scorecard, "c1", "recording_disclosure", "na", "internal test call", "maria",
                  now=T0 + timedelta(hours=3))
    row = qa_row(store, "c1")
    assert row["items.question"] == [GREETING] and row["score_pct"] == 0.0

    reviews = read_reviews(source, db, "c1")  # through the query API's check: analysts read them too
    assert [(r.item, r.automatic, r.verdict, r.reviewer) for r in reviews] == [
        ("recording_disclosure", "fail", "pass", "maria"), ("greeting", "pass", "fail", "li"),
        ("recording_disclosure", "fail", "na", "maria")]
    assert all(r.overturned for r in reviews) and reviews[0].reviewed_at == T0 + timedelta(hours=1)


def test_a_review_that_cannot_be_taken_says_why(store: Client, scorecard: Scorecard,
                                                 add_call: Callable[..., None]) -> None:
    add_call("c1", [], items=((GREETING, 1),))
    db = store.database or ""
    with pytest.raises(ReviewError, match="no item 'greting' in scorecard 'default'"):
        submit_review(store, db, scorecard, "c1", "greting", "pass", "x", "maria")
    with pytest.raises(ReviewError, match="verdict must be one of pass, fail, na"):
        submit_review(store, db, scorecard, "c1", "greeting", "maybe", "x", "maria")
    with pytest.raises(ReviewError, match="needs its reason"):
        submit_review(store, db, scorecard, "c1", "greeting", "fail", "  ", "maria")
    with pytest.raises(ReviewError, match="no scored call 'c9'"):
        submit_review(store, db, scorecard, "c9", "greeting", "fail", "x", "maria")
    assert store.query("SELECT count() FROM reviews").result_rows == [(0,)]
