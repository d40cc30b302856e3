"""Bearer tokens of accounts (pipeline/access/users.py): a token that is not the operator's is looked up by its
SHA-256 in the store, through the API's pool and read-only clients, and the answer kept ``ttl_s`` seconds, so a
removed account's token stops working on every worker within that time."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from pipeline.access.users import Principal, account_principal, principal_of, token_digest
from pipeline.api.pool import QueryPool, ThreadClients

Lookup = Callable[[str], Awaitable[Principal | None]]
log = logging.getLogger("callqa.worker.api")


class AccountTokens:
    """Account principals by token (the API) and by name (a page session's), cached; without a ``source`` (no
    store attached) no account is known."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self.source: Lookup | None = None  # by the token's SHA-256 (hex)
        self.named: Lookup | None = None  # by the account's name
        self._known: dict[tuple[str, str], tuple[Principal | None, float]] = {}

    async def principal(self, token: str) -> Principal | None:
        if not token.strip():
            return None
        return await self._cached("token", token_digest(token), self.source)

    async def of_name(self, name: str) -> Principal | None:
        return await self._cached("name", name, self.named) if name else None

    async def _cached(self, kind: str, key: str, lookup: Lookup | None) -> Principal | None:
        if lookup is None:
            return None
        now = time.monotonic()
        known = self._known.get((kind, key))
        if known is not None and now - known[1] < self.ttl_s:
            return known[0]
        try:
            principal = await lookup(key)
        except Exception as exc:  # noqa: BLE001 - the store away: nobody is let in (not cached, tried again)
            log.warning("could not look an account up: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None
        if len(self._known) > 10_000:  # wrong tokens are cached too: keep it bounded
            self._known.clear()
        self._known[(kind, key)] = (principal, now)
        return principal


class LoginThrottle:
    """Failed logins per client address and per account name: past ``max_failures`` in ``window_s`` seconds,
    further tries are refused until the window has passed (guessing a password or token takes that long)."""

    def __init__(self, max_failures: int = 10, window_s: float = 300.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: dict[str, list[float]] = {}

    def wait_s(self, *keys: str) -> float:
        """Seconds until a login for these keys is tried again (0: now)."""
        now = time.monotonic()
        waits = [0.0]
        for key in keys:
            recent = [t for t in self._failures.get(key, []) if now - t < self.window_s]
            self._failures[key] = recent
            if len(recent) >= self.max_failures:
                waits.append(self.window_s - (now - recent[0]))
        return max(waits)

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        if len(self._failures) > 10_000:
            self._failures.clear()
        for key in keys:
            self._failures.setdefault(key, []).append(now)


def stored_lookup(database: str, pool: QueryPool, readers: ThreadClients, by_name: bool = False) -> Lookup:
    """Look a token's digest (or, ``by_name``, an account's name) up in the store's ``users`` on the API's pool."""

    async def lookup(key: str) -> Principal | None:
        def read() -> Principal | None:
            with readers.client() as client:
                return account_principal(client, database, key) if by_name else principal_of(client, database, key)

        return await pool.run(read)

    return lookup
