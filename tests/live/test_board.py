"""The live desk's board (pipeline/live/board.py): what a viewer sees of the calls in progress, and the events a
stream resumes from. No broker: messages as the follower decodes them, expectations written by hand."""

from __future__ import annotations

from pipeline.access.users import Principal
from pipeline.contracts.messages import LiveCall, QaAlert, TranscriptSegment
from pipeline.live.board import LATE_CALLS, LiveBoard

OPERATOR = Principal.operator()
ACME = Principal("sue", "supervisor", tenant="acme")
GLOBEX = Principal("gil", "supervisor", tenant="globex")
AGENT_A7 = Principal("ann", "agent", tenant="acme", agent_id="a7")


def summary(call_id: str, updated: int = 1_000, tenant: str = "acme", agent: str = "a7", **figures: object) -> LiveCall:
    return LiveCall(call_id, started_at_ms=500, updated_at_ms=updated, tenant=tenant, agent_id=agent, **figures)  # type: ignore[arg-type]


def turn(call_id: str, start: int, text: str, final: bool = True, leg: str = "customer", revision: int = 0,
         ) -> TranscriptSegment:
    return TranscriptSegment(f"{call_id}/{leg}/{start}", call_id, leg, start, start + 900, text, final,  # type: ignore[arg-type]
                             0.9, -0.1, 0.0, "m", 1, produced_at_ms=2_000, revision=revision)


def alert(call_id: str, offset: int = 3_000) -> QaAlert:
    return QaAlert(call_id, "escalation_request", "intent", "customer", "detect", offset, "speak to a manager")


def test_each_viewer_sees_the_calls_of_its_scope_only() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c2", summary("c2", agent="a9")), ("c3", summary("c3", tenant="globex"))])
    assert [c["call_id"] for c in board.snapshot(OPERATOR)] == ["c1", "c2", "c3"]
    assert [c["call_id"] for c in board.snapshot(ACME)] == ["c1", "c2"]
    assert [c["call_id"] for c in board.snapshot(AGENT_A7)] == ["c1"]
    assert [c["call_id"] for c in board.snapshot(GLOBEX)] == ["c3"]
    assert board.call("c1", GLOBEX) is None and board.call("c3", ACME) is None  # as unknown as an unknown id
    assert board.call("nope", OPERATOR) is None


def test_a_partial_is_replaced_by_its_final_and_never_the_other_way() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c1", turn("c1", 1_000, "I want to", final=False))])
    board.apply([("c1", turn("c1", 1_000, "I want to cancel my", final=False))])
    board.apply([("c1", turn("c1", 1_000, "I want to cancel my account"))])
    board.apply([("c1", turn("c1", 1_000, "I want to cancel my", final=False))])  # a late partial
    view = board.call("c1", ACME)
    assert view is not None
    assert [(t["text"], t["final"]) for t in view["turns"]] == [("I want to cancel my account", True)]


def test_a_replay_after_a_take_over_is_taken_once() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c1", turn("c1", 1_000, "hello")), ("c1", alert("c1"))])
    seq = board.seq
    board.apply([("c1", turn("c1", 1_000, "hello")), ("c1", alert("c1")), ("c1", summary("c1", updated=900))])
    assert board.seq == seq  # no new event: same final, same alert, an older summary
    view = board.call("c1", OPERATOR)
    assert view is not None and len(view["turns"]) == 1 and len(view["alerts"]) == 1


def test_turns_come_in_call_time_order_whatever_order_they_arrived_in() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c1", turn("c1", 5_000, "second", leg="agent")),
                 ("c1", turn("c1", 1_000, "first"))])
    view = board.call("c1", OPERATOR)
    assert view is not None and [t["text"] for t in view["turns"]] == ["first", "second"]


def test_a_post_call_revision_is_not_a_live_turn() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c1", turn("c1", 1_000, "better text", revision=1))])
    view = board.call("c1", OPERATOR)
    assert view is not None and view["turns"] == []


def test_turns_that_come_before_their_calls_summary_wait_for_it() -> None:
    board = LiveBoard()
    board.apply([("c1", turn("c1", 1_000, "early")), ("c1", alert("c1"))])
    assert board.snapshot(OPERATOR) == [] and board.seq == 0
    board.apply([("c1", summary("c1"))])
    view = board.call("c1", ACME)
    assert view is not None and [t["text"] for t in view["turns"]] == ["early"] and len(view["alerts"]) == 1
    assert [e.kind for e in board.events] == ["call", "turn", "alert"]


def test_an_ended_call_leaves_the_wall_its_page_links_to_the_finished_call_and_a_stale_summary_is_ignored() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c2", summary("c2"))])
    board.apply([("c1", None)])
    assert [c["call_id"] for c in board.snapshot(ACME)] == ["c2"]
    assert board.call("c1", ACME) == {"ended": True, "page": "/calls/c1", "last_event_id": board.event_id(board.seq)}
    assert board.call("c1", GLOBEX) is None
    board.apply([("c1", summary("c1", updated=5_000))])  # a lost worker's copy
    assert [c["call_id"] for c in board.snapshot(ACME)] == ["c2"]
    assert board.events[-1].kind == "ended" and board.events[-1].data == {"call_id": "c1", "page": "/calls/c1"}


def test_a_final_or_alert_read_after_its_calls_end_is_still_shown_once_but_the_call_stays_ended() -> None:
    # The tombstone goes out on another producer and topic than the call's last final: it can be read first.
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c1", turn("c1", 1_000, "hello")), ("c1", None)])
    seq = board.seq
    board.apply([("c1", turn("c1", 9_000, "thank you for calling", final=False)),  # a partial: its final follows
                 ("c1", turn("c1", 9_000, "thank you for calling, goodbye")), ("c1", alert("c1", 9_500)),
                 ("c1", turn("c1", 9_000, "thank you for calling, goodbye")), ("c1", alert("c1", 9_500)),  # replays
                 ("c1", turn("c1", 1_000, "hello"))])  # shown before the end already
    after = board.events_after(board.event_id(seq), ACME, call_id="c1")
    assert after is not None and [(e.kind, e.data.get("text")) for e in after] == [
        ("turn", "thank you for calling, goodbye"), ("alert", "speak to a manager")]
    assert board.events_after(board.event_id(seq), GLOBEX) == []  # the scope of the call it belonged to
    assert board.snapshot(OPERATOR) == [] and board.call("c1", ACME) == {
        "ended": True, "page": "/calls/c1", "last_event_id": board.event_id(board.seq)}


def test_only_the_newest_ended_calls_take_late_turns() -> None:
    board = LiveBoard()
    board.apply([(f"c{i}", summary(f"c{i}")) for i in range(LATE_CALLS + 1)])
    board.apply([(f"c{i}", None) for i in range(LATE_CALLS + 1)])
    seq = board.seq
    board.apply([("c0", turn("c0", 1_000, "too late")), ("c1", turn("c1", 1_000, "in time"))])
    after = board.events_after(board.event_id(seq), OPERATOR)
    assert after is not None and [(e.call_id, e.data["text"]) for e in after] == [("c1", "in time")]


def test_a_stream_resumes_after_the_last_event_it_got_and_only_with_what_its_viewer_may_see() -> None:
    board = LiveBoard()
    board.apply([("c1", summary("c1")), ("c3", summary("c3", tenant="globex"))])
    last = board.event_id(board.seq)
    board.apply([("c1", turn("c1", 1_000, "one")), ("c3", turn("c3", 1_000, "other tenant")),
                 ("c1", alert("c1")), ("c1", None)])
    after = board.events_after(last, ACME)
    assert after is not None and [(e.kind, e.call_id) for e in after] == [("turn", "c1"), ("alert", "c1"),
                                                                         ("ended", "c1")]
    only_c3 = board.events_after(last, OPERATOR, call_id="c3")
    assert only_c3 is not None and [e.data["text"] for e in only_c3] == ["other tenant"]
    assert board.events_after(board.event_id(board.seq), ACME) == []  # up to date: nothing, not a snapshot


def test_an_id_it_cannot_resume_from_asks_for_the_snapshot() -> None:
    board = LiveBoard(buffer=100)
    board.apply([("c1", summary("c1"))])
    first = board.event_id(board.seq)
    for i in range(150):
        board.apply([("c1", summary("c1", updated=2_000 + i))])
    assert board.events_after(first, ACME) is None  # dropped from the buffer since
    assert board.events_after(None, ACME) is None  # a new stream
    assert board.events_after("0000.5", ACME) is None  # another desk's, or this desk's before a restart
    assert board.events_after(f"{board.epoch}.99999", ACME) is None  # not given yet
    for bad in (f"{board.epoch}.", f"{board.epoch}.-1", f"{board.epoch}.1e3", f"{board.epoch}.٣", "x" * 5000):
        assert board.events_after(bad, ACME) is None
    assert board.events_after(board.event_id(board.seq - 100), ACME) is not None  # the oldest kept still resumes
