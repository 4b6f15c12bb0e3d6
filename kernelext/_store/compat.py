"""Is this database a kernelext store this release may write to?

Checked before anything is written to it (on every DuckDB connect, and at the start of
the migration transaction on every backend):

* a store whose ``schema_version`` is newer than this release's newest migration was
  written by a newer kernelext: refused (``SchemaTooNewError``), so an old release never
  writes rows a newer schema does not expect;
* a database with tables but no ``schema_version`` table is someone else's
  (``ForeignStoreError``): kernelext creates nothing in it. An empty database is fine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ForeignStoreError, SchemaTooNewError
from .schema import MIGRATIONS, TABLES, VIEWS

__all__ = ["NEWEST_SCHEMA", "check_store"]

NEWEST_SCHEMA = max(m.version for m in MIGRATIONS)
Fetch = Callable[[str], Sequence[tuple[Any, ...]]]

# Tables of this database (not of other attached ones), with "is it in the schema that
# unqualified names resolve to". Same SQL on DuckDB and PostgreSQL.
_TABLES = (
    "SELECT table_schema = current_schema(), table_schema, table_name"
    " FROM information_schema.tables WHERE table_catalog = current_database()"
    " AND table_schema NOT IN ('pg_catalog', 'information_schema')"
    " ORDER BY table_schema, table_name"
)
_OURS = frozenset(
    (
        *TABLES,
        *VIEWS,
        "journal_state",
        "quarantine",
        "langgraph_checkpoints",
        "langgraph_blobs",
        "langgraph_writes",
    )
)
_SHOWN = 5  # foreign tables named in the message


def check_store(fetch: Fetch, path: str, any_table_is_foreign: bool) -> int:
    """The store's schema version (0: empty); raise if this release must not write to it."""
    tables = [(bool(here), str(schema), str(name)) for here, schema, name in fetch(_TABLES)]
    if any(here and name == "schema_version" for here, _, name in tables):
        return _check_version(fetch, path)
    foreign = _foreign_tables(tables, any_table_is_foreign)
    if foreign:
        raise ForeignStoreError(_foreign_message(path, foreign, any_table_is_foreign))
    return 0


def _check_version(fetch: Fetch, path: str) -> int:
    rows = fetch("SELECT max(version) FROM schema_version")
    version = int(rows[0][0]) if rows and rows[0][0] is not None else 0
    if version > NEWEST_SCHEMA:
        raise SchemaTooNewError(
            f"The kernelext store {path} was written by a newer kernelext (schema {version}, "
            f"this release knows up to {NEWEST_SCHEMA}); nothing was changed in it. Upgrade "
            "kernelext (pip install -U kernelext) in this environment to open it, or point "
            "KERNELEXT_STORE / kx.open_store(path) at another store."
        )
    return version


def _foreign_tables(tables: list[tuple[bool, str, str]], any_table: bool) -> list[str]:
    """Tables that make the database someone else's.

    An embedded file (``any_table``): any table, a store file is kernelext's alone. A
    server database may hold other applications' tables beside the store; only a table
    with one of the store's names, which kernelext would take for its own, is foreign.
    """
    if any_table:
        return [name if schema == "main" else f"{schema}.{name}" for _, schema, name in tables]
    return [name for here, _, name in tables if here and name in _OURS]


def _foreign_message(path: str, foreign: list[str], embedded: bool) -> str:
    shown = ", ".join(foreign[:_SHOWN])
    if len(foreign) > _SHOWN:
        shown += f", … ({len(foreign)} tables)"
    elsewhere = (
        "another path; a file that does not exist yet becomes a new store"
        if embedded
        else "another database (or schema), or rename these tables"
    )
    return (
        f"{path} is a database that kernelext did not create: it has tables ({shown}) but "
        "no schema_version table. kernelext created nothing in it. Point KERNELEXT_STORE "
        f"(or kx.open_store(...)) at {elsewhere}."
    )
