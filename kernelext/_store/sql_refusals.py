"""Every refusal and error of the read-only SQL surface (``kx.sql``, ``%%ledger``,
``kernelext sql``), in one message shape: what was refused, why, and what to do instead
(:func:`refusal`, one entry per kind in :data:`REASONS`); what the database itself refused
at run time (:func:`runtime_refusal`), a query it cannot run (:func:`query_error`), one that
overran its timeout (:func:`query_timeout`), and one that got past the check
(:func:`breach`)."""

from __future__ import annotations

import logging

import duckdb

from ..errors import QueryError, QueryTimeout, ReadOnlyError, SurfaceBreach

__all__ = [
    "REASONS",
    "SURFACE",
    "breach",
    "query_error",
    "query_timeout",
    "refusal",
    "runtime_refusal",
]

_log = logging.getLogger("kernelext")

SURFACE = "the ledger's SQL surface (kx.sql, %%ledger, kernelext sql)"

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
    "empty": ("needs one query", "For example: SELECT status, count(*) FROM runs GROUP BY status."),
    "unlisted": (
        "calls only the functions it lists as harmless (kernelext._store.sql_allowed)",
        "Use a listed function, or compute it in Python on the result of kx.sql(...).",
    ),
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


# -- what the database itself refused at run time -----------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def query_error(exc: BaseException) -> QueryError:
    """The error for a query the database cannot run: its message, and what to do."""
    text = str(exc).strip() or type(exc).__name__
    return QueryError(
        f"The query was not run: the database says: {text}\n"
        "Check the SQL and the table and column names: SHOW TABLES lists the tables, "
        "DESCRIBE <table> a table's columns (kx.sql('SHOW TABLES'))."
    )


def query_timeout(timeout: float) -> QueryTimeout:
    """The error for a query that ran past ``timeout`` seconds and was stopped."""
    return QueryTimeout(
        f"kx.sql: the query ran longer than timeout={timeout:g}s and was stopped. "
        "Narrow it (a WHERE, a LIMIT) or give it a larger timeout."
    )


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


def breach(what: str, sql: str) -> SurfaceBreach:
    """The loud error (logged at ERROR as well) for a query that got past the check."""
    message = (
        f"kernelext's SQL check let through a query that {what}: this is a bug in kernelext "
        "(please report it, with the query). Its own transaction was rolled back, but what "
        f"it ran outside that one may have committed: check the store. Query: {sql[:500]!r}"
    )
    _log.error("SQL surface breach: %s", message)
    return SurfaceBreach(message)
