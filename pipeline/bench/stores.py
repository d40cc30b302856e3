"""Reading what a group of worker processes stored, for the tests and benchmarks that run several: which
calls finished, their finals and QA verdicts per worker store, and how they differ from the reference
(``callqa analyze`` of the recording). ``workers.py`` starts and stops the workers.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.bench.workers import WorkerProcess

if TYPE_CHECKING:
    from pipeline.contracts.messages import CallQA
    from pipeline.qa.scorecard import CallQaResult

_FINISHED_SQL = ("SELECT call_id, end_reason, segments FROM calls_deduped "
                 "WHERE has(splitByChar(',', {ids:String}), call_id) AND end_reason != ''")
_FINAL_SEGMENTS_SQL = ("SELECT call_id, segment_id, leg, start_ms, end_ms, text FROM segments_deduped "
                       "WHERE is_final = 1 AND has(splitByChar(',', {ids:String}), call_id)")


_QA_SQL = ("SELECT call_id, score_pct, auto_failed, metrics, `items.question` AS q, `items.passed` AS p "
           "FROM call_qa_deduped WHERE has(splitByChar(',', {ids:String}), call_id)")
_QA_EVENTS_SQL = ("SELECT call_id, rule, kind FROM qa_events_deduped "
                  "WHERE has(splitByChar(',', {ids:String}), call_id)")


@dataclass(frozen=True)
class QaVerdicts:
    """A call's QA as the stream stores it and `callqa analyze` reports it, in one comparable form."""

    score_pct: float
    auto_failed: bool
    items: tuple[tuple[str, bool], ...]  # the applicable scorecard items (question, passed), in card order
    events: tuple[tuple[str, str], ...]  # (rule, kind) of every QA event, sorted
    metrics: dict[str, float]

    @classmethod
    def of_result(cls, qa: CallQaResult | CallQA) -> QaVerdicts:
        """From a QA result (``CallAnalysis.qa`` of `callqa analyze`) or a CallQA message; like the store,
        it keeps the applicable items only."""
        return cls(float(qa.score_pct), bool(qa.auto_failed),
                   tuple((i.question, bool(i.passed)) for i in qa.items if i.passed is not None),
                   tuple(sorted((e.rule, e.kind) for e in qa.events)), dict(qa.metrics))

    @classmethod
    def of_rows(cls, qa: dict[str, Any], events: list[dict[str, Any]]) -> QaVerdicts:
        """From a call_qa row and the call's qa_events rows of one store."""
        return cls(float(qa["score_pct"]), bool(qa["auto_failed"]),
                   tuple((q, bool(p)) for q, p in zip(qa["q"], qa["p"], strict=True)),
                   tuple(sorted((e["rule"], e["kind"]) for e in events)),
                   {k: float(v) for k, v in (qa["metrics"] or {}).items()})

    def differences(self, reference: QaVerdicts) -> list[str]:
        """What differs from ``reference``; the score is a Float32 column, metrics compared to 1e-6."""
        out = []
        if abs(self.score_pct - reference.score_pct) > 1e-3 or self.auto_failed != reference.auto_failed:
            out.append(f"score {self.score_pct:g}{' auto-failed' * self.auto_failed}, reference "
                       f"{reference.score_pct:g}{' auto-failed' * reference.auto_failed}")
        if self.items != reference.items:
            out.append(f"items (question, passed) {list(self.items)} != reference {list(reference.items)}")
        if self.events != reference.events:
            out.append(f"events (rule, kind) {list(self.events)} != reference {list(reference.events)}")
        for name in sorted(set(self.metrics) | set(reference.metrics)):
            got, want = self.metrics.get(name), reference.metrics.get(name)
            if got is None or want is None or not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
                out.append(f"metric {name} = {got}, reference {want}")
        return out


@dataclass
class GroupCalls:
    """Some calls as a consumer group's workers stored them, over all their stores."""

    finished: dict[str, list[dict[str, Any]]]  # call id -> its finished call rows (one per store that has one)
    segments: dict[str, dict[str, dict[str, Any]]]  # call id -> segment id -> final segment row (any store)
    stores_of: dict[str, set[int]]  # call id -> index of each worker whose store holds a final segment of it
    finished_in: dict[str, set[int]]  # call id -> index of each worker whose store has it finished
    # (call id, segment id) -> stores holding that final: more than one after a handover replayed a segment
    copies: Counter[tuple[str, str]] = field(default_factory=Counter)

    def several_copies(self) -> int:
        """Final segments held by more than one store."""
        return sum(1 for n in self.copies.values() if n > 1)

    def unfinished(self, call_ids: list[str]) -> list[str]:
        """Calls without a finished row in any store, or with fewer segments stored than a row counts
        (the call row and its segments are separate inserts: the row may land first)."""
        return [c for c in call_ids if not self.finished.get(c) or
                len(self.segments.get(c, {})) < max(int(r["segments"]) for r in self.finished[c])]

    def progress(self) -> tuple[int, int]:
        """Finished rows and final segments over all stores: what a wait sees grow while work goes on."""
        return sum(map(len, self.finished.values())), sum(map(len, self.segments.values()))

    def why_unfinished(self, call_id: str) -> str:
        rows = self.finished.get(call_id)
        held = len(self.segments.get(call_id, {}))
        if not rows:
            return f"{call_id}: no finished row, {held} segments stored"
        return f"{call_id}: its row counts {max(int(r['segments']) for r in rows)} segments, {held} stored"

    def inconsistencies(self, call_ids: list[str]) -> list[str]:
        """Where stored segments disagree with their call rows: a row counting another number of segments
        than there are distinct final segment ids over all stores (lost, or stored twice under another
        id), or two segments of one leg overlapping in time (the same speech transcribed twice)."""
        problems: list[str] = []
        for call_id in call_ids:
            segments = self.segments.get(call_id, {})
            for row in self.finished.get(call_id, []):
                if int(row["segments"]) != len(segments):
                    problems.append(f"{call_id}: call row counts {row['segments']} segments, "
                                    f"the stores hold {len(segments)} distinct ones")
            by_leg: dict[str, list[tuple[int, int, str]]] = {}
            for seg_id, seg in segments.items():
                by_leg.setdefault(seg["leg"], []).append((int(seg["start_ms"]), int(seg["end_ms"]), seg_id))
            for spans in by_leg.values():
                spans.sort()
                problems += [f"{call_id}: {a[2]} [{a[0]}, {a[1]}) overlaps {b[2]} [{b[0]}, {b[1]})"
                             for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
        return problems

    def differences(self, expected: dict[str, list[tuple[str, int, int, str]]]) -> list[str]:
        """Where each call's stored finals differ from an independent reference (call id -> its
        (leg, start_ms, end_ms, text) in time order, e.g. from ``callqa analyze`` of the same recording):
        a final lost, added, stored twice or with other bounds or text, and call rows counting another
        number of segments than the reference has."""
        problems: list[str] = []
        for call_id, want in expected.items():
            # Counted, not set-compared: the same speech stored under two segment ids is a difference too.
            stored = Counter((s["leg"], int(s["start_ms"]), int(s["end_ms"]), s["text"])
                             for s in self.segments.get(call_id, {}).values())
            missing = sorted((Counter(want) - stored).elements())
            extra = sorted((stored - Counter(want)).elements())
            problems += [f"{call_id}: reference final not stored: {m}" for m in missing]
            problems += [f"{call_id}: stored final not in the reference: {e}" for e in extra]
            problems += [f"{call_id}: a call row counts {r['segments']} segments, the reference has {len(want)}"
                         for r in self.finished.get(call_id, []) if int(r["segments"]) != len(want)]
        return problems


@dataclass
class GroupStores:
    """Reads the stores of one consumer group's workers (each has an embedded store of its own).
    A stopped worker's store cannot change any more: it is read once."""

    workers: list[WorkerProcess]
    _stopped: dict[tuple[int, int, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(
        default_factory=dict, repr=False)

    def read(self, call_ids: list[str]) -> GroupCalls:
        calls = GroupCalls({}, {}, {}, {})
        for index, worker in enumerate(self.workers):
            finished, segments = self._rows(worker, ",".join(call_ids))
            for row in finished:
                calls.finished.setdefault(row["call_id"], []).append(row)
                calls.finished_in.setdefault(row["call_id"], set()).add(index)
            for row in segments:
                calls.segments.setdefault(row["call_id"], {})[row["segment_id"]] = row
                calls.stores_of.setdefault(row["call_id"], set()).add(index)
                calls.copies[(row["call_id"], row["segment_id"])] += 1
        return calls

    def read_verdicts(self, call_ids: list[str]) -> dict[str, list[QaVerdicts]]:
        """Each call's QA in every store that holds a QA row of it (one entry per such store): a call
        finished once has one; its events are those the finishing worker wrote beside its QA row."""
        ids = ",".join(call_ids)
        out: dict[str, list[QaVerdicts]] = {}
        for worker in self.workers:
            events: dict[str, list[dict[str, Any]]] = {}
            for row in worker.store_rows(_QA_EVENTS_SQL, ids=ids):
                events.setdefault(row["call_id"], []).append(row)
            for row in worker.store_rows(_QA_SQL, ids=ids):
                out.setdefault(row["call_id"], []).append(QaVerdicts.of_rows(row, events.get(row["call_id"], [])))
        return out

    def wait_finished(self, call_ids: list[str], timeout_s: float = 240.0,
                      on_read: Callable[[GroupCalls], None] = lambda _: None,
                      stall_s: float | None = None) -> GroupCalls:
        """Wait until every call is finished in some store with all its segments stored; ``on_read`` sees
        each reading (to show progress, or raise when something the wait depends on failed). With
        ``stall_s``, the wait also ends once the stores have not changed for that long: a group that
        is behind on a busy machine but still storing is waited for up to ``timeout_s``."""
        began = time.monotonic()
        changed_at, seen = began, (-1, -1)
        while True:
            calls = self.read(call_ids)
            on_read(calls)
            missing = calls.unfinished(call_ids)
            if not missing:
                return calls
            now = time.monotonic()
            if (progress := calls.progress()) != seen:
                changed_at, seen = now, progress
            stalled = stall_s is not None and now - changed_at > stall_s
            if stalled or now - began > timeout_s:
                why = (f"nothing stored for {stall_s:.0f} s" if stalled else f"not all within {timeout_s:.0f} s")
                raise TimeoutError(f"{len(missing)} of {len(call_ids)} calls not finished in any store ({why}): "
                                   + "; ".join(calls.why_unfinished(c) for c in missing))
            time.sleep(1.0)

    def _rows(self, worker: WorkerProcess, ids: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        key = (id(worker), worker.proc.pid if worker.proc is not None else 0, ids)
        if key in self._stopped:
            return self._stopped[key]
        was_alive = worker.alive()
        rows = worker.store_rows(_FINISHED_SQL, ids=ids), worker.store_rows(_FINAL_SEGMENTS_SQL, ids=ids)
        if not was_alive:
            self._stopped[key] = rows
        return rows
