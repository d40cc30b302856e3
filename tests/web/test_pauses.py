"""A securely paused span on the call page: the worker's rows for a paused call (calls row and QA, as
pipeline/worker/outputs.py writes them) read back through the pages' checked query path, and drawn as
"paused", neither a hold nor a silence. Expectations worked out by hand in the comments."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.config import Settings
from pipeline.contracts.messages import CallEvent
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.web.data import read_call_page
from pipeline.web.render import PageContext, ServerLinks, call_timeline, render_call_page
from pipeline.web.timeline import Span, layout
from pipeline.worker.outputs import call_qa_message, call_qa_row, call_row
from pipeline.worker.state import CallState
from tests.web.conftest import T0, StoreRows

T0_MS = int(T0.timestamp() * 1000)
# The agent asks for the card (0-4 s), the capture is paused 6-28 s while it is read out, the customer
# speaks again at 30-33 s; the call ends at 36 s.
LINES = [("agent", 0, 4_000, "Can I take the long number on the card please"),
         ("customer", 30_000, 33_000, "Thanks that is all done")]
PAUSE = (6_000, 28_000)


@pytest.fixture
def paused_call(chdb_path: str, unique_name: str) -> Iterator[StoreRows]:
    client = connect(f"chdb://{chdb_path}", unique_name)
    migrate(client, unique_name)
    config = QaConfig.from_settings(Settings())
    analyzer = CallAnalyzer("CA-paused", config)
    for i, (leg, start, end, text) in enumerate(LINES):
        analyzer.process(Segment("CA-paused", leg, f"s{i}", start, end, text))  # type: ignore[arg-type]
    call = CallState("CA-paused", start=CallEvent("CA-paused", "start", tenant="acme"), started_at_ms=T0_MS,
                     pauses_ms=[PAUSE])
    call.segments_done = len(LINES)
    result = analyzer.finalize(36_000, call.hold_intervals(36_000), call.pause_intervals(36_000))
    qa = call_qa_message("CA-paused", result, call.start, call.hold_intervals(36_000), call.pause_intervals(36_000))
    for table, row in (("calls", call_row(call, qa, call.start, "end", 36_000, T0_MS + 36_000)),
                       ("call_qa", call_qa_row(qa))):
        client.insert(table, [list(row.values())], column_names=list(row), database=unique_name)
    yield StoreRows(client, unique_name)
    client.command(f"DROP DATABASE IF EXISTS {unique_name}")


def test_the_call_page_data_carries_the_paused_span_apart_from_holds(paused_call: StoreRows) -> None:
    page = read_call_page(paused_call, paused_call.database, "CA-paused")
    assert page is not None
    assert (page.pauses, page.paused_ms, page.holds) == ((PAUSE,), 22_000, ())
    # Paused 22 s of 36: 14 s captured, 7 s of it talk. The 4-30 s gap is cut into 4-6 s and 28-30 s: no
    # silence longer than 5 s, the longest 2 s.
    assert (page.metrics["paused_ms"], page.metrics["pauses"], page.metrics["hold_ms"]) == (22_000, 1, 0)
    assert (page.metrics["silence_count"], page.metrics["longest_silence_ms"]) == (0, 2_000)
    assert page.metrics["non_talk_ms"] == 7_000

    timeline = call_timeline(page, 5_000)
    assert [(b.start_ms, b.end_ms) for b in timeline.of_kind("paused")] == [PAUSE]
    assert timeline.of_kind("hold") == () and timeline.of_kind("silence") == ()
    html = render_call_page(page, PageContext(ServerLinks()))
    assert html.count('data-kind="paused"') == 1 and "capture paused (secure pause" in html


def test_a_gap_around_a_pause_is_silence_only_where_each_part_is_long() -> None:
    spans = [Span("agent", 0, 1_000, "turn-0"), Span("customer", 30_000, 31_000, "turn-1")]
    # Gap 1-30 s; paused 8-22 s. Parts 1-8 s (7 s) and 22-30 s (8 s): both silences over 5 s.
    t = layout(31_000, spans, silence_threshold_ms=5_000, pauses=[(8_000, 20_000), (19_000, 22_000)])
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("paused")] == [(8_000, 22_000)]
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("silence")] == [(1_000, 8_000), (22_000, 30_000)]
    # A band across both legs and the lane between them, as a hold's.
    band = t.of_kind("paused")[0]
    lanes = {lane.name: lane for lane in t.lanes}
    assert band.y == lanes["agent"].y and band.y + band.height == lanes["between"].y + lanes["between"].height
