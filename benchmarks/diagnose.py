"""``python -m benchmarks diagnose``: what the statements of one kernelext step cost.

Times, on a store file with kernelext's schema and a raw long-lived DuckDB
connection, the transactions the engine commits per step and per effect call,
and variants of them. Used to explain where a missed target's time goes.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from .common import tempdir

__all__ = ["diagnose"]

RUN = "diag"


def _tx(con: Any, body: Callable[[int], None]) -> Callable[[int], None]:
    def run(i: int) -> None:
        con.execute("BEGIN TRANSACTION")
        body(i)
        con.execute("COMMIT")

    return run


def _cases(con: Any) -> dict[str, Callable[[int], None]]:
    now = dt.datetime(2026, 1, 1)
    step_ids: list[uuid.UUID] = []

    def insert_step(i: int) -> None:
        step_ids.append(uuid.uuid4())
        con.execute(
            "INSERT INTO steps (id, run_id, ordinal, key, name, status, started_at)"
            " VALUES (?, ?, ?, ?, ?, 'running', ?)",
            [step_ids[-1], RUN, i, str(i), None, now],
        )

    def blob_row(i: int) -> list[Any]:
        return [uuid.uuid4(), RUN, "json", "0" * 64, 2, "inline", None, str(i).encode(), now]

    blob_sql = (
        "INSERT INTO blobs (id, run_id, encoding, sha256, size, location, base_id, data,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
    )

    def complete(i: int, many: bool) -> None:
        if many:
            con.executemany(blob_sql, [blob_row(i)])
        else:
            con.execute(blob_sql, blob_row(i))
        snap = uuid.uuid4()
        con.execute(
            "INSERT INTO snapshots (id, run_id, step_ordinal, created_at, manifest, bytes)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [snap, RUN, i, now, '{"i": "00"}', 2],
        )
        con.execute(
            "UPDATE steps SET status = 'completed', ended_at = ?, duration_s = ?,"
            " snapshot_id = ? WHERE id = ?",
            [now, 0.001, snap, step_ids[-1] if step_ids else uuid.uuid4()],
        )
        con.execute(
            "UPDATE runs SET completed_steps = completed_steps + 1, updated_at = ? WHERE id = ?",
            [now, RUN],
        )

    def both(i: int) -> None:
        insert_step(i)
        complete(i, False)

    def effect_intent(i: int) -> None:
        key = uuid.uuid4()
        con.execute("SELECT status, args_hash, result, error FROM effects WHERE key = ?", [key])
        con.execute(
            "INSERT INTO effects (key, run_id, step_key, step_ordinal, tool, call_ordinal,"
            " args_hash, args, status, resumable, intent_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
            [key, RUN, "s", 0, "ping", i, "h" * 32, "{}", True, now],
        )

    return {
        "empty commit (BEGIN; COMMIT)": _tx(con, lambda i: None),
        "begin_step alone (INSERT steps)": _tx(con, insert_step),
        "complete_step (blob via executemany)": _tx(con, lambda i: complete(i, True)),
        "complete_step (blob via execute)": _tx(con, lambda i: complete(i, False)),
        "begin_step + complete_step in one tx": _tx(con, lambda i: both(i)),
        "executemany of 1 row alone (no commit)": lambda i: con.executemany(
            blob_sql, [blob_row(i)]
        ),
        "execute of 1 row alone (no commit)": lambda i: con.execute(blob_sql, blob_row(i)),
        "effect intent (SELECT + INSERT effects)": _tx(con, effect_intent),
    }


def diagnose(ops: int = 200) -> str:
    import duckdb

    from kernelext._store import open_store

    lines = []
    with tempdir("diagnose") as folder:
        path = os.path.join(folder, "diag.duckdb")
        store = open_store(path)
        store.create_run(RUN, "diag")
        store.close()
        con = duckdb.connect(path)
        for name, case in _cases(con).items():
            times = []
            inside = "no commit" in name  # run the statement inside one open transaction
            if inside:
                con.execute("BEGIN TRANSACTION")
            for i in range(ops):
                start = time.perf_counter()
                case(i)
                times.append((time.perf_counter() - start) * 1000.0)
            if inside:
                con.execute("COMMIT")
            lines.append(f"{statistics.median(times):8.3f} ms  {name}")
        con.close()
    return "median of " + str(ops) + " each, on kernelext's schema:\n" + "\n".join(lines)
