"""A store put back to an older schema version, as an older release left it.

``back_to_schema(store, version)`` undoes the migrations after ``version`` that changed
names (8: ``questions`` was the table ``inputs``, with no view) and forgets that they
ran, so the next open migrates the store again. Same SQL on DuckDB and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

__all__ = ["back_to_schema"]


def back_to_schema(store: Any, version: int) -> None:
    def job(tx: Any) -> None:
        if version < 8:
            tx.execute("DROP VIEW inputs")
            tx.execute("ALTER TABLE questions RENAME TO inputs")
        tx.execute("DELETE FROM schema_version WHERE version > ?", (version,))

    store.write(job)
