"""Human review of a call's scorecard: a supervisor overturns an item, the call is re-scored.

A review names an item of the scorecard by its id (``rules/scorecards/*.yaml``: ``greeting``,
``recording_disclosure``...), a verdict (``pass``, ``fail``, ``na``: not applicable), a reason and who
reviewed. It is kept as a row of ``reviews`` that nothing rewrites (a later review of the same item adds a
row; the latest one stands), with the automatic verdict it overturned. The call's QA row is written again
(same revision, a later ``computed_at``, so it replaces the one before) with the reviewed items, the score
and automatic fail computed from them as the scorecard computes them (``score_of``), the score before any
review in ``automatic_score_pct`` and the last reviewer in ``reviewed_by``: every reader of ``call_qa``
(the list, the pages, search, trends, dashboards) shows the reviewed score, and the automatic one is kept.

``review_call`` is the pure step (a QA row and the reviews before in, the review and the new QA row out);
``submit_review`` reads and writes through a ClickHouse client (the store's writer: a worker's own, or the
store itself when no worker holds it); ``read_reviews`` reads through a ``RowSource``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.desk.search import RowSource
from pipeline.qa.scorecard import Scorecard, ScoreItem, score_of

VERDICTS = ("pass", "fail", "na")
MAX_REASON = 2000


class ReviewError(ValueError):
    """A review that cannot be taken: no such call or item, a verdict not known, no reason; says which."""


@dataclass(frozen=True)
class Review:
    review_id: str
    call_id: str
    item: str  # the scorecard item's id
    question: str
    automatic: str  # pass|fail|na: the machine's verdict of the item
    verdict: str  # pass|fail|na: the reviewer's
    reason: str
    reviewer: str
    revision: int  # of the call's QA reviewed
    reviewed_at: datetime

    @property
    def overturned(self) -> bool:
        return self.verdict != self.automatic


def verdict_of(passed: bool | None) -> str:
    return "na" if passed is None else "pass" if passed else "fail"


def review_call(qa: Mapping[str, Any], scorecard: Scorecard, earlier: Sequence[Review], item: str, verdict: str,
                reason: str, reviewer: str, now: datetime, review_id: str | None = None
                ) -> tuple[Review, dict[str, Any]]:
    """The review of ``item`` on the call whose QA row (``call_qa_deduped``, every column) is ``qa``, given the
    call's ``earlier`` reviews; and the call's QA row with it applied."""
    question = next((q for q in scorecard.questions if q.id == item), None)
    if question is None:
        raise ReviewError(f"no item {item!r} in scorecard {scorecard.name!r} (items: "
                          f"{', '.join(q.id for q in scorecard.questions)})")
    if verdict not in VERDICTS:
        raise ReviewError(f"verdict must be one of {', '.join(VERDICTS)}, not {verdict[:20]!r}")
    if not reason.strip() or len(reason) > MAX_REASON:
        raise ReviewError(f"a review needs its reason (1 to {MAX_REASON} characters)")
    reviewer = reviewer.strip() or "unnamed"
    answered = dict(zip(qa["items.question"], qa["items.passed"], strict=True))
    current = verdict_of(None if question.question not in answered else bool(answered[question.question]))
    first = next((r for r in earlier if r.item == item), None)  # the automatic verdict, before any review
    review = Review(review_id or uuid.uuid4().hex, qa["call_id"], item, question.question,
                    first.automatic if first else current, verdict, reason.strip(), reviewer, int(qa["revision"]),
                    now)
    return review, _rescored(qa, scorecard, question.question, question.weight, verdict, review)


def _rescored(qa: Mapping[str, Any], scorecard: Scorecard, asked: str, weight: float, verdict: str,
              review: Review) -> dict[str, Any]:
    auto_fail = {q.question: q.auto_fail for q in scorecard.questions}
    rows = [(q, float(w), bool(p), r) for q, w, p, r in zip(qa["items.question"], qa["items.weight"],
                                                             qa["items.passed"], qa["items.rationale"], strict=True)
            if q != asked]
    if verdict != "na":  # the store keeps the applicable items only
        rows.append((asked, weight, verdict == "pass", f"reviewed by {review.reviewer}: {review.reason}"))
    order = {q.question: n for n, q in enumerate(scorecard.questions)}
    rows.sort(key=lambda row: order.get(row[0], len(order)))
    score, auto_failed = score_of([ScoreItem(q, w, p, r, auto_fail.get(q, False)) for q, w, p, r in rows])
    automatic = qa.get("automatic_score_pct")
    return {**qa, "items.question": [r[0] for r in rows], "items.weight": [r[1] for r in rows],
            "items.passed": [int(r[2]) for r in rows], "items.rationale": [r[3] for r in rows],
            "score_pct": score, "auto_failed": int(auto_failed), "computed_at": review.reviewed_at,
            "automatic_score_pct": qa["score_pct"] if automatic is None else automatic,
            "reviewed_by": review.reviewer}


_QA_SQL = "SELECT * FROM {db}.call_qa_deduped WHERE call_id = {{call:String}}"
_REVIEWS_SQL = """
SELECT review_id, call_id, item, question, automatic, verdict, reason, reviewer, revision, reviewed_at
FROM {db}.reviews FINAL WHERE call_id = {{call:String}} ORDER BY reviewed_at, review_id
"""


def submit_review(client: Client, db: str, scorecard: Scorecard, call_id: str, item: str, verdict: str,
                  reason: str, reviewer: str, now: datetime | None = None) -> tuple[Review, dict[str, Any]]:
    """Review ``item`` of ``call_id`` on the store ``client`` writes to: the review row, then the re-scored QA
    row (a failure between them leaves the review kept and the score as it was: submitting again re-scores)."""
    found = client.query(_QA_SQL.format(db=db), parameters={"call": call_id})
    if not found.result_rows:
        raise ReviewError(f"no scored call {call_id!r} in the store (a call is scored when it ends)")
    qa = dict(zip(found.column_names, found.result_rows[0], strict=True))
    earlier = _reviews(client.query(_REVIEWS_SQL.format(db=db), parameters={"call": call_id}).named_results())
    review, row = review_call(qa, scorecard, earlier, item, verdict, reason, reviewer, now or datetime.now(UTC))
    stored = asdict(review)
    client.insert(f"{db}.reviews", [list(stored.values())], column_names=list(stored))
    client.insert(f"{db}.call_qa", [list(row.values())], column_names=list(row))
    return review, row


def read_reviews(source: RowSource, db: str, call_id: str) -> list[Review]:
    """The call's reviews, oldest first."""
    return _reviews(source.rows(_REVIEWS_SQL.format(db=db), {"call": call_id}))


def _reviews(rows: Any) -> list[Review]:
    out = []
    for r in rows:
        at = r["reviewed_at"]
        at = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
        out.append(Review(r["review_id"], r["call_id"], r["item"], r["question"], r["automatic"], r["verdict"],
                          r["reason"], r["reviewer"], int(r["revision"]), at if at.tzinfo else at.replace(tzinfo=UTC)))
    return out

