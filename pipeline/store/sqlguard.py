"""The query API's statement check: ClickHouse parses the analyst's SQL, this module walks the tree.

The text is parsed by the store's own ClickHouse with ``parseQueryToJSON`` (the text is bound as a
query parameter, never spliced into SQL, so no quoting trick reaches the parser as SQL), and the JSON
syntax tree is checked here against an allow-list:

- exactly one SELECT (UNION / INTERSECT / EXCEPT of SELECTs included): every other statement,
  ``INTO OUTFILE``, ``FORMAT`` and any ``SETTINGS`` clause (the API sets the limits, callers cannot
  loosen them) are refused;
- a FROM item is a table identifier or a subquery, never a table function (``file``, ``url``, ``s3``,
  ``remote``, ``numbers``, ``input``... none is on the allow-list), and every table read (FROM, JOIN,
  ``x IN table``, ``x IN table_function(...)``) is one of the project's tables or views in the callqa
  database, or a CTE in scope; no table names from query parameters. A CTE body and a scalar
  ``WITH (SELECT ...) AS x`` see the CTE names defined before them only;
- every function called (``APPLY(f)`` included) is on the allow-list of ``sqlguard_functions``: functions
  on values only, nothing that reads outside those tables, tells about the server or session
  (``hostName``, ``version``, ``currentUser``, ``uptime``...), sleeps or draws random data;
- a function that builds a value of a size it is given (``repeat``, ``range``, ``space``, pads,
  ``arrayWithConstant``, ``topK(N)``...) gets that size as a number written in the query, at most
  ``SIZE_CAP`` (1,000,000): ``randomString(1e9)``-style values are not built in the store's (for chdb, the
  worker's) memory. Compositions of capped values are stopped by the ``max_memory_usage`` sent with the
  query (``queries.QueryLimits``).

What then runs is ClickHouse's formatting of the very tree that was checked (``formatQueryFromJSON``),
so comments, trailing text or a second statement cannot ride along, and the text's query parameters
are bound by the server only (never formatted into the SQL by the client library).
The ClickHouse that parses must have ``parseQueryToJSON`` (ClickHouse 26.x; chdb 4.4 has it).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from pipeline.store.client import IDENTIFIER, StoreError
from pipeline.store.migrations import MORE_TABLES, TABLE_KEYS
from pipeline.store.sqlguard_functions import (
    ALSO_TABLE_FUNCTIONS,
    RANGE,
    SIZE_ARGUMENTS,
    SIZE_CAP,
    SIZE_PARAMETERS,
    aggregate_base,
    is_allowed,
)

ALLOWED_TABLES = frozenset(TABLE_KEYS) | frozenset(f"{table}_deduped" for table in TABLE_KEYS) | frozenset(MORE_TABLES)
MAX_SQL_CHARS = 100_000
# x IN name reads the table ``name`` (and, on some ClickHouse versions, x IN f(...) the table function f):
# these functions take a table as their right argument. Lower case, as names are compared.
IN_FUNCTIONS = frozenset({"in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
                          "globalnotnullin"})
NUMBER_LITERALS = frozenset({"UInt64", "Int64", "Float64", "UInt128", "Int128", "UInt256", "Int256"})
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
        # the scope of each item of a WITH clause, a CTE body or a scalar ``(SELECT ...) AS x`` (the
        # names defined before it, never its own or a later one), which replaces the one around it.
        self._with_base: dict[int, frozenset[str]] = {}
        self._fixed_scope: dict[int, frozenset[str]] = {}

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
                scope = self._fixed_scope.get(id(node), scope)
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
            # A CTE's body, and a scalar subquery of the WITH clause, see the names defined before
            # them only: their own name or a later one may be read as a table of that name (always
            # a CTE's own name; even WITH RECURSIVE, when the body is no UNION).
            visible = self._with_base.get(id(node), scope)
            for item in _with_items(node):
                self._fixed_scope[id(item)] = visible
                if item.get("type") == "WithElement":
                    visible = visible | {str(item["name"])}
            return scope | _cte_names(node)
        if kind == "WithElement" and id(node) not in self._fixed_scope:
            return frozenset()  # not where a WITH clause puts it: it sees no CTE
        if kind == "SetQuery":
            raise _settings_refused()
        if kind == "TableExpression" and "table_function" in node:
            name = node["table_function"].get("name", "?")
            raise QueryNotAllowedError(f"table function {name}() is not allowed: read the callqa tables by name")
        if kind == "TableIdentifier":
            self._check_table(node, scope)
        elif kind == "Function":
            self._check_function(node, scope)
        elif kind == "ColumnsApplyTransformer" and "func_name" in node:  # SELECT * APPLY(f): f(column)
            _check_call(str(node["func_name"]), None, _children(node.get("parameters")), " in APPLY")
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
        args = _children(node.get("arguments"))
        if name.lower() in IN_FUNCTIONS and len(args) == 2:
            self._check_in_right(args[1], scope)
        _check_call(name, args, _children(node.get("parameters")), "")

    def _check_in_right(self, right: Any, scope: frozenset[str]) -> None:
        """The right side of IN is read like a FROM item when it names a table or a table function."""
        if not isinstance(right, dict):
            return
        if right.get("type") == "Identifier":
            self._check_table(right, scope)
        elif right.get("type") == "Function":
            name = str(right.get("name", ""))
            if not is_allowed(name) or name.lower() in ALSO_TABLE_FUNCTIONS:
                raise QueryNotAllowedError(f"table function {name}() is not allowed on the right of IN: "
                                           "read the callqa tables by name")

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


def _children(node: Any) -> list[Any]:
    """The items of an ExpressionList node (a function's arguments or parameters); [] for none."""
    children = node.get("children", []) if isinstance(node, dict) else []
    return children if isinstance(children, list) else []


def _with_items(select: Any) -> list[dict[str, Any]]:
    """A SELECT's WITH items, in order: ``name AS (SELECT ...)`` and ``expression AS name`` alike."""
    if not isinstance(select, dict) or select.get("type") != "SelectQuery":
        return []
    return [i for i in _children(select.get("with")) if isinstance(i, dict)]


def _with_elements(select: Any) -> list[dict[str, Any]]:
    """A SELECT's ``WITH name AS (SELECT ...)`` items, in order."""
    return [i for i in _with_items(select) if i.get("type") == "WithElement"]


def _check_call(name: str, args: list[Any] | None, params: list[Any], where: str) -> None:
    """Refuse a function off the allow-list, or one asked to build a value above ``SIZE_CAP``.

    ``args`` None: the arguments are not in the query (``APPLY(f)`` calls f on each column)."""
    if not is_allowed(name):
        raise QueryNotAllowedError(f"function {name}(){where} is not allowed in the query API")
    key = name.lower()
    if key == RANGE:
        _check_range(name, args, where)
    for index in SIZE_ARGUMENTS.get(key, ()):
        _check_size(name, "argument", index, args, where)
    if params and aggregate_base(name) in SIZE_PARAMETERS:
        _check_size(name, "parameter", 0, params, where)


def _check_size(name: str, what: str, index: int, items: list[Any] | None, where: str) -> None:
    if items is not None and index >= len(items):
        return  # an optional size left out: the function's own default
    value = _number(items[index]) if items is not None else None
    if value is None:
        raise QueryNotAllowedError(f"{name}(){where}: {what} {index + 1} must be a number written in the query, "
                                   f"at most {SIZE_CAP:,} (the size of the value it builds)")
    if abs(value) > SIZE_CAP:
        raise QueryNotAllowedError(f"{name}(){where}: {what} {index + 1} is {_shown(value)}; the query API "
                                   f"allows at most {SIZE_CAP:,}")


def _check_range(name: str, args: list[Any] | None, where: str) -> None:
    values = [_number(a) for a in args] if args is not None else [None]
    if not values or any(v is None for v in values):
        raise QueryNotAllowedError(f"{name}(){where}: its arguments must be numbers written in the query "
                                   f"(at most {SIZE_CAP:,} elements)")
    numbers = [float(v) for v in values if v is not None]
    start, end, step = (0.0, numbers[0], 1.0) if len(numbers) == 1 else (numbers + [1.0])[:3]
    count = abs((end - start) / step) if step else 0.0
    if count > SIZE_CAP:
        raise QueryNotAllowedError(f"{name}(){where} would build {_shown(math.ceil(count))} elements; the query "
                                   f"API allows at most {SIZE_CAP:,}")


def _number(node: Any) -> int | float | None:
    """The finite number a Literal node holds, else None (an expression, a parameter, a string...)."""
    if not isinstance(node, dict) or node.get("type") != "Literal":
        return None
    literal = node.get("value")
    if not isinstance(literal, dict) or literal.get("field_type") not in NUMBER_LITERALS:
        return None
    value = literal.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _shown(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _cte_names(select: Any) -> frozenset[str]:
    """Names a SELECT's WITH clause gives to subqueries (``WITH name AS (SELECT ...)``)."""
    return frozenset(str(i["name"]) for i in _with_elements(select))
