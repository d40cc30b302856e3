"""Calibration: how often supervisors overturn the machine, per scorecard item.

For each call and item reviewed, its latest review stands: the machine's verdict (``automatic``) against the
reviewer's. Per item: calls reviewed, agreed, overturned each way (pass → fail, fail → pass, and to or from
"not applicable"), and Cohen's kappa of the two over pass, fail and na — agreement beyond what chance gives
with each side's own mix: 1 is full agreement, 0 no better than chance (None where chance already agrees
on everything: one verdict only on both sides). The items overturned most come first: where auto-QA is
least trusted, and the first rules to fix.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.desk.review import VERDICTS
from pipeline.desk.search import RowSource

_LATEST_SQL = """
SELECT call_id, item, argMax(automatic, (reviewed_at, review_id)) AS automatic,
       argMax(verdict, (reviewed_at, review_id)) AS verdict
FROM {db}.reviews FINAL
WHERE reviewed_at >= {{since:DateTime64(3, 'UTC')}}
GROUP BY call_id, item
"""


@dataclass(frozen=True)
class ItemCalibration:
    item: str
    reviewed: int
    agreed: int
    pass_to_fail: int
    fail_to_pass: int
    other: int  # to or from "not applicable"
    kappa: float | None

    @property
    def overturned(self) -> int:
        return self.reviewed - self.agreed

    @property
    def overturned_pct(self) -> float:
        return round(100 * self.overturned / self.reviewed, 1) if self.reviewed else 0.0


def cohen_kappa(pairs: list[tuple[str, str]]) -> float | None:
    """Cohen's kappa of (machine, human) verdicts; None when chance agreement is 1 (nothing to beat)."""
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(a == b for a, b in pairs) / n
    machine, human = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    expected = sum(machine[v] * human[v] for v in VERDICTS) / (n * n)
    if expected >= 1.0:
        return None
    return round((observed - expected) / (1 - expected), 3)


def calibrate(rows: list[dict[str, Any]]) -> list[ItemCalibration]:
    """Per item, from each (call, item)'s standing review; most overturned first."""
    pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in rows:
        pairs[row["item"]].append((row["automatic"], row["verdict"]))
    items = [ItemCalibration(item, len(p), sum(a == b for a, b in p), sum(p_ == ("pass", "fail") for p_ in p),
                             sum(p_ == ("fail", "pass") for p_ in p),
                             sum(a != b and "na" in (a, b) for a, b in p), cohen_kappa(p))
             for item, p in pairs.items()]
    return sorted(items, key=lambda c: (-c.overturned_pct, -c.overturned, c.item))


def read_calibration(source: RowSource, db: str, since: datetime | None = None) -> list[ItemCalibration]:
    moment = (since or datetime(1970, 1, 1, tzinfo=UTC)).astimezone(UTC)
    return calibrate(source.rows(_LATEST_SQL.format(db=db),
                                 {"since": moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}))
