"""Search across calls: a phrase in the redacted transcripts, with the call list's filters.

One query, three doors: `callqa search`, ``GET /api/search`` and the search box of ``/calls``. What is asked
is a phrase: its words, in order, whole (``cancel`` does not find "cancellation"), case-insensitive, in one
final segment of the call's latest revision; a turn is a segment. Words are what ClickHouse's
``splitByNonAlpha`` tokenizer makes of the text: runs of characters that are not ASCII punctuation, space
or control (so "don't" is the two words "don" and "t", as in the index). The text searched is what the
store keeps, the redacted text: a card number is "[PAN]" there, so its digits are found nowhere.

The segments' full-text index (``text_words``, migration 9) finds the segments that hold every word; a
regular expression over those few then keeps the ones where the words stand in order, side by side. The
calls are the call list's (latest revision, newest first, the same keyset pages), each with its score and
its first ``HITS_PER_CALL`` matching turns. Without a phrase, the filters alone choose the calls.

Filters: ``leg`` (the turn's speaker), ``agent``, ``since``/``until`` (the call's start, UTC), ``score_below``
(the call's latest QA score, strictly below; unscored calls never match), ``failed`` (a rule of
rules/*.yaml the call failed: a ``must`` rule missing or a ``must_not`` rule said, its latest revision),
``category`` (one of the call's categories, rules/categories/*.yaml).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pipeline.store.queries import after_call_sql

LEGS = ("agent", "customer")
HITS_PER_CALL = 5
MAX_WORDS = 16  # a phrase longer than this is a paste, not a search: refused, naming the limit
# The tokenizer's separators: ASCII characters other than letters and digits (a regex character range).
SEPARATORS = r"\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f"
WORD_CHAR = f"[^{SEPARATORS}]"
_WORD = re.compile(f"{WORD_CHAR}+")


class SearchError(ValueError):
    """A search that cannot be run as asked (a bad leg, a date that is not one): says which and why."""


class RowSource(Protocol):
    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]: ...


def words_of(text: str) -> list[str]:
    """The words the index holds for ``text``: ASCII lower-cased (as ClickHouse's ``lower``), cut at separators."""
    lowered = "".join(c.lower() if c.isascii() else c for c in text)
    return _WORD.findall(lowered)


@dataclass(frozen=True)
class SearchQuery:
    """What one search asks; every field optional (an empty phrase: the filters alone)."""

    phrase: str = ""
    leg: str | None = None
    agent: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    score_below: float | None = None
    failed: str | None = None
    category: str | None = None
    limit: int = 50
    after: tuple[datetime, str] | None = None  # keyset: the calls after this one (started_at, call_id)
    words: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", tuple(words_of(self.phrase)))
        if len(self.words) > MAX_WORDS:
            raise SearchError(f"the phrase has {len(self.words)} words; at most {MAX_WORDS} are searched")
        if self.phrase.strip() and not self.words:
            raise SearchError(f"the phrase {self.phrase[:40]!r} has no word to search (only punctuation)")
        if self.leg is not None and self.leg not in LEGS:
            raise SearchError(f"leg must be one of {', '.join(LEGS)}, not {self.leg[:20]!r}")
        if self.limit < 1:
            raise SearchError(f"limit must be at least 1, not {self.limit}")
        if self.since and self.until and self.since >= self.until:
            raise SearchError(f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})")

    @classmethod
    def from_params(cls, params: Mapping[str, str], limit: int, after: tuple[datetime, str] | None = None
                    ) -> SearchQuery:
        """A search from query parameters (``/api/search``, the ``/calls`` search box): ``q``, ``leg``, ``agent``,
        ``since``, ``until`` (ISO 8601, UTC when no offset is given), ``score_below``, ``failed``, ``category``."""
        def text(name: str) -> str | None:
            value = (params.get(name) or "").strip()
            return value or None

        def moment(name: str) -> datetime | None:
            value = text(name)
            try:
                moment = None if value is None else datetime.fromisoformat(value)
                return moment if moment is None or moment.tzinfo else moment.replace(tzinfo=UTC)
            except ValueError:
                raise SearchError(f"{name} must be an ISO 8601 date or time (2026-03-02, 2026-03-02T09:30), "
                                  f"not {str(value)[:40]!r}") from None

        score = text("score_below")
        try:
            score_below = None if score is None else float(score)
        except ValueError:
            raise SearchError(f"score_below must be a number, not {str(score)[:20]!r}") from None
        return cls(params.get("q") or "", text("leg"), text("agent"), moment("since"), moment("until"),
                   score_below, text("failed"), text("category"), limit, after)

    def sql(self, db: str) -> tuple[str, dict[str, Any]]:
        """The search as one SELECT over ``db`` (it passes the query API's check) and its parameters."""
        where, params = ["1"], dict[str, Any]()
        if self.agent is not None:
            where.append("c.agent_id = {agent:String}")
            params["agent"] = self.agent
        for name, value, op in (("since", self.since, ">="), ("until", self.until, "<")):
            if value is not None:
                where.append(f"c.started_at {op} {{{name}:DateTime64(3, 'UTC')}}")
                params[name] = _utc_text(value)
        if self.score_below is not None:
            where.append("NOT empty(q.call_id) AND q.score_pct < {score_below:Float64}")
            params["score_below"] = self.score_below
        if self.failed is not None:
            where.append(f"c.call_id IN (SELECT call_id FROM {db}.qa_events_deduped WHERE rule = {{failed:String}} "
                         "AND kind IN ('missing', 'violation'))")
            params["failed"] = self.failed
        if self.category is not None:
            where.append("has(c.categories, {category:String})")
            params["category"] = self.category
        if self.after is not None:
            where.append(after_call_sql("c."))
            params.update(after_t=_utc_text(self.after[0]), after_c=self.after[1])
        if self.words:
            condition, found = phrase_condition(db, self.words, self.leg)
            where.append(condition)
            params.update(found)
        params["limit"] = self.limit
        return _CALLS_SQL.format(db=db, where=" AND ".join(where)), params


def phrase_condition(db: str, words: tuple[str, ...], leg: str | None = None, alias: str = "c."
                     ) -> tuple[str, dict[str, Any]]:
    """A condition on a calls row (``alias``): its latest revision has a final turn (of ``leg``) with ``words``
    side by side; and its parameters. The segments are found through their full-text index."""
    turn, params = _turn_filter(words, leg)
    return (f"({alias}call_id, {alias}revision) IN (SELECT call_id, revision FROM {db}.segments WHERE {turn})",
            params)


def _turn_filter(words: tuple[str, ...], leg: str | None) -> tuple[str, dict[str, Any]]:
    turn = ["is_final = 1", f"hasAllTokens(lower(text), {_string_array(words)})", "match(lower(text), {pattern:String})"]
    params: dict[str, Any] = {"pattern": phrase_pattern(words)}
    if leg is not None:
        turn.append("leg = {leg:String}")
        params["leg"] = leg
    return " AND ".join(turn), params


def turns_found(source: RowSource, db: str, call_ids: list[str], words: tuple[str, ...], leg: str | None = None
                ) -> dict[str, tuple[int, tuple[MatchedTurn, ...]]]:
    """For each of ``call_ids`` that has any: how many turns of its latest revision hold ``words`` (of ``leg``),
    and the first ``HITS_PER_CALL`` of them in call time (a replayed segment once)."""
    if not call_ids or not words:
        return {}
    turn, params = _turn_filter(words, leg)
    # One String, not an Array parameter: the worker's /api/query passes every parameter as text.
    rows = source.rows(_TURNS_SQL.format(db=db, turn=turn, hits=HITS_PER_CALL), {**params, "ids": "\n".join(call_ids)})
    return {r["call_id"]: (int(r["turns"]), tuple(MatchedTurn(int(h[0]), int(h[1]), str(h[2]), str(h[3]))
                                                  for h in r["hits"])) for r in rows}


def phrase_pattern(words: tuple[str, ...]) -> str:
    """An RE2 pattern for ``words`` side by side, whole, in lower-cased text."""
    sep = f"[{SEPARATORS}]"
    return f"(^|{sep})" + f"{sep}+".join(re.escape(w) for w in words) + f"({sep}|$)"


def _string_array(words: tuple[str, ...]) -> str:
    # Written in the query, not a parameter: the index is used only for constant needles. The words hold
    # no quote or backslash (both are separators), so quoting cannot be broken.
    return "[" + ", ".join(f"'{w}'" for w in words) + "]"


def _utc_text(value: datetime) -> str:
    utc = value.astimezone(UTC) if value.tzinfo else value  # naive: UTC already
    return utc.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


_CALLS_SQL = """
SELECT c.call_id AS call_id, c.agent_id AS agent_id, c.started_at AS started_at,
       if(empty(q.call_id), NULL, q.score_pct) AS score_pct
FROM {db}.calls_deduped AS c
LEFT JOIN (SELECT call_id, score_pct FROM {db}.call_qa_deduped) AS q ON q.call_id = c.call_id
WHERE {where}
ORDER BY c.started_at DESC, c.call_id
LIMIT {{limit:UInt32}}
"""

# One row per segment of a revision (a replayed segment is stored again), of the revision the call stands at.
_TURNS_SQL = """
SELECT t.call_id AS call_id, count() AS turns,
       arraySlice(arraySort(groupArray((t.start_ms, t.end_ms, t.leg, t.text))), 1, {hits}) AS hits
FROM (SELECT call_id, revision, segment_id, start_ms, end_ms, leg, text FROM {db}.segments
      WHERE has(splitByChar('\\n', {{ids:String}}), call_id) AND {turn} LIMIT 1 BY call_id, revision, segment_id) AS t
INNER JOIN (SELECT call_id, revision FROM {db}.calls_deduped WHERE has(splitByChar('\\n', {{ids:String}}), call_id)) AS c
    ON c.call_id = t.call_id AND c.revision = t.revision
GROUP BY t.call_id
"""


@dataclass(frozen=True)
class MatchedTurn:
    """A matching turn: where it is in the call, who spoke, its redacted text."""

    start_ms: int
    end_ms: int
    leg: str
    text: str


@dataclass(frozen=True)
class FoundCall:
    call_id: str
    agent_id: str
    started_at: datetime
    score_pct: float | None
    turns: int  # matching turns in the call; ``hits`` holds the first HITS_PER_CALL of them
    hits: tuple[MatchedTurn, ...]


def search(source: RowSource, db: str, query: SearchQuery) -> list[FoundCall]:
    """The calls ``query`` finds, newest first, at most ``query.limit``, each with its matching turns."""
    sql, params = query.sql(db)
    rows = source.rows(sql, params)
    turns = turns_found(source, db, [r["call_id"] for r in rows], query.words, query.leg)
    return [_found(row, *turns.get(row["call_id"], (0, ()))) for row in rows]


def _found(row: dict[str, Any], turns: int, hits: tuple[MatchedTurn, ...]) -> FoundCall:
    started = row["started_at"]  # a datetime from the store, ISO 8601 text through the worker's API
    if not isinstance(started, datetime):
        started = datetime.fromisoformat(started)
    score = row["score_pct"]
    return FoundCall(row["call_id"], row["agent_id"], started if started.tzinfo else started.replace(tzinfo=UTC),
                     None if score is None else round(float(score), 2), turns, hits)
