"""The walk of a query's syntax tree (``json_serialize_sql``) against the allow-list.

Every object of the tree is looked at: an expression must be of a listed class, a call
must name a listed function for the place it stands in (``sql_allowed``), a query node must
be a SELECT, a FROM item a listed kind of table reference. Anything else is refused, so a
function or a syntax a future DuckDB adds is refused until someone reviews it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .sql_allowed import (
    AGGREGATE_NAME_ARGUMENT,
    AGGREGATES,
    EXPRESSIONS,
    FILE_READERS,
    MODIFIERS,
    REFUSED_VIEWS,
    TABLE_REFS,
    allowed_function,
    allowed_table_function,
)

__all__ = ["check_tree", "function_kind", "looks_like_path", "reads_files"]

QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})


class _Refused(Exception):
    """Inside the check: what is refused and the kind of refusal (``sql_refusals.REASONS``)."""

    def __init__(self, what: str, kind: str) -> None:
        super().__init__(what)
        self.what = what
        self.kind = kind


# -- why a function is refused (the words only: what is admitted is sql_allowed's list) ------
_WHY_BY_NAME: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sequence", ("nextval", "setval", "currval")),
    ("dynamic", ("query", "execute", "serialize", "_to_xml", "sql")),
    (
        "server",
        (
            "checkpoint",
            "logging",
            "duckdb_logs",
            "set_config",
            "setseed",
            "write_log",
            "profiling",
            "pg_",
            "lo_",
            "dblink",
            "sleep",
            "secret",
            "extension",
            "external_resource",
            "grammar",
        ),
    ),
)


def function_kind(name: str, *, allow_files: bool) -> str | None:
    """Why calling function ``name`` is refused (None: it is not).

    Only what ``sql_allowed`` lists passes; the kind only picks the words of the refusal.
    """
    name = name.lower()
    if allowed_function(name) or allowed_table_function(name, allow_files=allow_files):
        return None
    if reads_files(name):
        return "files"
    for kind, parts in _WHY_BY_NAME:
        if any(part in name for part in parts):
            return kind
    return "unlisted"


def reads_files(name: str) -> bool:
    """Is ``name`` one of DuckDB's file readers (``read_csv``, ``parquet_scan``, ``glob``…)?"""
    return (
        name in FILE_READERS
        or name.startswith(("read_", "parquet_", "iceberg_", "delta_", "st_read"))
        or name.endswith("_scan")
    )


def looks_like_path(table: str) -> bool:
    """A table name that DuckDB would read as a file (``FROM 'data.csv'``)."""
    return any(c in table for c in "./\\:") or table.startswith("~")


# -- the walk ---------------------------------------------------------------------------------
def check_tree(
    tree: dict[str, Any], *, allow_files: bool, postgres: bool = False
) -> tuple[frozenset[str], bool]:
    """Refuse what the tree does that is not listed; else (tables named, reads files?).

    ``postgres``: the query runs on PostgreSQL, where ``s.f(x)`` is function ``f`` of
    schema ``s`` (someone's function, whatever its name) and ``x.f()`` is no SQL at all.
    """
    tables: set[str] = set()
    files = False
    for node, in_from in _nodes(tree.get("statements", [])):
        expression_class = node.get("class")
        if isinstance(expression_class, str):
            files = _check_expression(node, expression_class, in_from, allow_files) or files
            if postgres and expression_class in ("FUNCTION", "WINDOW"):
                _check_postgres_call(node)
            continue
        kind = node.get("type")
        if not isinstance(kind, str):
            continue
        _check_shape(node, kind)
        table = node.get("table_name") if kind == "BASE_TABLE" else None
        if not isinstance(table, str):
            continue
        if table.lower() in REFUSED_VIEWS:
            raise _Refused(f"the view {table.lower()}", "server")
        if not looks_like_path(table):
            tables.add(table.lower())
        elif allow_files:
            files = True
        else:
            raise _Refused(f"reading the file {table!r}", "files")
    return frozenset(tables), files


def _nodes(value: Any) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every object of the tree, depth first, and whether it is the call of a FROM item."""
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, in_from = stack.pop()
        if isinstance(item, dict):
            yield item, in_from
            table_function = item.get("type") == "TABLE_FUNCTION" and "class" not in item
            stack.extend((v, table_function and k == "function") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, False) for v in item)


def _check_shape(node: dict[str, Any], kind: str) -> None:
    """A query node must be a SELECT; a FROM item and a modifier must be of a listed kind."""
    if kind.endswith("_NODE") and kind not in QUERY_NODES:
        verb = kind.removesuffix("_NODE").removesuffix("_QUERY").replace("_", " ")
        what = f"{_article(verb)} {verb} inside a query (a data-modifying WITH clause)"
        raise _Refused(what, "write")
    if kind.endswith("_MODIFIER") and kind not in MODIFIERS:
        raise _Refused(f"a query modifier it does not know ({kind})", "unchecked")
    is_table_ref = "alias" in node and "sample" in node
    if is_table_ref and kind not in TABLE_REFS:
        raise _Refused(f"a FROM item it does not know ({kind})", "unchecked")


def _check_expression(node: dict[str, Any], cls: str, in_from: bool, allow_files: bool) -> bool:
    """Refuse an expression that is not listed; True for an allowed file reader."""
    if cls not in EXPRESSIONS:
        raise _Refused(f"an expression it does not know ({cls})", "unchecked")
    if cls not in ("FUNCTION", "WINDOW"):
        return False
    name = node.get("function_name")
    if not isinstance(name, str):
        raise _Refused("a call without a name", "unchecked")
    name = name.lower()  # x.f() may be a method call: f(x); the name is what is checked
    if cls == "WINDOW":
        allowed = allowed_function(name, window=True)
    elif in_from:
        allowed = allowed_table_function(name, allow_files=allow_files)
    else:
        allowed = allowed_function(name)
    if not allowed:
        kind = function_kind(name, allow_files=allow_files) or "unlisted"
        place = " in FROM" if in_from and kind == "unlisted" else ""
        raise _Refused(f"a call to {name}(){place}", kind)
    if name in AGGREGATE_NAME_ARGUMENT:
        _check_aggregate_name(node, name, AGGREGATE_NAME_ARGUMENT[name])
    return in_from and name in FILE_READERS


# The schemas a call may name on PostgreSQL: the built-in functions' (or none at all).
POSTGRES_SCHEMAS = frozenset({"", "pg_catalog"})
_UNKNOWN = 2**64 - 1  # DuckDB's query_location of a node that has none


def _check_postgres_call(node: dict[str, Any]) -> None:
    """On PostgreSQL: no function of another schema, no DuckDB method call ``x.f()``."""
    name = str(node.get("function_name", "")).lower()
    schema = str(node.get("schema") or "").lower()
    catalog = str(node.get("catalog") or "").lower()
    if catalog or schema not in POSTGRES_SCHEMAS:
        qualified = ".".join(p for p in (catalog, schema, name) if p)
        raise _Refused(
            f"a call to {qualified}() (on PostgreSQL, only pg_catalog's functions, "
            "or calls without a schema)",
            "unlisted",
        )
    where = node.get("query_location")
    arguments = node.get("arguments", node.get("children", []))
    if node.get("is_operator"):  # x LIKE y, x ->> 'k', a + b: infix, not a method call
        return
    if isinstance(where, int) and where != _UNKNOWN and arguments:
        first = _first_location(arguments[0])
        if first is not None and first < where:
            raise _Refused(
                f"the method call x.{name}() (DuckDB syntax; PostgreSQL needs {name}(x))",
                "unchecked",
            )


def _first_location(value: Any) -> int | None:
    """The smallest known query_location in a subtree (where its text starts)."""
    found = [
        node["query_location"]
        for node, _ in _nodes(value)
        if isinstance(node.get("query_location"), int) and node["query_location"] != _UNKNOWN
    ]
    return min(found) if found else None


def _check_aggregate_name(node: dict[str, Any], name: str, index: int) -> None:
    """``list_aggregate(l, 'sum')``: the aggregate is named by a constant, listed name."""
    arguments = node.get("arguments", node.get("children", []))
    argument = arguments[index] if len(arguments) > index else None
    if isinstance(argument, dict) and "expression" in argument:
        argument = argument["expression"]
    literal = argument.get("literal", {}) if isinstance(argument, dict) else {}
    named = literal.get("text") if literal.get("kind") == "STRING" else None
    if not isinstance(named, str) or named.lower() not in AGGREGATES:
        what = f"{name}() of an aggregate that is not a listed name written as a constant"
        raise _Refused(what, "unlisted")


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"
