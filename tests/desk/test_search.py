"""Search across calls (pipeline/desk/search.py) on the embedded ClickHouse engine, through the query API's
check: whole words in order, the redacted text only, the latest revision, the call list's filters and pages."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.desk.search import SearchError, SearchQuery, phrase_pattern, search, words_of
from tests.desk.conftest import T0, CheckedRows


def ids(source: CheckedRows, **query: object) -> list[str]:
    return [c.call_id for c in search(source, source.database, SearchQuery(**query))]  # type: ignore[arg-type]


@pytest.fixture
def calls(add_call: Callable[..., None]) -> None:
    add_call("c1", [("agent", 1, "Thank you for calling, how can I help?"),
                    ("customer", 4, "I want to cancel my account today."),
                    ("agent", 9, "I'm sorry to hear that. Cancel the account, you said?")], minute=0, score=92.0)
    add_call("c2", [("customer", 2, "My account was charged twice; please cancel the second charge."),
                    ("agent", 6, "The cancellation is done.")], agent="agent-9", minute=1, score=55.0,
             failed=("recording_disclosure",))
    add_call("c3", [("customer", 3, "My card is [PAN], expiry [EXPIRY]."),
                    ("agent", 8, "CANCEL-MY-ACCOUNT is not a phrase we use.")], minute=2, score=None)


def test_a_phrase_finds_its_words_whole_in_order_case_insensitive(source: CheckedRows, calls: None) -> None:
    found = search(source, source.database, SearchQuery("cancel my account"))
    # c3's "CANCEL-MY-ACCOUNT": the same words side by side (the index cuts at "-" too); c2 has the words
    # but not together; newest first.
    assert [c.call_id for c in found] == ["c3", "c1"]
    c1 = found[1]
    assert c1.turns == 1 and [(h.leg, h.start_ms, h.text) for h in c1.hits] == [
        ("customer", 4000, "I want to cancel my account today.")]
    assert c1.agent_id == "agent-7" and c1.score_pct == 92.0 and found[0].score_pct is None
    # "cancel" is a word: not "cancellation"; every turn of a call that holds it, in time order.
    cancel = {c.call_id: c for c in search(source, source.database, SearchQuery("Cancel"))}
    assert set(cancel) == {"c1", "c2", "c3"}
    assert [h.start_ms for h in cancel["c1"].hits] == [4000, 9000] and cancel["c2"].turns == 1
    assert ids(source, phrase="my account cancel") == []  # order matters
    assert ids(source, phrase="cancellation") == ["c2"]


def test_redacted_digits_are_found_nowhere(source: CheckedRows, calls: None) -> None:
    assert ids(source, phrase="4111 1111 1111 1111") == []
    assert ids(source, phrase="pan") == ["c3"]  # the marker that stands where the card number was said


def test_filters_narrow_the_calls(source: CheckedRows, calls: None) -> None:
    assert ids(source, phrase="cancel", leg="agent") == ["c3", "c1"]
    assert ids(source, phrase="cancel", leg="customer") == ["c2", "c1"]
    assert ids(source, phrase="cancel", agent="agent-9") == ["c2"]
    assert ids(source, phrase="cancel", score_below=60) == ["c2"]  # unscored c3 is not "below"
    assert ids(source, phrase="cancel", failed="recording_disclosure") == ["c2"]
    assert ids(source, phrase="cancel", since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=2)) == ["c2"]
    assert ids(source, failed="recording_disclosure") == ["c2"]  # no phrase: the filters alone
    assert ids(source) == ["c3", "c2", "c1"]


def test_pages_follow_the_call_list(source: CheckedRows, calls: None) -> None:
    first = search(source, source.database, SearchQuery("cancel", limit=2))
    assert [c.call_id for c in first] == ["c3", "c2"]
    rest = search(source, source.database, SearchQuery("cancel", limit=2, after=(first[-1].started_at,
                                                                                  first[-1].call_id)))
    assert [c.call_id for c in rest] == ["c1"]


def test_only_the_calls_latest_revision_is_searched(source: CheckedRows, add_call: Callable[..., None]) -> None:
    add_call("c1", [("customer", 4, "I want to cancel my account today.")], revision=0)
    # The post-call pass heard it better: the customer said "close", not "cancel".
    add_call("c1", [("customer", 4, "I want to close my account today.")], revision=1)
    assert ids(source, phrase="cancel my account") == []
    assert ids(source, phrase="close my account") == ["c1"]


def test_a_replayed_segment_is_one_turn(source: CheckedRows, store: Client, add_call: Callable[..., None]) -> None:
    add_call("c1", [("customer", 4, "please cancel it")])
    add_call("c1", [("customer", 4, "please cancel it")])  # the worker replayed after a restart
    found = search(source, source.database, SearchQuery("cancel"))
    assert len(found) == 1 and found[0].turns == 1


def test_the_index_holds_what_the_search_cuts(store: Client, add_call: Callable[..., None]) -> None:
    """The phrase's words are the index's tokens: ask ClickHouse's tokenizer, not a copy of its rule."""
    text = "Don't CANCEL-my account: ok?! e-mail x_y 42nd"
    tokens = store.query("SELECT tokens(lower({t:String}), 'splitByNonAlpha')", parameters={"t": text}).result_rows
    assert words_of(text) == list(tokens[0][0])
    # And the search reads through the index (its granules skipped), not a scan of every segment.
    add_call("c1", [("customer", 4, "please cancel it")])
    plan = "\n".join(r[0] for r in store.query(
        "EXPLAIN indexes = 1 SELECT count() FROM segments WHERE hasAllTokens(lower(text), ['cancel'])").result_rows)
    assert "text_words" in plan


def test_a_bad_search_says_what_is_wrong() -> None:
    with pytest.raises(SearchError, match="leg must be one of agent, customer"):
        SearchQuery("x", leg="supervisor")
    with pytest.raises(SearchError, match="no word to search"):
        SearchQuery("?!")
    with pytest.raises(SearchError, match="at most 16"):
        SearchQuery(" ".join(["word"] * 17))
    with pytest.raises(SearchError, match="must be before until"):
        SearchQuery("x", since=T0, until=T0)
    assert phrase_pattern(("a", "b")).startswith("(^|[")
