"""The calls a principal may see, enforced inside ClickHouse for every query it runs.

A scope is a tenant (and, for an agent, one agent id). It becomes ClickHouse's ``additional_table_filters``
setting on each query: a filter ClickHouse applies to every read of a table, wherever the table appears
(a subquery, a join, a union, a CTE, the right of IN, under a ``_deduped`` view, with or without ``FINAL``,
aliased or not), so no query text can get around it. The SQL API refuses a query's own ``SETTINGS`` clause
and table functions (store/sqlguard.py), so a caller cannot lift it either.

``calls`` is filtered on its own columns; every other table that holds calls' rows on ``call_id IN`` the
calls of the scope; the tables that hold no call (accounts, logged-out sessions, migrations) show nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.store.client import check_identifier
from pipeline.store.erasure import ERASED_TABLES

# Tables with no call in them: a scoped reader sees none of their rows.
NOT_CALLS = ("users", "revoked_sessions", "schema_migrations")


def sql_string(value: str) -> str:
    """``value`` as a ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class AccessScope:
    """The calls of ``tenant`` (of its agent ``agent_id`` only, when given)."""

    tenant: str
    agent_id: str = ""

    def calls_condition(self) -> str:
        condition = f"tenant = {sql_string(self.tenant)}"
        return condition + (f" AND agent_id = {sql_string(self.agent_id)}" if self.agent_id else "")

    def table_filters(self, database: str) -> dict[str, str]:
        db = check_identifier(database)
        of_calls = f"call_id IN (SELECT call_id FROM {db}.calls WHERE {self.calls_condition()})"
        filters = {f"{db}.{t}": of_calls for t in (*ERASED_TABLES, "erasures") if t != "calls"}
        return {f"{db}.calls": self.calls_condition(), **filters, **{f"{db}.{t}": "0" for t in NOT_CALLS}}

    def settings(self, database: str) -> dict[str, Any]:
        """The query settings that hold a query to this scope."""
        pairs = ", ".join(f"{sql_string(t)}: {sql_string(f)}" for t, f in self.table_filters(database).items())
        return {"additional_table_filters": "{" + pairs + "}"}


def scope_settings(scope: AccessScope | None, database: str) -> dict[str, Any]:
    """Settings for a query in ``scope``; none for the unscoped (the operator's local token)."""
    return {} if scope is None else scope.settings(database)


class ScopedClient:
    """A clickhouse-connect client whose every query runs in a scope (the readers of the API take one per
    request): ``query`` and ``command`` add the scope's settings to the caller's."""

    def __init__(self, client: Any, settings: dict[str, Any]) -> None:
        self._client = client
        self._settings = settings

    def query(self, *args: Any, settings: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return self._client.query(*args, settings={**(settings or {}), **self._settings}, **kwargs)

    def command(self, *args: Any, settings: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return self._client.command(*args, settings={**(settings or {}), **self._settings}, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
