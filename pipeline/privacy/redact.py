"""`callqa redact`: the redactor applied again to stored calls, their text and their kept recordings.

When redaction improves (a kind of PII it did not know, a better reader of spoken card numbers), the calls
stored before still hold what it now catches. This walks the stored calls (ended ones; started since
``--since``, or the ``--call`` IDs) and, per call:

1. Every revision's segments go through a fresh ``CallAnalyzer`` in time order (start, the agent's first on a
   tie), as the worker redacts them: the redactor leaves the markers the text holds and reads them as context
   (a ``[PAN]`` keeps the card open for the security code after it), so what it replaces now is what it would
   have caught then; its ``counts`` are the markers it adds. A segment's other stored copies (the live
   previews, partials, which its final supersedes) are redacted in the same place of the call.
2. The kept recording, if any, is decoded, each new span placed and checked as the writer's cuts are
   (pipeline/recordings/cuts.py: the estimate ± ``recordings_cut_margin_ms``, decoded again by the live model
   and widened while it still says PII), silenced and encoded again.
3. Only once all of it is worked out is anything written, in an order a failure can be repeated from: the
   recording (a temporary file, then a rename), its ``recordings`` row (the cuts merged, its size), then the
   text. The text goes last because it is what says where the recording still holds PII: a run stopped
   before the text finds the same spans again. A recording that cannot be read fails its call, text and all.
4. The text is rewritten wherever a copy of it is kept: ``segments`` (text and redaction count, every copy
   of the segment; the full-text index of search follows the column), ``qa_events`` (an event quotes its
   segment) and ``call_qa`` (a scorecard item's rationale quotes its events), with mutations that rewrite the
   parts and are waited for (``ALTER TABLE ... UPDATE``), as erasure's ``DELETE`` is: an inserted replacement
   would leave the old text on disk until a merge. A static page written for the call before (``make
   demo``'s) is written again.

Kafka's topics keep the text as it was until they delete it by age; the report names them. Running it again
changes nothing: the stored text then holds markers wherever the redactor puts them.

It writes with the store's writer account (``CALLQA_CLICKHOUSE_URL``: a server, or the embedded store of a
worker that is not running, as `callqa retranscribe` and `callqa recategorize`).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.config import Settings
from pipeline.contracts.messages import JobCut, JobRedaction
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.numbers import digit_runs
from pipeline.qa.redaction import RedactedText
from pipeline.qa.segment import Segment
from pipeline.recordings.cuts import Cut, Decode, merged, place_cuts, silenced
from pipeline.recordings.encode import CHANNELS, MEDIA_TYPE, RecordingError, decode_call, encode_call
from pipeline.recordings.storage import RecordingStore
from pipeline.store.client import check_identifier

# Calls read and written together: one mutation per table per batch (a mutation rewrites every part that holds
# one of its calls, so one per call would rewrite a large table once per call).
BATCH = 200

Revision = int
SegmentKey = tuple[Revision, str, str]  # (revision, segment id, stored text): one stored copy of a segment


class RedactError(RuntimeError):
    """The command cannot run (bad arguments, redaction off); one line."""


class CallFailed(Exception):
    """One call cannot be redacted again (its recording unreadable, a stored row the redactor refuses); one line."""


@dataclass
class CallChange:
    """What redacting one call again changed (or would change, in a dry run)."""

    call_id: str
    segments: int = 0  # segment texts changed, every revision
    markers: Counter[str] = field(default_factory=Counter)  # markers added, by kind
    previews: int = 0  # superseded copies of segments (live partials) changed
    events: int = 0  # QA event texts changed
    rationales: int = 0  # scorecard rationales changed
    cuts: tuple[Cut, ...] = ()  # stretches of the recording newly silenced
    recording: str = ""  # where the recording is kept; empty: none kept
    error: str = ""  # why the call was left as it was

    @property
    def changed(self) -> bool:
        return bool(self.segments or self.previews or self.events or self.rationales or self.cuts)

    @property
    def silenced_ms(self) -> int:
        return sum(c.end_ms - c.start_ms for c in self.cuts)

    def as_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "segments_changed": self.segments, "markers_added": dict(self.markers),
                "previews_changed": self.previews, "events_changed": self.events,
                "rationales_changed": self.rationales, "recording": self.recording or None,
                "silenced_ms": self.silenced_ms,
                "cuts": [{"leg": c.leg, "start_ms": c.start_ms, "end_ms": c.end_ms, "kind": c.kind, "how": c.how}
                         for c in self.cuts]}


@dataclass(frozen=True)
class RedactReport:
    calls: int  # calls looked at
    changed: list[CallChange]
    errors: list[CallChange]  # calls left as they were, each with its error
    dry_run: bool
    pages: list[str] = field(default_factory=list)  # static pages written again
    left: list[str] = field(default_factory=list)  # what keeps the earlier text outside the store

    def as_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "calls": self.calls, "changed": [c.as_json() for c in self.changed],
                "errors": [{"call_id": c.call_id, "error": c.error} for c in self.errors],
                "pages": self.pages, "left": self.left}


@dataclass
class _Plan:
    """One call's writes, worked out before any is made."""

    change: CallChange
    texts: dict[SegmentKey, tuple[str, int]] = field(default_factory=dict)  # -> (new text, markers added)
    events: dict[tuple[Revision, str], str] = field(default_factory=dict)  # (revision, old text) -> new
    rationales: dict[tuple[Revision, str], str] = field(default_factory=dict)  # (revision, old) -> new
    audio: bytes | None = None  # the recording to put
    recording_row: dict[str, Any] | None = None


# The cuts' checker (cuts.py's ``Decode``: the live model), made when a recording first needs one.
DecodeFactory = Callable[[], Decode]


def live_model(settings: Settings) -> DecodeFactory:
    """The live model (``CALLQA_MODEL``) as the cuts' checker, loaded once, on first use."""
    loaded: list[Any] = []

    def factory() -> Decode:
        if not loaded:
            from pipeline.asr.engine import Engine

            loaded.append(Engine.load(settings=settings))
        engine = loaded[0]

        async def decode(segments: Sequence[AudioSegment]) -> list[TranscriptResult | BaseException]:
            step = max(1, settings.max_batch)
            out: list[TranscriptResult | BaseException] = []
            for i in range(0, len(segments), step):
                out.extend(engine.recognizer.recognize(list(segments[i:i + step])))
            return out
        return decode
    return factory


def parse_since(text: str | None) -> datetime | None:
    """``--since``: an ISO 8601 date or time, UTC unless it says otherwise."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RedactError(f"--since {text!r}: not an ISO 8601 date or time (e.g. 2026-03-02 or "
                          "2026-03-02T09:30:00Z)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# ---- reading ---------------------------------------------------------------------------------------------
_CALLS_SQL = """
SELECT call_id, tenant, started_at FROM {db}.calls_deduped
WHERE end_reason != '' {where} ORDER BY started_at, call_id
"""
_KNOWN_SQL = """
SELECT call_id, max(end_reason != '') FROM (
    SELECT call_id, end_reason FROM {db}.calls WHERE call_id IN {{ids:Array(String)}}
    UNION ALL SELECT call_id, '' FROM {db}.segments WHERE call_id IN {{ids:Array(String)}})
GROUP BY call_id
"""
# The copy of each segment readers see (FINAL: a final over its previews), every revision.
_SEGMENTS_SQL = """
SELECT call_id, revision, segment_id, leg, start_ms, end_ms, text FROM {db}.segments FINAL
WHERE call_id IN {{ids:Array(String)}}
"""
# Every stored copy: the previews (partials) a final supersedes stay on disk until a merge.
_COPIES_SQL = """
SELECT DISTINCT call_id, revision, segment_id, leg, start_ms, end_ms, text FROM {db}.segments
WHERE call_id IN {{ids:Array(String)}}
"""
_EVENTS_SQL = "SELECT DISTINCT call_id, revision, text FROM {db}.qa_events WHERE call_id IN {{ids:Array(String)}}"
_RATIONALES_SQL = """
SELECT DISTINCT call_id, revision, r FROM {db}.call_qa ARRAY JOIN `items.rationale` AS r
WHERE call_id IN {{ids:Array(String)}}
"""
_RECORDINGS_SQL = "SELECT * FROM {db}.recordings FINAL WHERE call_id IN {{ids:Array(String)}}"


def select_calls(client: Client, db: str, since: datetime | None,
                 call_ids: Sequence[str]) -> tuple[list[dict[str, Any]], list[CallChange]]:
    """The ended calls to redact, oldest first, and an error for each asked-for ID that is not one."""
    where, params = "", dict[str, Any]()
    if since is not None:
        where += " AND started_at >= {since:DateTime64(3, 'UTC')}"
        params["since"] = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if call_ids:
        where += " AND call_id IN {ids:Array(String)}"
        params["ids"] = list(dict.fromkeys(call_ids))
    result = client.query(_CALLS_SQL.format(db=db, where=where), parameters=params)
    calls = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    found = {c["call_id"] for c in calls}
    missing = [c for c in dict.fromkeys(call_ids) if c not in found]
    errors = []
    if missing:
        known = {row[0]: row[1] for row in client.query(_KNOWN_SQL.format(db=db), parameters={"ids": missing}).result_rows}
        for call_id in missing:
            if call_id not in known:
                errors.append(CallChange(call_id, error=f"no call {call_id!r} in the store"))
            elif not known[call_id]:
                errors.append(CallChange(call_id, error=f"call {call_id} has not ended: its worker still writes "
                                                        "it (redact it once it has ended)"))
            # else: ended, but started before --since
    return calls, errors


def _grouped(client: Client, sql: str, db: str, ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    rows: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in client.query(sql.format(db=db), parameters={"ids": ids}).result_rows:
        rows[row[0]].append(tuple(row[1:]))
    return rows


# ---- working out one call ------------------------------------------------------------------------------
def _segment(call_id: str, row: tuple[Any, ...]) -> Segment:
    _revision, segment_id, leg, start_ms, end_ms, text = row
    return Segment(call_id, leg, segment_id, int(start_ms), int(end_ms), text)


def _time_order(row: tuple[Any, ...]) -> tuple[int, int, str]:
    """A call's segments as the worker redacts them: by start, the agent's first on a tie."""
    return int(row[3]), 0 if row[2] == "agent" else 1, row[1]


def _turn(segment: Segment, redacted: RedactedText) -> JobRedaction:
    """The segment's new spans, placed in its audio, as the writer's cuts take them."""
    cuts = [JobCut(a, b, kind) for a, b, kind in redacted.time_spans(segment.start_ms, segment.end_ms)]
    kept = sum(len(run.digits) for run in digit_runs(redacted.text)[1])
    return JobRedaction(segment.leg, segment.start_ms, segment.end_ms, kept, cuts)


def redact_text(call_id: str, config: QaConfig, visible: Iterable[tuple[Any, ...]],
                copies: Iterable[tuple[Any, ...]], plan: _Plan) -> tuple[list[JobRedaction], dict[tuple[Revision, str], str]]:
    """Each revision's segments redacted again in time order into ``plan`` (``visible``: the copy readers see;
    ``copies``: every stored one). Returns the turns whose audio now needs cutting, and per revision each
    changed segment text's new text (what the QA text quoting it becomes)."""
    others: dict[tuple[Revision, str], list[tuple[Any, ...]]] = defaultdict(list)
    for row in copies:
        others[(int(row[0]), row[1])].append(row)
    revisions: dict[Revision, list[tuple[Any, ...]]] = defaultdict(list)
    for row in visible:
        revisions[int(row[0])].append(row)
    turns: list[JobRedaction] = []
    replaced: dict[tuple[Revision, str], str] = {}
    change = plan.change
    for revision, rows in sorted(revisions.items()):
        analyzer = CallAnalyzer(call_id, config)  # each revision is a transcript of its own
        for row in sorted(rows, key=_time_order):
            segment = _segment(call_id, row)
            try:
                redacted = analyzer.redact(segment)
            except ValueError as exc:
                raise CallFailed(f"segment {segment.segment_id}: {exc}") from None
            if redacted.text != segment.text:
                plan.texts[(revision, segment.segment_id, segment.text)] = (redacted.text, sum(redacted.counts.values()))
                change.segments += 1
                change.markers.update(redacted.counts)
                turns.append(_turn(segment, redacted))
                # Two segments that said the same may not redact the same (context): the QA text quoting
                # either takes the one with more markers.
                if replaced.get((revision, segment.text), "").count("[") <= redacted.text.count("["):
                    replaced[(revision, segment.text)] = redacted.text
            # Its previews, in its place in the call: the context before it, and none of their own.
            for copy in others.get((revision, segment.segment_id), ()):
                preview = _segment(call_id, copy)
                if preview.text == segment.text or (revision, segment.segment_id, preview.text) in plan.texts:
                    continue
                again = analyzer.redact_partial(preview)
                if again.text != preview.text:
                    plan.texts[(revision, preview.segment_id, preview.text)] = (again.text, sum(again.counts.values()))
                    change.previews += 1  # its markers are its final's: not counted again
                    turns.append(_turn(preview, again))
    return turns, replaced


def rationale_changes(rationales: Iterable[tuple[Revision, str]],
                      replaced: dict[tuple[Revision, str], str]) -> dict[tuple[Revision, str], str]:
    """A scorecard item's rationale quotes its events' texts as Python literals (pipeline/qa/scorecard.py
    ``_at``): each quote of a changed text, changed."""
    by_revision: dict[Revision, list[tuple[str, str]]] = defaultdict(list)
    for (revision, old), new in replaced.items():
        by_revision[revision].append((repr(old), repr(new)))
    out: dict[tuple[Revision, str], str] = {}
    for revision, text in rationales:
        new_text = text
        for old, new in sorted(by_revision.get(revision, ()), key=lambda pair: -len(pair[0])):
            new_text = new_text.replace(old, new)
        if new_text != text:
            out[(revision, text)] = new_text
    return out


def _cut_of(stored: Any) -> Cut:
    """A ``recordings.cuts`` element, as the store gives it (a named tuple comes back as a dict)."""
    if isinstance(stored, dict):
        return Cut(stored["leg"], int(stored["start_ms"]), int(stored["end_ms"]), stored["kind"], stored["how"])
    leg, start_ms, end_ms, kind, how = stored
    return Cut(leg, int(start_ms), int(end_ms), kind, how)


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def redact_recording(call: dict[str, Any], turns: Sequence[JobRedaction], row: dict[str, Any] | None,
                     store: RecordingStore, settings: Settings, decode: DecodeFactory, plan: _Plan) -> None:
    """The call's kept recording with the turns' new spans silenced, into ``plan`` (nothing when none is kept)."""
    call_id = call["call_id"]
    kept = store.exists(call_id)
    if not kept and row is None:
        return
    plan.change.recording = row["url"] if row is not None else store.url_for(call_id)
    if not turns:
        return
    if not kept:
        raise CallFailed(f"its recording {plan.change.recording} is missing (the recordings table names it)")
    try:
        legs, rate = decode_call(store.read(call_id))
    except (OSError, RecordingError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = re.sub(r"Error opening <[^>]*>: ", "", reason).rstrip(".")  # libsndfile names the buffer
        raise CallFailed(f"its recording {plan.change.recording} cannot be read: {reason}") from None
    if not legs:
        raise CallFailed(f"its recording {plan.change.recording} holds no audio")
    audio = {leg: (samples, rate) for leg, samples in legs.items()}
    cuts = asyncio.run(place_cuts(turns, audio, decode(), settings.recordings_cut_margin_ms, settings.asr_lead_ms))
    if not cuts:
        return
    quiet = {leg: silenced(samples, rate, [(c.start_ms, c.end_ms, c.kind) for c in cuts if c.leg == leg])
             for leg, samples in legs.items()}
    plan.audio = encode_call(quiet, rate, settings.recordings_compression)
    plan.change.cuts = tuple(cuts)
    before = [_cut_of(c) for c in row["cuts"]] if row is not None else []
    base = {k: v for k, v in row.items()} if row is not None else {
        "call_id": call_id, "tenant": call["tenant"], "url": plan.change.recording, "media_type": MEDIA_TYPE,
        "channels": list(CHANNELS), "started_at": call["started_at"]}
    plan.recording_row = {
        **base, "bytes": len(plan.audio), "duration_ms": max(len(x) for x in quiet.values()) * 1000 // rate,
        "cuts": [(c.leg, c.start_ms, c.end_ms, c.kind, c.how) for c in merged([*before, *cuts])],
        "started_at": _utc(base["started_at"]), "written_at": datetime.now(UTC)}


# ---- writing -----------------------------------------------------------------------------------------------
def _blen(text: str) -> int:
    return len(text.encode())  # ClickHouse's length(): bytes


# One string per stored copy, unambiguous whatever the ids hold (each id behind its length in bytes), for the
# mutations' transform(): a hash lookup per row, where has() or indexOf() on the keys would scan them.
_SEGMENT_KEY = ("concat(toString(length(call_id)), ':', call_id, toString(revision), ':', "
                "toString(length(segment_id)), ':', segment_id, text)")
_TEXT_KEY = "concat(toString(length(call_id)), ':', call_id, toString(revision), ':', {text})"


def _segment_key(call_id: str, revision: int, segment_id: str, text: str) -> str:
    return f"{_blen(call_id)}:{call_id}{revision}:{_blen(segment_id)}:{segment_id}{text}"


def _text_key(call_id: str, revision: int, text: str) -> str:
    return f"{_blen(call_id)}:{call_id}{revision}:{text}"


def _mutate(client: Client, sql: str, params: dict[str, Any]) -> None:
    # mutations_sync 2: returns once every replica rewrote its parts, so the old text is gone when it returns.
    client.command(sql, parameters=params, settings={"mutations_sync": 2})


def write_text(client: Client, db: str, plans: Sequence[_Plan]) -> None:
    """The plans' new text in every table that holds it: one mutation per table."""
    segments = [(_segment_key(p.change.call_id, r, s, old), new, added)
                for p in plans for (r, s, old), (new, added) in p.texts.items()]
    if segments:
        keys, texts, added = (list(x) for x in zip(*segments, strict=True))
        _mutate(client, f"ALTER TABLE {db}.segments UPDATE text = transform({_SEGMENT_KEY}, {{keys:Array(String)}}, "
                        f"{{texts:Array(String)}}, text), redactions = redactions + transform({_SEGMENT_KEY}, "
                        f"{{keys:Array(String)}}, {{added:Array(UInt16)}}, toUInt16(0)) "
                        f"WHERE call_id IN {{ids:Array(String)}} AND {_SEGMENT_KEY} IN {{keys:Array(String)}}",
                {"keys": keys, "texts": texts, "added": [min(a, 65535) for a in added],
                 "ids": [p.change.call_id for p in plans if p.texts]})
    events = [(_text_key(p.change.call_id, r, old), new) for p in plans for (r, old), new in p.events.items()]
    if events:
        key = _TEXT_KEY.format(text="text")
        _mutate(client, f"ALTER TABLE {db}.qa_events UPDATE text = transform({key}, {{keys:Array(String)}}, "
                        f"{{texts:Array(String)}}, text) WHERE call_id IN {{ids:Array(String)}} "
                        f"AND {key} IN {{keys:Array(String)}}",
                {"keys": [k for k, _ in events], "texts": [t for _, t in events],
                 "ids": [p.change.call_id for p in plans if p.events]})
    rationales = [(_text_key(p.change.call_id, r, old), new) for p in plans for (r, old), new in p.rationales.items()]
    if rationales:
        key = _TEXT_KEY.format(text="r")
        _mutate(client, f"ALTER TABLE {db}.call_qa UPDATE `items.rationale` = arrayMap(r -> transform({key}, "
                        f"{{keys:Array(String)}}, {{texts:Array(String)}}, r), `items.rationale`) "
                        f"WHERE call_id IN {{ids:Array(String)}}",
                {"keys": [k for k, _ in rationales], "texts": [t for _, t in rationales],
                 "ids": [p.change.call_id for p in plans if p.rationales]})


def write_batch(client: Client, db: str, store: RecordingStore, plans: Sequence[_Plan]) -> list[_Plan]:
    """Recordings first, then their rows, then the text (see the module's doc for why); the plans written (a
    call whose recording could not be put is left as it was, its error set)."""
    done = []
    for plan in plans:
        if plan.audio is not None:
            try:
                store.put(plan.change.call_id, plan.audio)
            except OSError as exc:
                plan.change.error = f"call {plan.change.call_id}: its recording could not be written: {exc}; left as it was"
                continue
        done.append(plan)
    rows = [p.recording_row for p in done if p.recording_row is not None]
    if rows:
        columns = list(rows[0])
        client.insert("recordings", [[r[c] for c in columns] for r in rows], column_names=columns, database=db)
    write_text(client, db, done)
    return done


def rewrite_pages(settings: Settings, call_ids: Sequence[str]) -> list[str]:
    """The static pages written before for these calls (``make demo``'s), written again from the store."""
    from pipeline.report import StoreSource
    from pipeline.web.data import read_call_page
    from pipeline.web.render import PageContext, StaticLinks, render_call_page, static_file_name

    lines = []
    for folder in (Path(settings.state_dir) / "demo" / "pages",):
        for call_id in call_ids:
            path = folder / "calls" / static_file_name(call_id)
            if not path.exists():
                continue
            page = read_call_page(StoreSource(settings), settings.clickhouse_database, call_id)
            if page is None:
                continue
            partial = path.with_name(f"{path.name}.partial")
            partial.write_text(render_call_page(page, PageContext(StaticLinks(on_call_page=True)),
                                                settings.qa_silence_threshold_ms), encoding="utf-8")
            partial.replace(path)
            lines.append(f"{path}: written again")
    return lines


def topics_left(settings: Settings) -> list[str]:
    """The topics whose messages quote the text as it was: Kafka deletes them by age, not by key."""
    def days(ms: int) -> str:
        return "forever" if ms < 0 else f"{ms / 3_600_000:g} h" if ms < 86_400_000 else f"{ms / 86_400_000:g} d"

    return [f"{topic}: the {what} of these calls keep the text as it was until they expire, {days(ms)} after "
            "they were written (Kafka deletes by age)"
            for topic, what, ms in ((settings.topic_transcripts, "transcripts", settings.output_retention_ms),
                                    (settings.topic_qa, "QA results", settings.output_retention_ms))]


# ---- the command ---------------------------------------------------------------------------------------------
def redact_stored(client: Client, settings: Settings, config: QaConfig, *, since: datetime | None = None,
                  call_ids: Sequence[str] = (), dry_run: bool = False, decode: DecodeFactory | None = None,
                  progress: Callable[[int, int], None] = lambda done, total: None) -> RedactReport:
    """Redact the stored calls again (see the module's doc); ``decode``: the cuts' checker (the live model)."""
    if not config.redaction_enabled:
        raise RedactError("redaction is switched off (CALLQA_QA_REDACTION_ENABLED=false): nothing to apply")
    db = check_identifier(settings.clickhouse_database)
    calls, errors = select_calls(client, db, since, call_ids)
    store = RecordingStore(settings.recordings_location)
    checker = decode or live_model(settings)
    changed: list[CallChange] = []
    progress(0, len(calls))
    for first in range(0, len(calls), BATCH):
        batch = calls[first:first + BATCH]
        ids = [c["call_id"] for c in batch]
        visible = _grouped(client, _SEGMENTS_SQL, db, ids)
        copies = _grouped(client, _COPIES_SQL, db, ids)
        events = _grouped(client, _EVENTS_SQL, db, ids)
        rationales = _grouped(client, _RATIONALES_SQL, db, ids)
        result = client.query(_RECORDINGS_SQL.format(db=db), parameters={"ids": ids})
        recordings = {row[0]: dict(zip(result.column_names, row, strict=True)) for row in result.result_rows}
        plans = []
        for n, call in enumerate(batch, start=first + 1):
            call_id = call["call_id"]
            plan = _Plan(CallChange(call_id))
            try:
                turns, replaced = redact_text(call_id, config, visible.get(call_id, ()), copies.get(call_id, ()),
                                              plan)
                stored_events = {(int(r), text) for r, text in events.get(call_id, ())}
                plan.events = {k: v for k, v in replaced.items() if k in stored_events}
                plan.change.events = len(plan.events)
                plan.rationales = rationale_changes(((int(r), text) for r, text in rationales.get(call_id, ())),
                                                    replaced)
                plan.change.rationales = len(plan.rationales)
                redact_recording(call, turns, recordings.get(call_id), store, settings, checker, plan)
            except CallFailed as exc:
                errors.append(CallChange(call_id, error=f"call {call_id}: {exc}; left as it was"))
            else:
                if plan.change.changed:
                    plans.append(plan)
            progress(n, len(calls))
        if not dry_run:
            done = write_batch(client, db, store, plans)
            errors += [p.change for p in plans if p.change.error]
            plans = done
        changed += [p.change for p in plans]
    pages = [] if dry_run else rewrite_pages(settings, [c.call_id for c in changed])
    return RedactReport(len(calls), changed, errors, dry_run, pages, topics_left(settings))


def print_report(report: RedactReport, console: Any, err_console: Any) -> None:
    """The calls changed as a table, each error as one line on stderr, then what is left outside the store."""
    from rich.markup import escape
    from rich.table import Table

    from pipeline.tables import keep_whole, print_table

    for failed in report.errors:
        err_console.print(f"[red]error:[/red] {escape(failed.error)}")
    would = "would change" if report.dry_run else "changed"
    if report.changed:
        table = Table("call", "segments", "markers added", "QA text", "recording",
                      title=f"calls whose redaction {would}" + (" (dry run: nothing written)" if report.dry_run else ""))
        for c in report.changed:
            markers = ", ".join(f"{kind} {n}" for kind, n in sorted(c.markers.items()))
            qa = f"{_count(c.events, 'event')}, {_count(c.rationales, 'rationale')}"
            if c.previews:
                qa += f", {_count(c.previews, 'preview')}"
            if c.cuts:
                recording = f"{c.silenced_ms / 1000:.1f} s silenced in {_count(len(c.cuts), 'cut')}"
            else:
                recording = "unchanged" if c.recording else "none kept"
            table.add_row(escape(c.call_id), str(c.segments), markers, qa, recording)
        print_table(console, keep_whole(table, "call", "segments"))
    silenced = sum(c.silenced_ms for c in report.changed)
    console.print(f"{_count(report.calls, 'call')} looked at: {len(report.changed)} {would}, "
                  f"{_count(sum(c.segments for c in report.changed), 'segment')}, "
                  f"{_count(sum(sum(c.markers.values()) for c in report.changed), 'marker')} added, "
                  f"{silenced / 1000:.1f} s of recordings silenced"
                  + (f"; {len(report.errors)} left as they were (errors above)" if report.errors else ""),
                  soft_wrap=True)
    if report.changed and not report.dry_run:
        for line in (*report.pages, *report.left):
            console.print(f"- {escape(line)}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
