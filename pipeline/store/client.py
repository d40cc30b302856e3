"""Connections to ClickHouse through clickhouse-connect, for both kinds of store the URL can name.

``chdb:///abs/path`` opens the embedded ClickHouse engine (chdb) on a data folder; ``http(s)://...``
talks to a ClickHouse server. The rest of the store only sees a clickhouse-connect ``Client``.

chdb allows one data path per process (the engine is a process-wide singleton), so this module
remembers the first chdb path it opened and refuses a different one with a clear error instead of
chdb's own. Clients are cached per (url, database): one engine handle per database is enough, and a
clickhouse-connect client may be used from several threads.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from pipeline.config import get_settings

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StoreError(RuntimeError):
    """A store misconfiguration the operator must fix (not a transient failure)."""


class ChdbPathConflictError(StoreError):
    """A second, different chdb data path was requested in a process that already opened one."""


@dataclass(frozen=True)
class StoreTarget:
    """Where the store lives, parsed from its URL."""

    kind: Literal["chdb", "http"]
    url: str
    chdb_path: str | None = None

    @property
    def display(self) -> str:
        """The URL without its password, for logs and errors."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))


def default_chdb_url(state_dir: Path | None = None) -> str:
    """``chdb://`` URL of the embedded store under the state dir, made absolute."""
    base = state_dir if state_dir is not None else get_settings().state_dir
    return f"chdb://{os.path.realpath(Path(base) / 'clickhouse')}"


def parse_store_url(url: str | None = None, state_dir: Path | None = None) -> StoreTarget:
    """Parse a store URL; empty or None means the configured URL, else chdb under the state dir."""
    raw = (url if url is not None else get_settings().clickhouse_url).strip()
    if not raw:
        raw = default_chdb_url(state_dir)
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme == "chdb":
        return _parse_chdb(raw)
    if scheme in ("http", "https"):
        return StoreTarget(kind="http", url=raw)
    raise StoreError(f"unsupported ClickHouse URL {raw!r}: use chdb:///abs/path or http(s)://host:8123")


def _parse_chdb(raw: str) -> StoreTarget:
    path = raw[len("chdb://") :]
    if not path.startswith("/"):
        raise StoreError(f"chdb URL {raw!r} needs an absolute path: chdb:///abs/path")
    real = os.path.realpath(path)
    return StoreTarget(kind="chdb", url=f"chdb://{real}", chdb_path=real)


def check_identifier(name: str) -> str:
    """A database or table name safe to put in SQL unquoted; anything else is refused."""
    if not IDENTIFIER.match(name):
        raise StoreError(f"invalid ClickHouse identifier {name!r}")
    return name


_lock = threading.Lock()
_chdb_path: str | None = None
_clients: dict[tuple[str, str | None], Client] = {}


def _claim_chdb_path(path: str) -> None:
    global _chdb_path
    if _chdb_path is not None and _chdb_path != path:
        raise ChdbPathConflictError(
            f"this process already uses chdb data path {_chdb_path!r}; chdb allows one path per process, "
            f"so {path!r} cannot be opened (use one CALLQA_CLICKHOUSE_URL per process)"
        )
    _chdb_path = path


def _open(target: StoreTarget) -> Client:
    if target.kind == "chdb":
        assert target.chdb_path is not None
        _claim_chdb_path(target.chdb_path)
        Path(target.chdb_path).mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=target.url)
    settings = get_settings()
    return clickhouse_connect.get_client(
        dsn=target.url,
        connect_timeout=settings.store_connect_timeout_s,
        send_receive_timeout=settings.store_insert_timeout_s,
        query_retries=0,
    )


def _use_database(client: Client, database: str, create: bool) -> None:
    """Point the client at the database, creating it first when asked."""
    if create:
        client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    else:
        exists = client.query(
            "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": database}
        ).result_rows[0][0]
        if not exists:
            raise StoreError(f"database {database!r} does not exist; run the store migrations first")
    client.database = database


def connect(
    url: str | None = None,
    database: str | None = None,
    *,
    create_database: bool = True,
    fresh: bool = False,
) -> Client:
    """A clickhouse-connect client on the store at ``url`` using ``database``.

    ``url`` None means the configured ``clickhouse_url`` (empty: chdb under the state dir);
    ``database`` None means the configured ``clickhouse_database``. ``create_database=False`` suits a
    read-only server account. The client is cached per process; ``fresh=True`` returns a new,
    uncached one (for a caller that closes it). Connection failures raise clickhouse-connect's
    ``OperationalError``; a second chdb path raises ``ChdbPathConflictError``.
    """
    target = parse_store_url(url)
    db = check_identifier(database or get_settings().clickhouse_database)
    key = (target.url, db)
    with _lock:
        if not fresh and key in _clients:
            return _clients[key]
        client = _open(target)
        try:
            _use_database(client, db, create_database)
        except Exception:
            client.close()
            raise
        if not fresh:
            _clients[key] = client
        return client


def close_cached_clients() -> None:
    """Close every cached client (process shutdown); the chdb path claim stays, chdb cannot move."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
