"""The query API's statement check: ClickHouse parses the analyst's SQL, this module walks the tree.

The text is parsed by the store's own ClickHouse with ``parseQueryToJSON`` (the text is bound as a
query parameter, never spliced into SQL, so no quoting trick reaches the parser as SQL), and the JSON
syntax tree is checked here against an allow-list:

- exactly one SELECT (UNION / INTERSECT / EXCEPT of SELECTs included): every other statement,
  ``INTO OUTFILE``, ``FORMAT`` and any ``SETTINGS`` clause (the API sets the limits, callers cannot
  loosen them) are refused;
- a FROM item is a table identifier or a subquery, never a table function (``file``, ``url``, ``s3``,
  ``remote``, ``numbers``, ``input``... none is on the allow-list), and every table read (FROM, JOIN,
  ``x IN table``) is one of the project's tables or views in the callqa database, or a CTE in scope;
  no table names from query parameters;
- scalar functions that read outside those tables (``file``, dictionaries, Join tables, server
  settings, sleeping) are refused by name.

What then runs is ClickHouse's formatting of the very tree that was checked (``formatQueryFromJSON``),
so comments, trailing text or a second statement cannot ride along, and the text's query parameters
are bound by the server only (never formatted into the SQL by the client library).
The ClickHouse that parses must have ``parseQueryToJSON`` (ClickHouse 26.x; chdb 4.4 has it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from pipeline.store.client import IDENTIFIER, StoreError
from pipeline.store.migrations import TABLE_KEYS

ALLOWED_TABLES = frozenset(TABLE_KEYS) | frozenset(f"{table}_deduped" for table in TABLE_KEYS)
MAX_SQL_CHARS = 100_000
# x IN name reads the table ``name``: these functions take a table as their right argument.
IN_FUNCTIONS = frozenset({"in", "notIn", "globalIn", "globalNotIn", "nullIn", "notNullIn", "globalNullIn",
                          "globalNotNullIn"})
# Scalar functions that reach outside the project's tables, by lower-case prefix: files (file,
# filesystem*), dictionaries (dict*), Join-engine tables (joinGet*), other databases' metadata
# (hasColumnInTable), server and session settings and macros (getSetting*, getServer*, getMergeTree*,
# getMacro, getClient*), external models (catboost*, modelEvaluate), introspection (address*,
# demangle), Keeper writes (generateSerialID), sleeping (sleep*), and ClickHouse's internal "__" ones.
DENIED_FUNCTION_PREFIXES = ("file", "dict", "joinget", "hascolumnintable", "getsetting", "getserver",
                            "getmergetree", "getmacro", "getclient", "catboost", "modelevaluate", "address",
                            "demangle", "generateserialid", "sleep", "__")
# Node types named *Query that a SELECT is made of; any other one nested in it is another statement.
SELECT_NODES = frozenset({"SelectWithUnionQuery", "SelectQuery", "SelectIntersectExceptQuery", "TablesInSelectQuery"})


class ReadonlyQueryError(ValueError):
    """The SQL cannot be run by the query API (bad SQL, or a failure the caller caused)."""

    status = 400


class QueryNotAllowedError(ReadonlyQueryError):
    """The SQL asks for something the query API refuses (another statement, table, function...)."""

    status = 403


@dataclass(frozen=True)
class CheckedQuery:
    """A statement that passed the check: ``sql`` is what runs, ``parameters`` what it binds."""

    sql: str
    tables: frozenset[str]
    parameters: frozenset[str]

    def bind(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """``params`` if each is one of the statement's ``{name:Type}`` parameters, else a clear error."""
        if not params:
            return None
        for name in params:
            if not IDENTIFIER.match(name):
                raise ReadonlyQueryError(f"query parameter name {name!r} is not an identifier")
            if name not in self.parameters:
                raise ReadonlyQueryError(f"query parameter {name!r} is not used by the query "
                                         f"(write it as {{{name}:Type}} in the SQL)")
        return params


def check_select(client: Client, sql: str, database: str) -> CheckedQuery:
    """Parse ``sql`` with ClickHouse and check it; raises ``ReadonlyQueryError`` naming what was refused."""
    if not sql.strip():
        raise ReadonlyQueryError("empty query")
    if len(sql) > MAX_SQL_CHARS:
        raise ReadonlyQueryError(f"query is {len(sql)} characters long; the API takes at most {MAX_SQL_CHARS}")
    tree_json = _clickhouse_call(client, "SELECT parseQueryToJSON({q:String})", {"q": sql})
    try:
        tree = json.loads(tree_json)
    except RecursionError:
        raise ReadonlyQueryError("query is nested too deeply") from None
    walk = _TreeCheck(database)
    walk.run(tree)
    canonical = _clickhouse_call(client, "SELECT formatQueryFromJSON({ast:String})", {"ast": tree_json})
    return CheckedQuery(canonical, frozenset(walk.tables), frozenset(walk.parameters))


def _clickhouse_call(client: Client, sql: str, params: dict[str, str]) -> str:
    # No settings: parsing and formatting execute nothing, and a read-only account may not change any.
    try:
        return str(client.query(sql, parameters=params).result_rows[0][0])
    except DatabaseError as exc:
        raise parse_error(exc) from None


def parse_error(exc: Exception) -> Exception:
    """ClickHouse's refusal to parse, as the query API's error."""
    code, message = clickhouse_error(exc)
    if code == 46 and ("parseQueryToJSON" in message or "formatQueryFromJSON" in message):
        return StoreError("this ClickHouse cannot check queries for the API: parseQueryToJSON needs "
                          "ClickHouse 26.x (the embedded chdb 4.4 has it)")
    if "Multi-statements are not allowed" in message:
        return QueryNotAllowedError("only one statement is allowed (found another after ';')")
    if message.startswith("Empty query"):
        return ReadonlyQueryError("empty query")
    unsupported = re.search(r"AST node of type '([A-Za-z]+)", message)
    if unsupported and unsupported.group(1).endswith("Query"):
        return QueryNotAllowedError(f"{_words(unsupported.group(1))} is not allowed: only one SELECT statement")
    if message.startswith("INSERT with inline data"):
        return QueryNotAllowedError("INSERT is not allowed: only one SELECT statement")
    if code == 62:
        return ReadonlyQueryError(f"SQL syntax error: {message}")
    return ReadonlyQueryError(f"the query API cannot check this query: {message}")


def clickhouse_error(exc: Exception) -> tuple[int | None, str]:
    """(error code, first line of ClickHouse's message) without the echoed query and version."""
    text = str(exc)
    found = re.search(r"Code: (\d+)", text)
    start = text.find("DB::Exception: ")
    if start >= 0:
        text = text[start + len("DB::Exception: "):]
    lines = re.split(r":? In scope ", text, maxsplit=1)[0].strip().splitlines()
    first = re.sub(r"\s*\([A-Z_]+\)\s*(\(version [^)]*\))?\.?\s*$", "", lines[0]) if lines else ""
    return (int(found.group(1)) if found else None), first.strip() or type(exc).__name__


def _words(ast_type: str) -> str:
    """'KillQueryQuery' -> 'KILL QUERY', 'ShowTablesQuery' -> 'SHOW TABLES'."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", ast_type.removesuffix("Query")).upper()


def statement_kind(node: dict[str, Any]) -> str:
    """The statement keyword(s) of a parsed top-level node, for the refusal message."""
    kind = str(node.get("type", "unknown"))
    if kind == "DropQuery":
        return str(node.get("kind", "drop")).upper()  # DROP, TRUNCATE or DETACH
    if kind == "CreateQuery":
        return "ATTACH" if node.get("attach") else "CREATE"
    if kind == "BackupQuery":
        return str(node.get("kind", "backup")).upper()
    if kind == "RenameQuery" and node.get("exchange"):
        return "EXCHANGE"
    return _words(kind)


class _TreeCheck:
    """Walks a parseQueryToJSON tree (iteratively: a deep tree must not exhaust Python's stack)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.tables: set[str] = set()
        self.parameters: set[str] = set()
        # By id() of a node in the tree (alive for the whole walk): the scope a SELECT's CTE bodies
        # start from (a UNION's other SELECTs do not see the first one's CTEs inside CTE bodies), and
        # the scope of each WithElement's body (the names defined before it, never its own or later).
        self._with_base: dict[int, frozenset[str]] = {}
        self._element_scope: dict[int, frozenset[str]] = {}

    def run(self, root: Any) -> None:
        if not isinstance(root, dict) or root.get("type") != "SelectWithUnionQuery":
            kind = statement_kind(root) if isinstance(root, dict) else "this statement"
            raise QueryNotAllowedError(f"{kind} is not allowed: only one SELECT statement")
        stack: list[tuple[Any, frozenset[str]]] = [(root, frozenset())]
        while stack:
            node, scope = stack.pop()
            if isinstance(node, list):
                stack.extend((item, scope) for item in node)
            elif isinstance(node, dict):
                inner = self._visit(node, scope)
                stack.extend((child, inner) for child in node.values() if isinstance(child, dict | list))

    def _visit(self, node: dict[str, Any], scope: frozenset[str]) -> frozenset[str]:
        """Check one node; returns the CTE names visible to its children."""
        kind = node.get("type")
        if kind == "SelectWithUnionQuery":
            _refuse_output_clauses(node)
            selects = node.get("list_of_selects", {}).get("children", [])
            self._pass_with_base(node, selects, scope)
            # enable_global_with_statement: the first SELECT's WITH is visible in the others too
            # (outside their CTE bodies, which start from the scope around the UNION).
            return (scope | _cte_names(selects[0])) if selects else scope
        if kind == "SelectIntersectExceptQuery":
            self._pass_with_base(node, node.get("children", []), scope)
            return scope
        if kind == "SelectQuery":
            if "settings" in node:
                raise _settings_refused()
            # A CTE's body sees the names defined before it only: its own name or a later one
            # would be read as a table of that name (even WITH RECURSIVE, when the body is no UNION).
            visible = self._with_base.get(id(node), scope)
            for item in _with_elements(node):
                self._element_scope[id(item)] = visible
                visible = visible | {str(item["name"])}
            return scope | _cte_names(node)
        if kind == "WithElement":
            return self._element_scope.get(id(node), frozenset())
        if kind == "SetQuery":
            raise _settings_refused()
        if kind == "TableExpression" and "table_function" in node:
            name = node["table_function"].get("name", "?")
            raise QueryNotAllowedError(f"table function {name}() is not allowed: read the callqa tables by name")
        if kind == "TableIdentifier":
            self._check_table(node, scope)
        elif kind == "Function":
            self._check_function(node, scope)
        elif kind == "QueryParameter":
            self.parameters.add(str(node.get("name", "")))
        elif isinstance(kind, str) and kind.endswith("Query") and kind not in SELECT_NODES:
            raise QueryNotAllowedError(f"{statement_kind(node)} is not allowed inside a SELECT")
        return scope

    def _pass_with_base(self, node: dict[str, Any], selects: Any, scope: frozenset[str]) -> None:
        base = self._with_base.get(id(node), scope)
        for select in selects if isinstance(selects, list) else []:
            if isinstance(select, dict):
                self._with_base[id(select)] = base

    def _check_function(self, node: dict[str, Any], scope: frozenset[str]) -> None:
        name = str(node.get("name", ""))
        if name.lower().startswith(DENIED_FUNCTION_PREFIXES):
            raise QueryNotAllowedError(f"function {name}() is not allowed in the query API")
        if name in IN_FUNCTIONS:
            args = node.get("arguments", {}).get("children", [])
            if len(args) == 2 and isinstance(args[1], dict) and args[1].get("type") == "Identifier":
                self._check_table(args[1], scope)

    def _check_table(self, node: dict[str, Any], scope: frozenset[str]) -> None:
        if node.get("children"):  # FROM {t:Identifier}: the name would only be known at run time
            raise QueryNotAllowedError("table names from query parameters are not allowed")
        parts = [str(p) for p in node.get("name_parts") or [node.get("name", "")]]
        if len(parts) == 1 and parts[0] in scope:
            return
        if len(parts) > 2:
            raise QueryNotAllowedError(f"table {'.'.join(parts)} is not allowed")
        database, table = (self.database, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        if database != self.database:
            raise QueryNotAllowedError(f"database {database} is not allowed: only {self.database}")
        if table not in ALLOWED_TABLES:
            raise QueryNotAllowedError(f"table {table} is not allowed: only {', '.join(sorted(ALLOWED_TABLES))}")
        self.tables.add(table)


def _refuse_output_clauses(node: dict[str, Any]) -> None:
    if "out_file" in node or node.get("is_into_outfile_with_stdout"):
        raise QueryNotAllowedError("INTO OUTFILE is not allowed")
    if "format_ast" in node:
        raise QueryNotAllowedError("FORMAT is not allowed: the API answers JSON")
    if "settings_ast" in node:
        raise _settings_refused()


def _settings_refused() -> QueryNotAllowedError:
    return QueryNotAllowedError("SETTINGS is not allowed: the API's limits cannot be changed by a query")


def _with_elements(select: Any) -> list[dict[str, Any]]:
    """A SELECT's ``WITH name AS (SELECT ...)`` items, in order."""
    if not isinstance(select, dict) or select.get("type") != "SelectQuery":
        return []
    items = select.get("with", {}).get("children", [])
    return [i for i in items if isinstance(i, dict) and i.get("type") == "WithElement"]


def _cte_names(select: Any) -> frozenset[str]:
    """Names a SELECT's WITH clause gives to subqueries (``WITH name AS (SELECT ...)``)."""
    return frozenset(str(i["name"]) for i in _with_elements(select))
