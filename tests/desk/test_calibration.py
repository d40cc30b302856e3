"""Calibration (pipeline/desk/calibration.py): the standing review of each call and item against the machine,
per item, kappa computed by hand; and read from reviews stored through submit_review."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from clickhouse_connect.driver.client import Client

from pipeline.desk.calibration import calibrate, cohen_kappa, read_calibration
from pipeline.desk.review import submit_review
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import load_scorecard
from tests.desk.conftest import T0, CheckedRows

RULES = Path(__file__).resolve().parents[2] / "rules"
GREETING = "Did the agent greet the caller within the first 30 seconds?"
DISCLOSURE = "Was the caller told that the call is recorded?"


def test_kappa_by_hand() -> None:
    # 10 items: machine pass 6 / fail 4, human pass 5 / fail 5, 7 agree: po = .7, pe = (6*5 + 4*5) / 100 = .5
    pairs = [("pass", "pass")] * 4 + [("pass", "fail")] * 2 + [("fail", "fail")] * 3 + [("fail", "pass")]
    assert cohen_kappa(pairs) == 0.4
    assert cohen_kappa([("pass", "pass")] * 3) is None  # one verdict on both sides: nothing beyond chance
    assert cohen_kappa([]) is None


def test_the_items_overturned_most_come_first() -> None:
    rows = ([{"item": "greeting", "automatic": "pass", "verdict": "pass"}] * 3
            + [{"item": "closing", "automatic": "fail", "verdict": "pass"}, {"item": "closing", "automatic": "pass",
                                                                             "verdict": "fail"},
               {"item": "closing", "automatic": "na", "verdict": "fail"}, {"item": "closing", "automatic": "pass",
                                                                           "verdict": "pass"}])
    closing, greeting = calibrate(rows)
    assert (closing.item, closing.reviewed, closing.agreed, closing.pass_to_fail, closing.fail_to_pass,
            closing.other, closing.overturned_pct) == ("closing", 4, 1, 1, 1, 1, 75.0)
    assert greeting.overturned == 0 and greeting.kappa is None


def test_the_latest_review_of_a_call_stands(store: Client, source: CheckedRows, add_call: Callable[..., None]) -> None:
    scorecard = load_scorecard(RULES / "scorecards" / "default.yaml", load_rules(RULES))
    add_call("c1", [], items=((GREETING, 1), (DISCLOSURE, 0)))
    add_call("c2", [], items=((GREETING, 1),))
    db = source.database
    submit_review(store, db, scorecard, "c1", "greeting", "fail", "no greeting", "li", now=T0 + timedelta(hours=1))
    submit_review(store, db, scorecard, "c1", "greeting", "pass", "on second listen, it was", "maria",
                  now=T0 + timedelta(hours=2))
    submit_review(store, db, scorecard, "c1", "recording_disclosure", "pass", "said late", "li",
                  now=T0 + timedelta(hours=3))
    submit_review(store, db, scorecard, "c2", "greeting", "fail", "not within 30 s", "li", now=T0 + timedelta(hours=4))
    found = {c.item: c for c in read_calibration(source, db)}
    assert (found["greeting"].reviewed, found["greeting"].agreed, found["greeting"].pass_to_fail) == (2, 1, 1)
    assert found["recording_disclosure"].fail_to_pass == 1
    later = read_calibration(source, db, since=T0 + timedelta(hours=3, minutes=30))
    assert [(c.item, c.reviewed) for c in later] == [("greeting", 1)]
