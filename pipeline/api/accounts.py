"""Bearer tokens of accounts (pipeline/access/users.py): a token that is not the operator's is looked up by its
SHA-256 in the store, through the API's pool and read-only clients, and the answer kept ``ttl_s`` seconds, so a
removed account's token stops working on every worker within that time."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable

from pipeline.access.users import Principal, principal_of
from pipeline.api.pool import QueryPool, ThreadClients

Lookup = Callable[[str], Awaitable[Principal | None]]


class AccountTokens:
    """Account principals by token, cached; without a ``source`` (no store attached) no account is known."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self.source: Lookup | None = None
        self._known: dict[str, tuple[Principal | None, float]] = {}

    async def principal(self, token: str) -> Principal | None:
        if self.source is None or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        now = time.monotonic()
        known = self._known.get(digest)
        if known is not None and now - known[1] < self.ttl_s:
            return known[0]
        principal = await self.source(digest)
        if len(self._known) > 10_000:  # wrong tokens are cached too: keep it bounded
            self._known.clear()
        self._known[digest] = (principal, now)
        return principal


def stored_lookup(database: str, pool: QueryPool, readers: ThreadClients) -> Lookup:
    """Look a digest up in the store's ``users`` table on the API's pool."""

    async def lookup(digest: str) -> Principal | None:
        def read() -> Principal | None:
            with readers.client() as client:
                return principal_of(client, database, digest)

        return await pool.run(read)

    return lookup
