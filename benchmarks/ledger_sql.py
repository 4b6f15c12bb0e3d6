"""Issue 3: ``kx.sql`` over a ledger of a million effects (``GROUP BY status``).

The ledger is generated in SQL inside one ``store.write`` job (100 runs, 8 tools,
a realistic mix of statuses), the store is closed (checkpointed) and reopened, and
``kx.sql`` is timed end to end: read-only check, query, Arrow, DataFrame.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from .common import Plan, settle, summarize, tempdir

__all__ = ["QUERY", "measure_sql"]

QUERY = "SELECT status, count(*) AS n FROM effects GROUP BY status"
QUERY_TOOLS = "SELECT tool, status, count(*) AS n FROM effects GROUP BY ALL ORDER BY ALL"

_FILL = """
INSERT INTO effects (key, run_id, step_key, step_ordinal, tool, call_ordinal, args_hash, args,
                     status, resumable, result, intent_at, outcome_at)
SELECT CAST(md5('bench' || i) AS UUID), 'run-' || (i % 100), CAST(i // 10 AS VARCHAR),
       CAST(i // 10 AS INTEGER), 'tool_' || (i % 8), CAST(i % 10 AS INTEGER),
       substr(md5('args' || i), 1, 32), '{"i": ' || i || '}',
       CASE WHEN i % 200 = 0 THEN 'unknown' WHEN i % 50 = 1 THEN 'failed'
            WHEN i % 500 = 2 THEN 'pending' WHEN i % 1000 = 3 THEN 'not_applied'
            ELSE 'applied' END,
       TRUE, '{"ok": true}', ?, ?
FROM range(?) t(i)
"""


def measure_sql(plan: Plan) -> dict[str, Any]:
    import kernelext as kx
    from kernelext._store import open_store

    with tempdir("sql") as folder:
        path = os.path.join(folder, "ledger.duckdb")
        store = open_store(path)
        started = time.perf_counter()
        now = store.now()
        store.write(lambda tx: tx.execute(_FILL, (now, now, plan.sql_rows)))
        store.close()
        build_s = time.perf_counter() - started
        store = open_store(path)
        try:
            first = kx.sql(QUERY, store=store)  # warm: first touch of the table
            kind = type(first).__module__.split(".")[0] + "." + type(first).__name__
            column = first["n"]
            rows = int(sum(column.tolist() if hasattr(column, "tolist") else column.to_pylist()))
            sql_ms, raw_ms, tools_ms = [], [], []
            for _ in range(plan.sql_reps):
                settle()
                start = time.perf_counter()
                kx.sql(QUERY, store=store)
                sql_ms.append((time.perf_counter() - start) * 1000.0)
                start = time.perf_counter()
                store.read(QUERY)  # the store's own read path: a cursor, rows as tuples
                raw_ms.append((time.perf_counter() - start) * 1000.0)
                start = time.perf_counter()
                kx.sql(QUERY_TOOLS, store=store)
                tools_ms.append((time.perf_counter() - start) * 1000.0)
        finally:
            store.close()
    return {
        "rows": rows,
        "query": QUERY,
        "returns": kind,
        "build_seconds": build_s,
        "kx_sql_ms": summarize(sql_ms),
        "store_read_ms": summarize(raw_ms),
        "kx_sql_tool_status_ms": summarize(tools_ms),
        "kx_sql_median_ms": statistics.median(sql_ms),
    }
