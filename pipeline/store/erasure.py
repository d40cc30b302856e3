"""Erasing calls from the store: on request (`callqa erase`), by retention (the worker's sweeper), and again when
an erased call's rows come back.

An erasure removes every row of the call from every table callqa writes (``ERASED_TABLES``) with a mutation that
rewrites the parts (``ALTER TABLE ... DELETE``, waited for): a lightweight ``DELETE FROM`` only marks rows, and
their text would stay on disk until a merge. It then writes who erased what and when to ``erasures`` (the call's
id, the rows removed per table, never its text).

A row can come back after an erase: a post-call job queued before it, or a worker replaying the audio topic after
a crash, writes the call again. The sweeper (``sweep``) looks for erased calls with rows and erases them again
(reason ``again``), so what an erase removed stays removed within one sweep interval.

Retention (``retention_days_transcripts``): a call whose start is older than that many days is erased whole
(reason ``retention``, by ``retention``); a call with no ``calls`` row (it never ended) by its newest segment.
Recordings (``retention_days_audio``) may go sooner: the file and its ``recordings`` row, the transcript kept.

Recording files live outside the store (pipeline/recordings/storage.py); the caller passes how to remove one
(``RemoveRecording``), which an erase calls for every call before its rows go, so a file whose row was never
written goes too, and a file that could not be removed leaves its row for the next sweep to find.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from clickhouse_connect.driver.client import Client

from pipeline.store.client import check_identifier

# Every table that holds rows of a call, keyed by call_id (migrations.py).
ERASED_TABLES = ("calls", "segments", "latency", "call_qa", "qa_events", "reviews", "recordings")
# Calls a sweep erases at most (a larger backlog goes on at the next sweep): one mutation per table each time.
SWEEP_BATCH = 1000
# Removes a call's recording file (pipeline/recordings/storage.py RecordingStore.delete): whether there was one.
RemoveRecording = Callable[[str], bool]


class EraseError(RuntimeError):
    """The erasure was refused (a live call) or failed; one line."""


@dataclass(frozen=True)
class Erasure:
    """One call erased: the rows removed per table (tables with none left out)."""

    call_id: str
    erased_by: str
    reason: str  # request | retention | again
    erased_at: datetime
    rows: dict[str, int] = field(default_factory=dict)
    outside: str = ""

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def rows_of(client: Client, database: str, call_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per call, its rows per table (every revision, every copy not yet merged)."""
    db = check_identifier(database)
    found: dict[str, dict[str, int]] = {c: {} for c in call_ids}
    if not call_ids:
        return found
    union = " UNION ALL ".join(
        f"SELECT '{t}' AS t, call_id, count() AS n FROM {db}.{t} WHERE call_id IN {{ids:Array(String)}} GROUP BY call_id"
        for t in ERASED_TABLES)
    for table, call_id, n in client.query(union, parameters={"ids": list(call_ids)}).result_rows:
        found[call_id][table] = int(n)
    return found


def erase_calls(client: Client, database: str, call_ids: Sequence[str], erased_by: str, reason: str = "request",
                outside: str = "",
                remove_recording: RemoveRecording | None = None) -> list[Erasure]:
    """Remove every row of these calls from the store, waiting for the rewrite, and record each erasure (also of
    a call with no rows: the request is on record); their recording files first (``recording_files`` in rows)."""
    db = check_identifier(database)
    ids = list(dict.fromkeys(call_ids))
    if not ids:
        return []
    counts = rows_of(client, db, ids)
    if remove_recording is not None:
        for c in ids:
            if remove_recording(c):
                counts[c]["recording_files"] = 1
    for table in ERASED_TABLES:
        if any(counts[c].get(table) for c in ids):
            client.command(f"ALTER TABLE {db}.{table} DELETE WHERE call_id IN {{ids:Array(String)}}",
                           parameters={"ids": ids}, settings={"mutations_sync": 2})
    # At the clock, after the mutations: a sweep's watch has read the history up to its start (ErasureWatch).
    when = datetime.now(UTC)
    erasures = [Erasure(c, erased_by, reason, when, counts[c], outside) for c in ids]
    client.insert("erasures", [[e.call_id, e.erased_at, e.erased_by, e.reason, e.rows, e.outside] for e in erasures],
                  column_names=["call_id", "erased_at", "erased_by", "reason", "rows", "outside"], database=db)
    return erasures


def erasures_of(client: Client, database: str, call_id: str) -> list[Erasure]:
    """The recorded erasures of a call, oldest first."""
    db = check_identifier(database)
    rows = client.query(f"SELECT call_id, erased_by, reason, erased_at, rows, outside FROM {db}.erasures "
                        "WHERE call_id = {id:String} ORDER BY erased_at", parameters={"id": call_id}).result_rows
    return [Erasure(r[0], r[1], r[2], r[3], dict(r[4]), r[5]) for r in rows]


@dataclass
class ErasureWatch:
    """Where the sweeper got to in the erasure history, so a sweep reads only the erasures recorded since the
    last one (and a short overlap for one recorded late) instead of the whole history, which retention makes
    one row per call ever taken.

    Rows of an erased call come back through what still holds the call: a worker replaying the audio topic, a
    post-call job queued before the erase (both kept ``audio_retention_ms``, 6 h by default). An erased call is
    watched for ``watch_s`` after its erase (a margin over those) and then forgotten, which bounds what is kept
    here and what each sweep asks the tables about."""

    watch_s: float = 7 * 86400.0
    overlap_s: float = 600.0  # an erasure is recorded after its mutations: one a little older may come in late
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    read_to: datetime | None = None  # the erasures recorded before this (less the overlap) were read
    erased: dict[str, datetime] = field(default_factory=dict)  # watched call -> its latest erasure
    rows_read: int = 0  # erasure rows read so far

    def watched(self, client: Client, database: str) -> list[str]:
        """The erased calls to look for rows of: those erased in the last ``watch_s``, read incrementally."""
        db = check_identifier(database)
        now = self.clock()
        horizon = now - timedelta(seconds=self.watch_s)
        since = horizon if self.read_to is None else max(horizon, self.read_to - timedelta(seconds=self.overlap_s))
        rows = client.query(f"SELECT call_id, erased_at FROM {db}.erasures WHERE erased_at >= {{since:DateTime64(3)}}",
                            parameters={"since": since}).result_rows
        self.rows_read += len(rows)
        for call_id, erased_at in rows:
            at = erased_at if erased_at.tzinfo is not None else erased_at.replace(tzinfo=UTC)
            if at > self.erased.get(call_id, at - timedelta(seconds=1)):
                self.erased[call_id] = at
        # The store keeps milliseconds: an erasure recorded later in this millisecond is stored as earlier than now.
        self.read_to = now.replace(microsecond=now.microsecond // 1000 * 1000)
        self.erased = {c: at for c, at in self.erased.items() if at >= horizon}
        return sorted(self.erased)


_watches: dict[str, ErasureWatch] = {}  # per database: this process's sweeps go on where the last one stopped


def returned_calls(client: Client, database: str, limit: int = SWEEP_BATCH,
                   watch: ErasureWatch | None = None) -> list[str]:
    """Erased calls that have rows again (of those ``watch`` follows: by default this process's, per database)."""
    db = check_identifier(database)
    watch = watch if watch is not None else _watches.setdefault(db, ErasureWatch())
    ids = watch.watched(client, db)
    if not ids:
        return []
    union = " UNION DISTINCT ".join(
        f"SELECT DISTINCT call_id FROM {db}.{t} WHERE call_id IN {{ids:Array(String)}}" for t in ERASED_TABLES)
    return [r[0] for r in client.query(f"SELECT call_id FROM ({union}) ORDER BY call_id LIMIT {int(limit)}",
                                       parameters={"ids": ids}).result_rows]


def expired_calls(client: Client, database: str, cutoff: datetime, limit: int = SWEEP_BATCH) -> list[str]:
    """Calls that started before ``cutoff`` (those with no calls row: whose newest segment is older)."""
    db = check_identifier(database)
    sql = (f"SELECT call_id FROM (SELECT call_id FROM {db}.calls GROUP BY call_id HAVING min(started_at) < {{cut:DateTime64(3)}} "
           f"UNION DISTINCT SELECT call_id FROM {db}.segments WHERE call_id NOT IN (SELECT call_id FROM {db}.calls) "
           f"GROUP BY call_id HAVING max(produced_at) < {{cut:DateTime64(3)}}) ORDER BY call_id LIMIT {int(limit)}")
    return [r[0] for r in client.query(sql, parameters={"cut": cutoff}).result_rows]


def expired_recordings(client: Client, database: str, cutoff: datetime, limit: int = SWEEP_BATCH) -> list[str]:
    """Calls with a recording whose call started before ``cutoff``."""
    db = check_identifier(database)
    sql = (f"SELECT call_id FROM {db}.recordings GROUP BY call_id HAVING min(started_at) < {{cut:DateTime64(3)}} "
           f"ORDER BY call_id LIMIT {int(limit)}")
    return [r[0] for r in client.query(sql, parameters={"cut": cutoff}).result_rows]


def drop_recordings(client: Client, database: str, call_ids: Sequence[str], remove_recording: RemoveRecording) -> int:
    """Delete these calls' recordings (files, then rows), their transcripts kept; how many files there were."""
    db = check_identifier(database)
    ids = list(dict.fromkeys(call_ids))
    removed = sum(remove_recording(c) for c in ids)
    if ids:
        client.command(f"ALTER TABLE {db}.recordings DELETE WHERE call_id IN {{ids:Array(String)}}",
                       parameters={"ids": ids}, settings={"mutations_sync": 2})
    return removed


@dataclass(frozen=True)
class Sweep:
    erased: list[Erasure]
    recordings_dropped: int = 0  # recordings past retention_days_audio


def sweep(client: Client, database: str, retention_days_transcripts: float, now: datetime | None = None,
          retention_days_audio: float = 0, remove_recording: RemoveRecording | None = None,
          watch: ErasureWatch | None = None) -> Sweep:
    """One pass of the sweeper: erased calls whose rows came back, then calls past retention, then recordings past
    theirs (0 days: kept). ``now`` places the retention cutoffs; erasures are recorded at the clock."""
    now = now or datetime.now(UTC)
    done = erase_calls(client, database, returned_calls(client, database, watch=watch), "sweeper", "again",
                       remove_recording=remove_recording)
    if retention_days_transcripts > 0:
        cutoff = datetime.fromtimestamp(now.timestamp() - retention_days_transcripts * 86400, UTC)
        done += erase_calls(client, database, expired_calls(client, database, cutoff), "retention", "retention",
                            remove_recording=remove_recording)
    dropped = 0
    if retention_days_audio > 0 and remove_recording is not None:
        cutoff = datetime.fromtimestamp(now.timestamp() - retention_days_audio * 86400, UTC)
        dropped = drop_recordings(client, database, expired_recordings(client, database, cutoff), remove_recording)
    return Sweep(done, dropped)


def erase_in_store(client: Client, database: str, call_id: str, erased_by: str, force: bool = False,
                   outside: str = "", remove_recording: RemoveRecording | None = None) -> dict[str, int]:
    """The store's part (the worker's API runs this too): refuses a call that has not ended unless ``force``."""
    db = check_identifier(database)
    if not call_id.strip():
        raise EraseError("a call id is needed")
    if not force:
        live = client.query(f"SELECT count() FROM {db}.calls_deduped WHERE call_id = {{id:String}} AND ended_at IS NULL",
                            parameters={"id": call_id}).result_rows[0][0]
        if live:
            raise EraseError(f"call {call_id} has not ended: its worker would write it again (erase it once it has "
                             "ended, or --force)")
    return erase_calls(client, db, [call_id], erased_by or "unknown", "request", outside,
                       remove_recording=remove_recording)[0].rows
