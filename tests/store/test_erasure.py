"""Erasing calls: every row of the call goes from every table, the rest stays, the erasure is on record; the
sweeper erases calls past retention and erased calls whose rows came back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.recordings.storage import RecordingStore
from pipeline.store.erasure import ERASED_TABLES, ErasureWatch, erase_calls, erasures_of, rows_of, sweep


def _fill(store: Client, insert: Callable[..., None], make_call: Callable[..., dict[str, Any]],
          make_segment: Callable[..., dict[str, Any]], make_latency: Callable[..., dict[str, Any]],
          call_id: str, started: Any) -> None:
    insert(store, "calls", [{**make_call(call_id, ended=True), "started_at": started}])
    insert(store, "segments", [make_segment(call_id, "customer", 0, f"my date of birth is {call_id} secret",
                                            produced_at=started),
                               make_segment(call_id, "agent", 2000, "thank you", produced_at=started)])
    insert(store, "latency", [make_latency(call_id, 1, 800.0)])
    for table in ("call_qa", "qa_events", "reviews"):
        insert(store, table, [{"call_id": call_id}])
    insert(store, "recordings", [{"call_id": call_id, "url": f"memory:///rec/{call_id}.ogg", "started_at": started}])


def test_erase_removes_every_row_of_the_call_and_only_its_rows(store: Client, database: str, insert, make_call,
                                                                make_segment, make_latency, t0) -> None:
    for call in ("call-a", "call-b"):
        _fill(store, insert, make_call, make_segment, make_latency, call, t0)
    insert(store, "segments", [make_segment("call-a", "customer", 0, "a replayed copy")])  # an unmerged copy

    [erasure] = erase_calls(store, database, ["call-a"], "dpo@example.com")

    assert erasure.rows == {"calls": 1, "segments": 3, "latency": 1, "call_qa": 1, "qa_events": 1, "reviews": 1,
                            "recordings": 1}
    assert rows_of(store, database, ["call-a", "call-b"]) == {
        "call-a": {}, "call-b": {"calls": 1, "segments": 2, "latency": 1, "call_qa": 1, "qa_events": 1, "reviews": 1,
                                 "recordings": 1}}
    for table in ERASED_TABLES:  # not hidden by a mask: gone from the parts
        left = store.query(f"SELECT count() FROM {table} WHERE call_id = 'call-a' SETTINGS apply_deleted_mask = 0")
        assert left.result_rows[0][0] == 0, table
    assert store.query("SELECT count() FROM segments WHERE text LIKE '%secret%'").result_rows[0][0] == 1  # call-b's
    [recorded] = erasures_of(store, database, "call-a")
    assert (recorded.erased_by, recorded.reason, recorded.rows) == ("dpo@example.com", "request", erasure.rows)
    assert erase_calls(store, database, ["call-a"], "dpo@example.com")[0].rows == {}  # again: nothing left, on record
    assert len(erasures_of(store, database, "call-a")) == 2


def test_sweep_erases_calls_past_retention_and_rows_that_came_back(store: Client, database: str, insert, make_call,
                                                                   make_segment, make_latency, t0) -> None:
    now = t0 + timedelta(days=40)
    _fill(store, insert, make_call, make_segment, make_latency, "old", t0)
    _fill(store, insert, make_call, make_segment, make_latency, "new", now - timedelta(days=2))
    insert(store, "segments", [make_segment("open-old", "agent", 0, "never ended", produced_at=t0)])  # no calls row
    _fill(store, insert, make_call, make_segment, make_latency, "erased", now - timedelta(days=1))

    assert sweep(store, database, 0, now).erased == []  # retention off, nothing erased yet
    erase_calls(store, database, ["erased"], "dpo")
    insert(store, "segments", [make_segment("erased", "agent", 0, "written again by a replay")])

    done = sweep(store, database, 30, now).erased

    assert sorted((e.call_id, e.reason, e.erased_by) for e in done) == [
        ("erased", "again", "sweeper"), ("old", "retention", "retention"), ("open-old", "retention", "retention")]
    left = rows_of(store, database, ["old", "open-old", "erased", "new"])
    assert left["old"] == left["open-old"] == left["erased"] == {} and left["new"]["segments"] == 2
    assert sweep(store, database, 30, now).erased == []  # nothing more to do


def test_erase_and_audio_retention_remove_recording_files(store: Client, database: str, insert, make_call,
                                                          make_segment, make_latency, t0, tmp_path) -> None:
    files = RecordingStore(str(tmp_path / "recordings"))
    now = t0 + timedelta(days=10)
    for call, started in (("old", t0), ("new", now - timedelta(days=1)), ("gone", now)):
        _fill(store, insert, make_call, make_segment, make_latency, call, started)
        files.put(call, b"OggS" + call.encode())
    files.put("no-row", b"OggS")  # written, its row not yet (a worker killed in between)

    [erasure] = erase_calls(store, database, ["gone"], "dpo", remove_recording=files.delete)
    erase_calls(store, database, ["no-row"], "dpo", remove_recording=files.delete)
    assert erasure.rows["recording_files"] == 1 and erasure.rows["recordings"] == 1
    assert not files.exists("gone") and not files.exists("no-row")

    done = sweep(store, database, 0, now, retention_days_audio=7, remove_recording=files.delete)

    assert (done.erased, done.recordings_dropped) == ([], 1)
    assert not files.exists("old") and files.exists("new")
    left = rows_of(store, database, ["old", "new"])
    assert "recordings" not in left["old"] and left["old"]["segments"] == 2  # the transcript stays
    assert left["new"]["recordings"] == 1


def test_a_second_sweep_reads_only_the_erasures_recorded_since_the_first(store: Client, database: str, insert,
                                                                         make_call, make_segment, make_latency,
                                                                         t0) -> None:
    for call in ("e1", "e2", "e3"):
        _fill(store, insert, make_call, make_segment, make_latency, call, t0)
    erase_calls(store, database, ["e1", "e2", "e3"], "dpo")
    watch = ErasureWatch(overlap_s=0.0)

    assert sweep(store, database, 0, watch=watch).erased == []
    assert watch.rows_read == 3
    erase_calls(store, database, ["e4"], "dpo")
    insert(store, "segments", [make_segment("e2", "agent", 0, "written again by a replay")])
    insert(store, "segments", [make_segment("e4", "agent", 0, "a post-call job queued before the erase")])

    done = sweep(store, database, 0, watch=watch).erased

    # Both came-back calls found, yet only e4's erasure was read: e1..e3's were remembered, not read again.
    assert sorted((e.call_id, e.reason) for e in done) == [("e2", "again"), ("e4", "again")]
    assert watch.rows_read == 3 + 1
    assert rows_of(store, database, ["e2", "e4"]) == {"e2": {}, "e4": {}}
    sweep(store, database, 0, watch=watch)
    assert watch.rows_read == 3 + 1 + 2  # the two erasures the last sweep recorded, nothing older


def test_an_erasure_older_than_the_watch_is_forgotten(store: Client, database: str, insert, make_segment) -> None:
    erase_calls(store, database, ["long-ago"], "dpo")
    later = ErasureWatch(watch_s=3600.0, clock=lambda: datetime.now(UTC) + timedelta(hours=2))
    insert(store, "segments", [make_segment("long-ago", "agent", 0, "a row of an old erased call")])

    assert sweep(store, database, 0, watch=later).erased == []
    assert later.rows_read == 0 and later.erased == {}


def test_a_sweep_given_an_earlier_now_still_records_its_erasures_where_the_next_sweep_reads(
        store: Client, database: str, insert, make_segment) -> None:
    # The sweep's ``now`` places retention cutoffs; its erasures were recorded at it, before the point the watch
    # had read to, and a next sweep with no overlap missed them (CI saw it whenever a millisecond passed between).
    erase_calls(store, database, ["came-back"], "dpo")
    watch = ErasureWatch(overlap_s=0.0)
    sweep(store, database, 0, watch=watch)
    insert(store, "segments", [make_segment("came-back", "agent", 0, "written again by a replay")])
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)

    [again] = sweep(store, database, 0, an_hour_ago, watch=watch).erased
    read = watch.rows_read
    sweep(store, database, 0, watch=watch)

    assert again.reason == "again" and again.erased_at > an_hour_ago + timedelta(minutes=59)
    assert watch.rows_read == read + 1  # the erasure the last sweep recorded, read by this one
