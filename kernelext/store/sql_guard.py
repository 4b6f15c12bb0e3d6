"""The gate of the read-only SQL surface (``kx.sql``, ``%%ledger``, ``kernelext sql``).

A query nobody reviewed (one an agent wrote, say) is checked with DuckDB's own parser,
never with patterns: exactly one statement; a query (``SELECT``, ``FROM``, ``WITH``,
``VALUES``, ``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, ``PIVOT … IN``), or ``EXPLAIN
[ANALYZE]`` of one; no query node that is not a SELECT anywhere in its syntax tree
(``WITH x AS (DELETE … RETURNING *) SELECT …`` is a SELECT to the statement type);
no call to a function that advances a sequence, runs SQL text, reads files (unless
allowed) or acts on the server. The tree comes from ``json_serialize_sql`` on a private
in-memory DuckDB connection, so quoting and comments (``"nextval"(…)``, ``nextval/**/(…)``)
change nothing.

This check is the first line only. The backends run what passes where it cannot change
anything even if the check were wrong (see ``read_arrow`` of each backend), and turn what
their database refuses at run time into the same message (:func:`runtime_refusal`).

Every refusal is a :class:`~kernelext.errors.ReadOnlyError` with one message shape:
what was refused, why, and what to do instead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from ..errors import ReadOnlyError

__all__ = [
    "Checked",
    "Params",
    "check_query",
    "normalize_params",
    "refusal",
    "runtime_refusal",
]

Params = Sequence[Any] | Mapping[str, Any] | None

SURFACE = "the ledger's SQL surface (kx.sql, %%ledger, kernelext sql)"
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
_T = duckdb.StatementType

# -- why, and what to do instead (one entry per kind of refusal) ---------------------------
_API = (
    "Change runs through the kernelext API instead: kx.resume, kx.reconcile, kx.restart, "
    "kx.stop (on the command line: kernelext stop, kernelext reconcile)."
)
REASONS: dict[str, tuple[str, str]] = {
    "write": ("runs queries only", _API),
    "settings": (
        "cannot change settings",
        "Read them instead: SELECT * FROM duckdb_settings() (PostgreSQL: pg_settings); "
        "PRAGMAs that read work as table functions, e.g. SELECT * FROM pragma_table_info('runs').",
    ),
    "sequence": (
        "cannot advance a sequence (no rollback undoes that)",
        "Read sequences with SELECT * FROM duckdb_sequences(). " + _API,
    ),
    "files": (
        "reads no file outside the store unless you allow it",
        "Allow it explicitly: kx.sql(..., allow_files=True), "
        "%config Kernelext.allow_files = True before %%ledger, or kernelext sql --allow-files.",
    ),
    "files_server": (
        "reads no files on a PostgreSQL store (the query runs on the server)",
        "Read the file in Python (pandas or duckdb) and join it with kx.sql(...)'s result.",
    ),
    "file_write": (
        "copies nothing to or from files",
        "Save a result from Python instead, e.g. kx.sql(query).to_csv('out.csv'); to read "
        "a file in a query, pass allow_files=True.",
    ),
    "database": (
        "opens no other database and loads no extension",
        "Open other data with duckdb in Python, or read files with allow_files=True.",
    ),
    "dynamic": (
        "runs no SQL text that it cannot check first",
        "Write that query itself instead of passing it as a string.",
    ),
    "server": (
        "changes nothing on the server, in the session or in the store file",
        "Checkpoints, locks and server settings are kernelext's job (or the database "
        "administrator's); to change runs use kx.resume, kx.reconcile, kx.restart, kx.stop.",
    ),
    "call": (
        "runs queries only",
        "Call a table function in a query instead, e.g. SELECT * FROM pragma_version().",
    ),
    "multiple": ("runs exactly one statement", "Run them one at a time."),
    "empty": ("needs one query", "For example: SELECT status, count(*) FROM runs GROUP BY ALL."),
    "unchecked": (
        "checks every query with DuckDB's SQL parser before running it, and this one "
        "cannot be checked",
        "Write it in common SQL (for instance without FOR UPDATE, or PIVOT with an "
        "explicit IN list).",
    ),
}


def refusal(what: str, kind: str) -> ReadOnlyError:
    """The one refusal message: what was refused, why, and what to do instead."""
    why, instead = REASONS[kind]
    return ReadOnlyError(f"Refused {what}: {SURFACE} is read-only and {why}. {instead}")


class _Refused(Exception):
    """Inside the check: what is refused and the kind of refusal (see ``REASONS``)."""

    def __init__(self, what: str, kind: str) -> None:
        super().__init__(what)
        self.what = what
        self.kind = kind


# -- functions, by what they would do ------------------------------------------------------
SEQUENCE_FUNCTIONS = frozenset({"nextval", "setval"})
DYNAMIC_FUNCTIONS = frozenset(
    {"query", "query_table", "cursor_to_xml", "cursor_to_xmlschema", "database_to_xml"}
)
FILE_FUNCTIONS = frozenset(
    {"glob", "sniff_csv", "st_read", "st_read_meta", "st_readosm", "iceberg_metadata"}
)
SERVER_FUNCTIONS = frozenset(
    {
        "checkpoint",
        "force_checkpoint",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "set_config",
        "pg_read_file",
        "pg_read_binary_file",
        "pg_stat_file",
        "pg_terminate_backend",
        "pg_cancel_backend",
        "pg_reload_conf",
        "pg_switch_wal",
        "pg_create_restore_point",
        "pg_promote",
        "pg_logical_emit_message",
        "pg_notify",
        "pg_import_system_collations",
    }
)
SERVER_PREFIXES: tuple[str, ...] = (
    "pg_advisory",
    "pg_try_advisory",
    "pg_ls_",
    "pg_stat_reset",
    "lo_",
    "dblink",
    "pg_rotate_logfile",
    "pg_replication_",
    "pg_create_",
    "pg_drop_",
    "pg_wal_",
)


def function_kind(name: str, *, allow_files: bool) -> str | None:
    """What calling function ``name`` would do that the surface refuses (None: fine)."""
    name = name.lower()
    if name in SEQUENCE_FUNCTIONS:
        return "sequence"
    if name in DYNAMIC_FUNCTIONS or name.endswith("_to_xml") or "_to_xml_" in name:
        return "dynamic"
    if name in SERVER_FUNCTIONS or name.startswith(SERVER_PREFIXES):
        return "server"
    if not allow_files and reads_files(name):
        return "files"
    return None


def reads_files(name: str) -> bool:
    """Is ``name`` one of DuckDB's file readers (``read_csv``, ``parquet_scan``, ``glob``…)?"""
    return (
        name in FILE_FUNCTIONS
        or name.startswith(("read_", "parquet_", "iceberg_", "delta_"))
        or name.endswith("_scan")
    )


def looks_like_path(table: str) -> bool:
    """A table name that DuckDB would read as a file (``FROM 'data.csv'``)."""
    return any(c in table for c in "./\\:") or table.startswith("~")


# -- the check -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checked:
    """A query that passed: what it reads, for the backend that runs it."""

    sql: str
    tables: frozenset[str]  # base tables it names (lower case), CTE names included
    reads_files: bool  # it names a file reader or a path


class _Parser:
    """A private in-memory DuckDB connection that only parses (one thread at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            con = duckdb.connect(":memory:")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            self._con = con
        return self._con

    def statements(self, sql: str) -> list[tuple[Any, str]]:
        """(statement type, text) of each statement; the type is None when the Python API
        has no name for it (``UPDATE EXTENSIONS``)."""
        with self._lock:
            found = self._connection().extract_statements(sql)
        return [(_statement_type(s), str(s.query)) for s in found]

    def tree(self, sql: str) -> dict[str, Any]:
        with self._lock:
            row = self._connection().execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
        parsed: dict[str, Any] = json.loads(row[0]) if row else {"error": True}
        return parsed


_PARSER = _Parser()


def check_query(sql: str, *, allow_files: bool = False, strict_parse: bool = False) -> Checked:
    """Check ``sql`` for the read-only surface; raise the refusal, else say what it reads.

    A query DuckDB's parser cannot read raises its ``ParserException`` (running it would
    fail the same way), unless ``strict_parse`` (another database runs it): then it is
    refused, because it cannot be checked.
    """
    try:
        return _check_text(sql, allow_files=allow_files, strict_parse=strict_parse)
    except _Refused as refused:
        raise refusal(refused.what, refused.kind) from None


def _check_text(sql: str, *, allow_files: bool, strict_parse: bool) -> Checked:
    try:
        statements = _PARSER.statements(sql)
    except duckdb.ParserException as exc:
        if strict_parse:
            what = f"a statement that does not parse ({_first_line(exc)})"
            raise _Refused(what, "unchecked") from None
        raise
    if not statements:
        raise _Refused("an empty query", "empty")
    if len(statements) > 1:
        kinds = ", ".join(_keyword(text) for _, text in statements)
        raise _Refused(f"{len(statements)} statements ({kinds})", "multiple")
    statement_type, text = statements[0]
    if statement_type == _T.SELECT:
        return _check_select(sql, allow_files=allow_files)
    if statement_type != _T.EXPLAIN:
        keyword = _keyword(text)
        kind = _statement_kind(statement_type, keyword)
        raise _Refused(f"{_article(keyword)} {keyword} statement", kind)
    inner, analyze = _explained(text)
    try:
        checked = _check_text(inner, allow_files=allow_files, strict_parse=True)
    except _Refused as refused:
        wrapper = "EXPLAIN ANALYZE" if analyze else "EXPLAIN"
        raise _Refused(f"{wrapper} of {refused.what}", refused.kind) from None
    return Checked(sql, checked.tables, checked.reads_files)


def _statement_type(statement: Any) -> Any:
    try:
        return statement.type
    except ValueError:
        return None


def _statement_kind(kind: Any, keyword: str) -> str:
    if kind in (_T.SET, _T.PRAGMA, _T.VARIABLE_SET):
        return "settings"
    if kind in (_T.COPY, _T.EXPORT, _T.COPY_DATABASE):
        return "file_write"
    if kind in (_T.ATTACH, _T.DETACH, _T.LOAD, _T.EXTENSION):
        return "database"
    if kind == _T.MULTI:
        return "unchecked"
    if kind == _T.CALL:
        return "call" if keyword == "CALL" else "server"  # CHECKPOINT is a CALL too
    return "write"


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _check_select(sql: str, *, allow_files: bool) -> Checked:
    tree = _PARSER.tree(sql)
    if tree.get("error"):
        raise _Refused(f"a query ({tree.get('error_message')})", "unchecked")
    tables: set[str] = set()
    files = False
    for node in _nodes(tree.get("statements", [])):
        _check_query_node(node)
        files = _check_function(node, allow_files=allow_files) or files
        table = node.get("table_name") if node.get("type") == "BASE_TABLE" else None
        if not isinstance(table, str):
            continue
        if not looks_like_path(table):
            tables.add(table.lower())
        elif allow_files:
            files = True
        else:
            raise _Refused(f"reading the file {table!r}", "files")
    return Checked(sql, frozenset(tables), files)


def _check_query_node(node: dict[str, Any]) -> None:
    """Refuse a query node that is not a SELECT (``DELETE_QUERY_NODE`` in a WITH…)."""
    node_type = node.get("type")
    if isinstance(node_type, str) and node_type.endswith("_NODE") and node_type not in QUERY_NODES:
        verb = node_type.removesuffix("_NODE").removesuffix("_QUERY").replace("_", " ")
        what = f"{_article(verb)} {verb} inside a query (a data-modifying WITH clause)"
        raise _Refused(what, "write")


def _check_function(node: dict[str, Any], *, allow_files: bool) -> bool:
    """Refuse a call the surface does not make; True when it is an allowed file reader."""
    name = node.get("function_name") if node.get("class") == "FUNCTION" else None
    if not isinstance(name, str):
        return False
    problem = function_kind(name, allow_files=allow_files)
    if problem is not None:
        raise _Refused(f"a call to {name.lower()}()", problem)
    return reads_files(name.lower())


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every object in a serialized syntax tree, depth first."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _words(sql: str) -> list[tuple[int, str, Any]]:
    """DuckDB's tokens of ``sql``: (start, text, type), comments left out."""
    tokens = duckdb.tokenize(sql)
    ends = [pos for pos, _ in tokens[1:]] + [len(sql)]
    return [
        (pos, sql[pos:end].strip(), kind)
        for (pos, kind), end in zip(tokens, ends, strict=True)
        if kind != duckdb.token_type.comment
    ]


def _keyword(sql: str) -> str:
    """The first word of a statement, for the message (``COPY``, ``CHECKPOINT``…)."""
    words = _words(sql)
    return words[0][1].upper() if words else "empty"


def _explained(sql: str) -> tuple[str, bool]:
    """The statement inside ``EXPLAIN [ANALYZE] [(options)] statement``, and ANALYZE?

    DuckDB's tokenizer finds the words (comments anywhere are skipped); the statement is
    what follows. ``EXPLAIN (SELECT 1)`` and ``EXPLAIN (FORMAT json) SELECT 1`` both start
    with a parenthesis: whichever reading parses as one statement is the statement, and
    if both or neither do, it cannot be checked.
    """
    words = _words(sql)[1:]  # after EXPLAIN
    analyze = bool(words) and words[0][1].upper() in ("ANALYZE", "ANALYSE")
    words = words[int(analyze) :]
    if not words:
        raise _Refused("an EXPLAIN without a statement", "empty")
    candidates = [sql[words[0][0] :]]
    if words[0][1] == "(":
        after = _after_parenthesis(words)
        if after is not None:
            candidates.append(sql[after:])
            analyze = analyze or any(w.upper() == "ANALYZE" for _, w, _ in words)
    parsed = [c for c in candidates if _one_statement(c)]
    if len(parsed) != 1:
        raise _Refused("an EXPLAIN whose statement cannot be told apart", "unchecked")
    return parsed[0], analyze


def _after_parenthesis(words: list[tuple[int, str, Any]]) -> int | None:
    """Where the text after the parenthesised group that opens ``words`` begins."""
    depth = 0
    for index, (_, text, kind) in enumerate(words):
        if kind == duckdb.token_type.operator:
            depth += text.count("(") - text.count(")")
        if depth == 0:
            return words[index + 1][0] if index + 1 < len(words) else None
    return None


def _one_statement(sql: str) -> bool:
    try:
        return len(_PARSER.statements(sql)) == 1
    except duckdb.Error:
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- what the database itself refused at run time -----------------------------------------
def runtime_refusal(exc: BaseException) -> ReadOnlyError | None:
    """The refusal for a query that the locked-down database refused (None: a plain error).

    Reached only when the parser check let something through: the database's own lock
    (external access off, settings locked, a read-only transaction) caught it.
    """
    text = _first_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return refusal(f"file access ({text})", "files")
    if isinstance(exc, duckdb.TransactionException) and "read-only" in text:
        return refusal(f"a write ({text})", "write")
    if isinstance(exc, duckdb.InvalidInputException) and "configuration has been locked" in text:
        return refusal(f"a settings change ({text})", "settings")
    return None


def normalize_params(params: Params) -> list[Any] | dict[str, Any] | None:
    """Parameters as the drivers take them: a list (``?``/``$1``) or a dict (``$name``)."""
    if params is None:
        return None
    if isinstance(params, Mapping):
        return {str(name): value for name, value in params.items()}
    if isinstance(params, (str, bytes, bytearray)):
        raise TypeError(
            "params must be a sequence (for ? or $1) or a mapping (for $name), not a string: "
            "kx.sql('... WHERE id = ?', [run_id])"
        )
    return list(params)
