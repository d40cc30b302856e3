"""`callqa recategorize` (pipeline/desk/recategorize.py): stored calls get the categories their stored QA events
make, and only the calls whose categories change are written again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from clickhouse_connect.driver.client import Client

from pipeline.desk.recategorize import recategorize
from pipeline.qa.categories import load_categories
from pipeline.qa.rules import load_rules
from tests.desk.conftest import T0, insert

RULES = Path(__file__).resolve().parents[2] / "rules"


def test_stored_calls_get_their_categories_again(store: Client, add_call: Callable[..., None]) -> None:
    categories = load_categories(RULES, load_rules(RULES))
    db = store.database or ""
    add_call("c1", [], failed=("recording_disclosure",))  # a must rule missing: no_disclosure
    add_call("c2", [], minute=5)
    insert(store, "qa_events", [{"call_id": "c2", "rule": rule, "category": "x", "leg": "customer", "kind": kind,
                                 "offset_ms": 1000, "text": "", "severity": "info", "detected_at": T0, "revision": 0}
                                for rule, kind in (("escalation_request", "alert"), ("recording_disclosure", "match"),
                                                   ("identity_verification", "match"))])
    seen: list[tuple[int, int]] = []
    done = recategorize(store, db, categories, progress=lambda n, total: seen.append((n, total)))
    assert done.calls == 2 and seen[-1] == (2, 2)
    assert done.changed == {"c1": ([], ["no_disclosure", "unverified_caller"]), "c2": ([], ["escalation"])}
    stored = dict(store.query("SELECT call_id, categories FROM calls_deduped ORDER BY call_id").result_rows)
    assert stored == {"c1": ["no_disclosure", "unverified_caller"], "c2": ["escalation"]}
    assert recategorize(store, db, categories).changed == {}  # nothing moves the second time
    # Since: the calls started before are left alone.
    assert recategorize(store, db, (), since=T0 + timedelta(minutes=1)).changed == {"c2": (["escalation"], [])}
