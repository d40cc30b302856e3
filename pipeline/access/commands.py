"""`callqa users add|list|remove`, as the operator: through the running worker's API when one holds the embedded
store (``/api/users``), else on the store directly."""

from __future__ import annotations

import urllib.parse
from dataclasses import asdict
from typing import Any

from pipeline.access.users import (
    AccountError,
    add_account,
    hash_password,
    list_accounts,
    remove_account,
    set_password,
)
from pipeline.config import Settings
from pipeline.report import WorkerApiError, running_worker


def _call(worker: Any, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    try:
        return worker.send(method, path, body)
    except WorkerApiError as exc:
        raise AccountError(str(exc)) from None


def _store(settings: Settings) -> Any:
    from pipeline.store.client import connect
    from pipeline.store.migrations import migrate

    client = connect(settings.writer_url, settings.clickhouse_database)  # the process's client: left open
    migrate(client, settings.clickhouse_database)
    return client


def add_user(settings: Settings, name: str, role: str, tenant: str, agent_id: str, password: str = "") -> str:
    """The new account's token (and, with ``password``, its page login)."""
    if password:
        hash_password(password)  # too short: refused before anything is written
    worker = running_worker(settings)
    if worker is not None:
        body = {"name": name, "role": role, "tenant": tenant, "agent_id": agent_id, "password": password}
        return str(_call(worker, "POST", "/api/users", body)["token"])
    client = _store(settings)
    token = add_account(client, settings.clickhouse_database, name, role, tenant, agent_id)
    if password:
        set_password(client, settings.clickhouse_database, name, password)
    return token


def list_users(settings: Settings) -> list[dict[str, Any]]:
    worker = running_worker(settings)
    if worker is not None:
        return list(_call(worker, "GET", "/api/users"))
    return [asdict(a) for a in list_accounts(_store(settings), settings.clickhouse_database)]


def remove_user(settings: Settings, name: str) -> None:
    worker = running_worker(settings)
    if worker is not None:
        _call(worker, "DELETE", f"/api/users/{urllib.parse.quote(name, safe='')}")
        return
    remove_account(_store(settings), settings.clickhouse_database, name)
