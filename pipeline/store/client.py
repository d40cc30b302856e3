"""Connections to ClickHouse through clickhouse-connect, for both kinds of store the URL can name.

``chdb:///abs/path`` opens the embedded ClickHouse engine (chdb) on a data folder; ``http(s)://...``
talks to a ClickHouse server. The rest of the store only sees a clickhouse-connect ``Client``.

chdb allows one data path per process (the engine is a process-wide singleton), so this module
remembers the first chdb path it opened and refuses a different one with a clear error instead of
chdb's own. Clients are cached per (url, database, TLS options): one engine handle per database is
enough for the process's one-at-a-time work (the worker's migrations, a CLI command).

A clickhouse-connect client is not for concurrent queries: over HTTP a second query while one runs
in its session fails ("Attempt to execute concurrent queries within the same session"), and a chdb
client serializes every call on its one handle. Code that queries from several threads at once
takes a client per thread or per request with ``fresh=True`` (and closes it): the sink's insert
thread, the worker API's pool threads (``api/pool.py``, ``ThreadClients``), ``/api/query``.

An https URL is checked against ``clickhouse_ca_cert`` (or the system CAs) unless ``clickhouse_verify``
is off; a server that wants a client certificate gets ``clickhouse_client_cert``/``_key``. A URL's
password never reaches an error message or a log line: errors name the store by ``StoreTarget.display``
and failures while connecting are re-raised with the password scrubbed (``StoreConnectionError``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

from pipeline.config import Settings, get_settings

log = logging.getLogger("callqa.store")

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StoreError(RuntimeError):
    """A store misconfiguration the operator must fix (not a transient failure)."""


class ChdbPathConflictError(StoreError):
    """A second, different chdb data path was requested in a process that already opened one."""


class StoreConnectionError(OperationalError):
    """The store could not be reached or refused the account; the message holds no password."""


class StoreTlsError(StoreConnectionError):
    """The server's TLS certificate was not trusted (or TLS failed); the message says which setting to fix."""


@dataclass(frozen=True)
class StoreTarget:
    """Where the store lives, parsed from its URL."""

    kind: Literal["chdb", "http"]
    url: str = field(repr=False)  # may hold a password: repr() must not print it
    chdb_path: str | None = None

    @property
    def display(self) -> str:
        """The URL without its password, for logs and errors."""
        return redact_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` with this target's password (as written in the URL, and decoded) masked."""
        return _scrub(text, self.url)


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo replaced by ``***`` (any scheme, also malformed ones)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"


def _scrub(text: str, url: str) -> str:
    # The password as written (percent-encoded or not) and decoded: libraries may print either.
    raw = url.partition("://")[2].partition("/")[0].rpartition("@")[0].partition(":")[2]
    for secret in sorted({raw, unquote(raw)}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class TlsOptions:
    """How an https client checks the server and, optionally, proves who it is."""

    ca_cert: str = ""
    verify: bool = True
    client_cert: str = ""
    client_key: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> TlsOptions:
        return cls(settings.clickhouse_ca_cert.strip(), settings.clickhouse_verify,
                   settings.clickhouse_client_cert.strip(), settings.clickhouse_client_key.strip())

    def client_kwargs(self) -> dict[str, Any]:
        """clickhouse-connect's arguments; a configured file that is missing is a clear error."""
        for env, path in (("CLICKHOUSE_CA_CERT", self.ca_cert), ("CLICKHOUSE_CLIENT_CERT", self.client_cert),
                          ("CLICKHOUSE_CLIENT_KEY", self.client_key)):
            if path and not Path(path).is_file():
                raise StoreError(f"CALLQA_{env}: no such file {path!r}")
        if self.client_key and not self.client_cert:
            raise StoreError("CALLQA_CLICKHOUSE_CLIENT_KEY is set without CALLQA_CLICKHOUSE_CLIENT_CERT")
        kwargs: dict[str, Any] = {"verify": self.verify}
        if self.ca_cert:
            kwargs["ca_cert"] = self.ca_cert
        if self.client_cert:
            kwargs["client_cert"] = self.client_cert
        if self.client_key:
            kwargs["client_cert_key"] = self.client_key
        return kwargs


def default_chdb_url(state_dir: Path | None = None) -> str:
    """``chdb://`` URL of the embedded store under the state dir, made absolute."""
    base = state_dir if state_dir is not None else get_settings().state_dir
    return f"chdb://{os.path.realpath(Path(base) / 'clickhouse')}"


def parse_store_url(url: str | None = None, state_dir: Path | None = None) -> StoreTarget:
    """Parse a store URL; empty or None means the configured (writer) URL, else chdb under the state dir."""
    raw = (url if url is not None else get_settings().writer_url or "").strip()
    if not raw:
        raw = default_chdb_url(state_dir)
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme == "chdb":
        return _parse_chdb(raw)
    if scheme in ("http", "https"):
        return StoreTarget(kind="http", url=raw)
    raise StoreError(
        f"unsupported ClickHouse URL {redact_url(raw)!r}: use chdb:///abs/path or http(s)://user:pass@host:8123"
    )


def _parse_chdb(raw: str) -> StoreTarget:
    path = raw[len("chdb://") :]
    if not path.startswith("/"):
        raise StoreError(f"chdb URL {redact_url(raw)!r} needs an absolute path: chdb:///abs/path")
    real = os.path.realpath(path)
    return StoreTarget(kind="chdb", url=f"chdb://{real}", chdb_path=real)


def check_identifier(name: str) -> str:
    """A database or table name safe to put in SQL unquoted; anything else is refused."""
    if not IDENTIFIER.match(name):
        raise StoreError(f"invalid ClickHouse identifier {name!r}")
    return name


_lock = threading.Lock()
_chdb_path: str | None = None
_clients: dict[tuple[str, str | None, TlsOptions], Client] = {}


def _claim_chdb_path(path: str) -> None:
    global _chdb_path
    if _chdb_path is not None and _chdb_path != path:
        raise ChdbPathConflictError(
            f"this process already uses chdb data path {_chdb_path!r}; chdb allows one path per process, "
            f"so {path!r} cannot be opened (use one CALLQA_CLICKHOUSE_URL per process)"
        )
    _chdb_path = path


def _open(target: StoreTarget, tls: TlsOptions) -> Client:
    if target.kind == "chdb":
        assert target.chdb_path is not None
        _claim_chdb_path(target.chdb_path)
        Path(target.chdb_path).mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=target.url)
    settings = get_settings()
    secure = target.url.lower().startswith("https://")
    return clickhouse_connect.get_client(
        dsn=target.url,
        # Explicit: clickhouse-connect takes TLS from the port (443/8443), not from the DSN's scheme, so
        # https://host:9440 would otherwise go out as plain http, password included.
        interface="https" if secure else "http",
        connect_timeout=settings.store_connect_timeout_s,
        send_receive_timeout=settings.store_insert_timeout_s,
        query_retries=0,
        **(tls.client_kwargs() if secure else {}),
    )


_CERT_REASON = re.compile(r"certificate verify failed: ([^(\]'\"]+)")


def _connection_error(exc: Exception, target: StoreTarget) -> Exception:
    """One line naming the store by its display URL, with no password in it (the cause is dropped)."""
    text = target.scrub(str(exc)).strip()
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        found = _CERT_REASON.search(text)
        reason = found.group(1).strip() if found else "certificate verify failed"
        return StoreTlsError(
            f"TLS certificate of ClickHouse at {target.display} is not trusted ({reason}): set "
            "CALLQA_CLICKHOUSE_CA_CERT to the PEM CA that signed it"
        )
    if "SSLError" in text or "SSL:" in text:
        detail = re.search(r"\[SSL[^\]]*\][^)'\"]*", text)
        return StoreTlsError(f"TLS with ClickHouse at {target.display} failed: "
                             f"{detail.group(0).strip() if detail else 'handshake error'}")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return StoreConnectionError(f"cannot use ClickHouse at {target.display}: "
                                f"{' '.join(lines[:2]) if lines else type(exc).__name__}")


def _use_database(client: Client, database: str, create: bool) -> None:
    """Point the client at the database, creating it first when asked."""
    if create:
        client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    else:
        # EXISTS, not system.databases: a read-only account granted only callqa.* may not read system tables.
        exists = client.query(f"EXISTS DATABASE {database}").result_rows[0][0]
        if not exists:
            raise StoreError(f"database {database!r} does not exist; run the store migrations first")
    client.database = database


def connect(
    url: str | None = None,
    database: str | None = None,
    *,
    create_database: bool = True,
    fresh: bool = False,
    tls: TlsOptions | None = None,
) -> Client:
    """A clickhouse-connect client on the store at ``url`` using ``database``.

    ``url`` None means the configured ``clickhouse_url`` (empty: chdb under the state dir);
    ``database`` None means the configured ``clickhouse_database``; ``tls`` None means the configured
    CA, verification and client certificate (used for https only). ``create_database=False`` suits a
    read-only server account. The client is cached per process, for one thread at a time (see the
    module's note); ``fresh=True`` returns a new, uncached one (for a caller that closes it).
    Connection failures raise ``StoreConnectionError`` (an ``OperationalError``; ``StoreTlsError`` for
    certificates), a second chdb path ``ChdbPathConflictError``, a missing CA or client file ``StoreError``.
    """
    target = parse_store_url(url)
    settings = get_settings()
    db = check_identifier(database or settings.clickhouse_database)
    options = tls if tls is not None else TlsOptions.from_settings(settings)
    key = (target.url, db, options)
    with _lock:
        if not fresh and key in _clients:
            return _clients[key]
        client = _open_database(target, options, db, create_database)
        if not fresh:
            _clients[key] = client
        return client


# What chdb says when another process's engine holds the data path (ClickHouse's lock on its folder).
_CHDB_PATH_HELD = "Error initializing EmbeddedServer"


def connect_when_free(url: str | None, database: str, wait_s: float, poll_s: float = 0.05) -> Client:
    """``connect()``, waiting up to ``wait_s`` while another process's embedded engine still holds the chdb
    data path: a static worker hands its instance to its standby once it has closed its store, and a
    handle it left open keeps that engine up until its process ends (within a second). Any other failure,
    and a server URL's, is raised at once."""
    began = time.monotonic()
    said = False
    while True:
        try:
            client = connect(url, database)
        except StoreConnectionError as exc:
            if (parse_store_url(url).kind != "chdb" or _CHDB_PATH_HELD not in str(exc)
                    or time.monotonic() - began > wait_s):
                raise
            if not said:
                log.info("the embedded store is still held by another process (a predecessor closing it): "
                         "waiting up to %.0f s", wait_s)
                said = True
            time.sleep(poll_s)
            continue
        if said:
            log.info("the embedded store was free after %.2f s", time.monotonic() - began)
        return client


def _open_database(target: StoreTarget, tls: TlsOptions, database: str, create: bool) -> Client:
    try:
        client = _open(target, tls)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised without the password
        raise _connection_error(exc, target) from None
    try:
        _use_database(client, database, create)
    except StoreError:
        client.close()
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised without the password
        client.close()
        raise _connection_error(exc, target) from None
    return client


def close_cached_clients() -> None:
    """Close every cached client (process shutdown); the chdb path claim stays, chdb cannot move."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
