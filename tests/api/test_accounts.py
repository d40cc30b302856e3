"""The login throttle and the bearer-token look-ups: a try is counted before its check runs, so tries sent
together are bounded as tries sent one after another are, and a source's unknown tokens are bounded before
each one costs a store look-up."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.access.users import Principal, token_digest
from pipeline.api.accounts import AccountTokens, LoginThrottle, TokenLookupsThrottled


def test_tries_in_flight_count_so_no_more_than_the_limit_pass_at_once() -> None:
    throttle = LoginThrottle(max_failures=3, window_s=300.0)
    passed = [throttle.reserve("address:a", "name:bob") for _ in range(5)]  # none has finished its check
    assert [wait == 0 for wait in passed] == [True, True, True, False, False]
    assert 299 < passed[3] <= 300
    assert throttle.reserve("address:b", "name:bob") > 0  # the name is at its limit from any address
    assert throttle.reserve("address:b", "name:ann") == 0


def test_a_try_that_succeeds_is_not_a_failure() -> None:
    throttle = LoginThrottle(max_failures=2, window_s=300.0)
    for _ in range(5):  # right every time: never throttled
        assert throttle.reserve("address:a") == 0
        throttle.release("address:a")
    assert throttle.reserve("address:a") == 0 and throttle.reserve("address:a") == 0  # two failures
    assert throttle.reserve("address:a") > 0


def _accounts(known: dict[str, Principal], started: list[str], gate: asyncio.Event | None = None,
              max_misses: int = 3) -> AccountTokens:
    accounts = AccountTokens(ttl_s=600.0, max_misses=max_misses, window_s=60.0)

    async def lookup(digest: str) -> Principal | None:
        started.append(digest)
        if gate is not None:
            await gate.wait()
        return known.get(digest)

    accounts.source = lookup
    return accounts


async def test_unknown_tokens_from_one_source_are_bounded_before_the_store_is_asked() -> None:
    bob = Principal("bob", "supervisor", "acme", "", "id-bob")
    started: list[str] = []
    accounts = _accounts({token_digest("bob-token"): bob}, started)
    assert await accounts.principal("bob-token", "10.0.0.1") == bob  # found: not a miss
    for n in range(3):
        assert await accounts.principal(f"guess-{n}", "10.0.0.1") is None
    with pytest.raises(TokenLookupsThrottled, match=r"^too many unknown bearer tokens from 10.0.0.1: try again in"):
        await accounts.principal("guess-3", "10.0.0.1")
    assert len(started) == 4  # bob's and three guesses: the fourth guess cost nothing
    assert await accounts.principal("guess-0", "10.0.0.1") is None  # known to be wrong: from the cache
    assert await accounts.principal("bob-token", "10.0.0.1") == bob  # a known token still works from there
    assert await accounts.principal("guess-4", "10.0.0.2") is None  # another source has its own count
    assert len(started) == 5


async def test_guesses_sent_together_start_no_more_look_ups_than_the_limit() -> None:
    started: list[str] = []
    gate = asyncio.Event()
    accounts = _accounts({}, started, gate)
    tries = [asyncio.ensure_future(accounts.principal(f"guess-{n}", "10.0.0.1")) for n in range(10)]
    await asyncio.sleep(0)  # every try reaches its look-up (or its refusal) before any look-up answers
    gate.set()
    outcomes = await asyncio.gather(*tries, return_exceptions=True)
    assert len(started) == 3
    assert [o is None for o in outcomes].count(True) == 3
    assert all(isinstance(o, TokenLookupsThrottled) for o in outcomes if o is not None)


async def test_a_store_that_cannot_answer_is_not_the_callers_miss() -> None:
    accounts = AccountTokens(ttl_s=600.0, max_misses=1, window_s=60.0)

    async def failing(digest: str) -> Principal | None:
        raise ConnectionError("store away")

    accounts.source = failing
    for n in range(3):
        assert await accounts.principal(f"token-{n}", "10.0.0.1") is None  # refused, never throttled
