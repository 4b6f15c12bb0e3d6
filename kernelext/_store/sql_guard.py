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

What runs is exactly what was checked (``Checked.sql``): the whole text of a query, or,
for an ``EXPLAIN``, ``EXPLAIN`` + options kernelext writes itself + the checked statement's
text. The original text is never run past the check, so no way of cutting it (comments,
multibyte characters: ``duckdb.tokenize`` counts bytes) can hide a statement from it.

This check is the first line only. The backends run what passes where it cannot change
anything even if the check were wrong (see ``read_arrow`` of each backend), and turn what
their database refuses at run time into the same message (:func:`runtime_refusal`).

Every refusal is a :class:`~kernelext.errors.ReadOnlyError` with one message shape:
what was refused, why, and what to do instead. A query the database cannot run (a table it
does not know, SQL it cannot parse) is a :class:`~kernelext.errors.QueryError`
(:func:`query_error`), one that overran its timeout a :class:`~kernelext.errors.QueryTimeout`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from ..errors import QueryError, SurfaceBreach
from .sql_refusals import (
    _first_line,
    breach,
    query_error,
    query_timeout,
    refusal,
    runtime_refusal,
)
from .sql_tree import _Refused, check_tree

__all__ = [
    "Checked",
    "Params",
    "SurfaceBreach",
    "breach",
    "check_query",
    "normalize_params",
    "query_error",
    "query_timeout",
    "refusal",
    "runtime_refusal",
]

Params = Sequence[Any] | Mapping[str, Any] | None
_T = duckdb.StatementType


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


def check_query(
    sql: str, *, allow_files: bool = False, strict_parse: bool = False, postgres: bool = False
) -> Checked:
    """Check ``sql`` for the read-only surface; raise the refusal, else say what it reads.

    What the backend runs is ``Checked.sql``, never ``sql``: the text that was checked
    (for ``EXPLAIN``, rebuilt from the statement that was checked, see :func:`_explain`).

    A query DuckDB's parser cannot read raises :class:`QueryError` with the parser's
    message (running it would fail the same way), unless ``strict_parse`` (another
    database runs it): then it is refused, because it cannot be checked. ``postgres``:
    PostgreSQL runs it, so a call qualified by a schema other than ``pg_catalog`` (a
    function someone created) and DuckDB's method-call syntax ``x.f()`` are refused too.
    Text that is not valid Unicode (a lone surrogate) raises :class:`QueryError` too.
    """
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QueryError(
            f"The query was not run: its text holds a character that is not valid Unicode "
            f"at position {exc.start} ({sql[exc.start]!r}, a lone surrogate). Remove it, or "
            "pass the value as a parameter (kx.sql(query, params))."
        ) from None
    try:
        return _check_text(
            sql, allow_files=allow_files, strict_parse=strict_parse or postgres, postgres=postgres
        )
    except _Refused as refused:
        raise refusal(refused.what, refused.kind) from None
    except RecursionError:
        raise refusal("a query nested too deeply to check", "unchecked") from None
    except duckdb.ParserException as exc:
        raise query_error(exc) from exc


def _check_text(sql: str, *, allow_files: bool, strict_parse: bool, postgres: bool) -> Checked:
    try:
        statements = _PARSER.statements(sql)
    except duckdb.ParserException as exc:
        if "expression depth" in str(exc):
            raise _Refused("a query nested too deeply to check", "unchecked") from None
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
        return _check_select(sql, allow_files=allow_files, postgres=postgres)
    if statement_type != _T.EXPLAIN:
        keyword = _keyword(text)
        kind = _statement_kind(statement_type, keyword)
        raise _Refused(f"{_article(keyword)} {keyword} statement", kind)
    return _explain(text, allow_files=allow_files, postgres=postgres)


def _explain(text: str, *, allow_files: bool, postgres: bool) -> Checked:
    """Check ``EXPLAIN [ANALYZE] [(options)] statement`` and say what runs instead of it.

    The inner statement is checked like any query (it must be a SELECT: ``EXPLAIN ANALYZE``
    runs it, on PostgreSQL too), and what runs is rebuilt from it: ``EXPLAIN`` + the
    options as kernelext writes them (from a short list) + exactly the text that was
    checked. Nothing of the original text outside the checked statement is run, so
    however that text was cut, a statement that was not checked cannot run.
    """
    inner, options = _explained(text)
    wrapper = "EXPLAIN ANALYZE" if "ANALYZE" in options else "EXPLAIN"
    try:
        statements = _PARSER.statements(inner)
        if len(statements) == 1 and statements[0][0] == _T.EXPLAIN:
            raise _Refused("an EXPLAIN of an EXPLAIN", "unchecked")
        checked = _check_text(inner, allow_files=allow_files, strict_parse=True, postgres=postgres)
    except _Refused as refused:
        raise _Refused(f"{wrapper} of {refused.what}", refused.kind) from None
    if not options and _words(checked.sql)[0][1] == "(":
        options = ["FORMAT TEXT"]  # so that the statement's parenthesis is not read as options
    prefix = f"EXPLAIN ({', '.join(options)}) " if options else "EXPLAIN "
    rebuilt = prefix + checked.sql
    found = _PARSER.statements(rebuilt)
    if len(found) != 1 or found[0][0] != _T.EXPLAIN:  # pragma: no cover - a parser change
        raise _Refused("an EXPLAIN whose statement cannot be told apart", "unchecked")
    return Checked(rebuilt, checked.tables, checked.reads_files)


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


def _check_select(sql: str, *, allow_files: bool, postgres: bool) -> Checked:
    tree = _PARSER.tree(sql)
    if tree.get("error"):
        raise _Refused(f"a query ({tree.get('error_message')})", "unchecked")
    tables, files = check_tree(tree, allow_files=allow_files, postgres=postgres)
    return Checked(sql, tables, files)


def _words(sql: str) -> list[tuple[int, str, Any]]:
    """DuckDB's tokens of ``sql``: (start, text, type), comments left out.

    ``duckdb.tokenize`` gives UTF-8 *byte* offsets; they are turned into offsets of the
    Python string here (a comment full of ``é`` once shifted every cut after it). What
    runs never depends on these offsets alone: see :func:`_explain`.
    """
    data = sql.encode("utf-8")
    tokens = duckdb.tokenize(sql)
    ends = [pos for pos, _ in tokens[1:]] + [len(data)]
    words: list[tuple[int, str, Any]] = []
    chars, previous = 0, 0
    for (pos, kind), end in zip(tokens, ends, strict=True):
        chars += len(data[previous:pos].decode("utf-8"))
        previous = pos
        if kind != duckdb.token_type.comment:
            words.append((chars, data[pos:end].decode("utf-8").strip(), kind))
    return words


def _keyword(sql: str) -> str:
    """The first word of a statement, for the message (``COPY``, ``CHECKPOINT``…)."""
    words = _words(sql)
    return words[0][1].upper() if words else "empty"


# EXPLAIN's options that pass, as they are written again: option -> the values it may take
_EXPLAIN_OPTIONS: dict[str, frozenset[str]] = {
    "ANALYZE": frozenset({"", "TRUE", "ON"}),
    "FORMAT": frozenset({"TEXT", "JSON", "YAML"}),  # on DuckDB and PostgreSQL both
}


def _explained(sql: str) -> tuple[str, list[str]]:
    """The statement inside ``EXPLAIN [ANALYZE] [(options)] statement``, and its options.

    DuckDB's tokenizer finds the words (comments anywhere are skipped); the statement is
    what follows. ``EXPLAIN (SELECT 1)`` and ``EXPLAIN (FORMAT json) SELECT 1`` both start
    with a parenthesis: whichever reading parses as one statement is the statement, and
    if both or neither do, it cannot be checked. The options are read word by word and
    written again by kernelext (``_EXPLAIN_OPTIONS``); any other word is refused.
    """
    words = _words(sql)[1:]  # after EXPLAIN
    options: list[str] = []
    if words and words[0][1].upper() in ("ANALYZE", "ANALYSE"):
        options.append("ANALYZE")
        words = words[1:]
    if not words:
        raise _Refused("an EXPLAIN without a statement", "empty")
    candidates: list[tuple[str, list[str] | None]] = [(sql[words[0][0] :], options)]
    if words[0][1] == "(" and not options:
        after = _after_parenthesis(words)
        if after is not None:
            start, group = after
            candidates.append((sql[start:], _explain_options(group)))
    parsed = [(text, opts) for text, opts in candidates if _one_statement(text)]
    if len(parsed) != 1:
        raise _Refused("an EXPLAIN whose statement cannot be told apart", "unchecked")
    text, opts = parsed[0]
    if opts is None:
        raise _Refused("EXPLAIN options it does not know (it knows ANALYZE, FORMAT)", "unchecked")
    return text, opts


def _explain_options(group: list[str]) -> list[str] | None:
    """``(ANALYZE, FORMAT json)`` (its words) as kernelext writes it; None: not listed."""
    inner = " ".join(group[1:-1]).upper()
    options: list[str] = []
    for option in (o.split() for o in inner.split(",")):
        if not option or option[0].replace("ANALYSE", "ANALYZE") not in _EXPLAIN_OPTIONS:
            return None
        name = option[0].replace("ANALYSE", "ANALYZE")
        value = " ".join(option[1:])
        if value not in _EXPLAIN_OPTIONS[name] or len(option) > 2:
            return None
        options.append(name if name == "ANALYZE" else f"{name} {value}")
    return sorted(set(options))


def _after_parenthesis(words: list[tuple[int, str, Any]]) -> tuple[int, list[str]] | None:
    """Where the text after the parenthesised group that opens ``words`` begins, and the
    words of that group."""
    depth = 0
    for index, (_, text, kind) in enumerate(words):
        if kind == duckdb.token_type.operator:
            depth += text.count("(") - text.count(")")
        if depth == 0:
            if index + 1 >= len(words):
                return None
            return words[index + 1][0], [w for _, w, _ in words[: index + 1]]
    return None


def _one_statement(sql: str) -> bool:
    try:
        return len(_PARSER.statements(sql)) == 1
    except duckdb.Error:
        return False


# -- parameters -----------------------------------------------------------------------------
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
