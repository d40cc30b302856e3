"""The store side of logging out: ``revoked_sessions`` holds each logged-out session's nonce until it
would have expired (its TTL then drops it), so every worker on the store refuses it, a restarted one too.

Reads go through the API's pool and read-only clients like any page's; a logout's one-row insert uses a
client of its own on the writer's URL (the read-only account may not insert), opened and closed on the
pool's thread.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.api.pool import QueryPool, ThreadClients
from pipeline.config import Settings
from pipeline.store.client import check_identifier, connect

TABLE = "revoked_sessions"


class StoredRevocations:
    """A ``RevocationSource`` on the store's ``revoked_sessions`` table."""

    def __init__(self, settings: Settings, pool: QueryPool, readers: ThreadClients) -> None:
        self.settings = settings
        self.pool = pool
        self.readers = readers
        self.database = check_identifier(settings.clickhouse_database)

    async def load(self) -> dict[str, int]:
        def read() -> dict[str, int]:
            with self.readers.client() as client:
                rows = client.query(f"SELECT session_id, toUnixTimestamp(max(expires_at)) FROM {self.database}.{TABLE} "
                                    "WHERE expires_at > now() GROUP BY session_id").result_rows
            return {str(nonce): int(expires) for nonce, expires in rows}

        return await self.pool.run(read)

    async def save(self, nonce: str, expires_s: int) -> None:
        def write() -> None:
            client = connect(self.settings.writer_url, self.database, fresh=True)
            try:
                client.insert(TABLE, [[nonce, datetime.fromtimestamp(expires_s, UTC)]],
                              column_names=["session_id", "expires_at"], database=self.database)
            finally:
                client.close()

        await self.pool.run(write)
