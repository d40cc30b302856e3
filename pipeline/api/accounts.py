"""Bearer tokens of accounts (pipeline/access/users.py): a token that is not the operator's is looked up by its
SHA-256 in the store, through the API's pool and read-only clients, and the answer kept ``ttl_s`` seconds, so a
removed account's token stops working on every worker within that time.

A token the store does not know costs a look-up on the API's small pool, and a new made-up token each time
misses the cache: each source may have ``max_misses`` tokens not found in ``window_s`` (a look-up is counted
before it runs, so look-ups in flight count too); past that a token not already known is refused (429) without
a look-up until the window passes. Tokens already known keep working from the cache."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from pipeline.access.users import Principal, account_principal, principal_of, token_digest
from pipeline.api.pool import QueryPool, ThreadClients

Lookup = Callable[[str], Awaitable[Principal | None]]
log = logging.getLogger("callqa.worker.api")


class TokenLookupsThrottled(RuntimeError):
    """A source past its look-ups of unknown tokens: refused without one (429) for ``wait_s`` seconds."""

    def __init__(self, source: str, wait_s: float) -> None:
        super().__init__(f"too many unknown bearer tokens from {source}: try again in {wait_s:.0f} s")
        self.wait_s = wait_s


class AccountTokens:
    """Account principals by token (the API) and by account id (a page session's), cached; without a ``source``
    (no store attached) no account is known."""

    def __init__(self, ttl_s: float = 5.0, max_misses: int = 30, window_s: float = 60.0) -> None:
        self.ttl_s = ttl_s
        self.source: Lookup | None = None  # by the token's SHA-256 (hex)
        self.by_id: Lookup | None = None  # by the account's id
        self.misses = LoginThrottle(max_misses, window_s)  # unknown tokens per source
        self._known: dict[tuple[str, str], tuple[Principal | None, float]] = {}

    async def principal(self, token: str, source: str = "") -> Principal | None:
        """The account of ``token``, or None; TokenLookupsThrottled when ``source`` is past its unknown tokens
        and this one is not cached."""
        if not token.strip() or self.source is None:
            return None
        digest = token_digest(token)
        known = self._cached("token", digest)
        if known is not None:
            return known[0]
        key = f"address:{source}"
        wait = self.misses.reserve(key)
        if wait > 0:
            raise TokenLookupsThrottled(source, wait)
        principal, stored = await self._look_up("token", digest, self.source)
        if principal is not None or not stored:  # found, or the store's fault: not the caller's miss
            self.misses.release(key)
        return principal

    async def of_id(self, account_id: str) -> Principal | None:
        if not account_id or self.by_id is None:
            return None
        known = self._cached("id", account_id)
        return known[0] if known is not None else (await self._look_up("id", account_id, self.by_id))[0]

    def _cached(self, kind: str, key: str) -> tuple[Principal | None] | None:
        known = self._known.get((kind, key))
        if known is not None and time.monotonic() - known[1] < self.ttl_s:
            return (known[0],)
        return None

    async def _look_up(self, kind: str, key: str, lookup: Lookup) -> tuple[Principal | None, bool]:
        """(the principal or None, whether the store answered)."""
        try:
            principal = await lookup(key)
        except Exception as exc:  # noqa: BLE001 - the store away: nobody is let in (not cached, tried again)
            log.warning("could not look an account up: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None, False
        if len(self._known) > 10_000:  # wrong tokens are cached too: keep it bounded
            self._known.clear()
        self._known[(kind, key)] = (principal, time.monotonic())
        return principal, True


class LoginThrottle:
    """Failed logins per client address and per account name: past ``max_failures`` in ``window_s`` seconds,
    further tries are refused until the window has passed (guessing a password or token takes that long).

    A try is counted as failed when it is let through (``reserve``), before its check runs, and taken back when
    it succeeds (``release``): tries whose checks are still running count, so no more than ``max_failures`` can
    be in flight or failed at once, however many arrive together."""

    def __init__(self, max_failures: int = 10, window_s: float = 300.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: dict[str, list[float]] = {}

    def wait_s(self, *keys: str) -> float:
        """Seconds until a try for these keys is let through again (0: now)."""
        now = time.monotonic()
        waits = [0.0]
        for key in keys:
            recent = [t for t in self._failures.get(key, []) if now - t < self.window_s]
            if recent:
                self._failures[key] = recent
            else:
                self._failures.pop(key, None)
            if len(recent) >= self.max_failures:
                waits.append(self.window_s - (now - recent[0]))
        return max(waits)

    def reserve(self, *keys: str) -> float:
        """Let a try through and count it as failed now, returning 0; or the seconds to wait (nothing counted)."""
        wait = self.wait_s(*keys)
        if wait > 0:
            return wait
        now = time.monotonic()
        if len(self._failures) > 10_000:
            self._failures.clear()
        for key in keys:
            self._failures.setdefault(key, []).append(now)
        return 0.0

    def release(self, *keys: str) -> None:
        """A try ``reserve`` let through succeeded: it is not a failure."""
        for key in keys:
            tries = self._failures.get(key)
            if tries:
                tries.pop()


def stored_lookup(database: str, pool: QueryPool, readers: ThreadClients, by_id: bool = False) -> Lookup:
    """Look a token's digest (or, ``by_id``, an account's id) up in the store's ``users`` on the API's pool."""

    async def lookup(key: str) -> Principal | None:
        def read() -> Principal | None:
            with readers.client() as client:
                return account_principal(client, database, key) if by_id else principal_of(client, database, key)

        return await pool.run(read)

    return lookup
