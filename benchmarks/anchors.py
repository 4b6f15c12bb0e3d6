"""Anchors measured in the same run: what one durable commit costs on this disk."""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
import uuid
from typing import Any

from .common import Plan, summarize, tempdir

__all__ = ["measure_anchors"]

WARMUP = 10


def _duckdb_commit(folder: str, ops: int) -> list[float]:
    """A single-row insert committed on a long-lived connection (autocommit)."""
    import duckdb

    con = duckdb.connect(os.path.join(folder, "anchor.duckdb"))
    con.execute("CREATE TABLE t (id UUID PRIMARY KEY, step INTEGER, note TEXT)")
    out = []
    for i in range(ops + WARMUP):
        start = time.perf_counter()
        con.execute("INSERT INTO t VALUES (?, ?, ?)", [uuid.uuid4(), i, "x"])
        out.append((time.perf_counter() - start) * 1000.0)
    con.close()
    return out[WARMUP:]


def _sqlite_commit(folder: str, ops: int) -> list[float]:
    """A single-row insert committed in SQLite, WAL mode, synchronous=FULL."""
    con = sqlite3.connect(os.path.join(folder, "anchor.sqlite"), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE t (id BLOB PRIMARY KEY, step INTEGER, note TEXT)")
    out = []
    for i in range(ops + WARMUP):
        start = time.perf_counter()
        con.execute("INSERT INTO t VALUES (?, ?, ?)", (uuid.uuid4().bytes, i, "x"))
        out.append((time.perf_counter() - start) * 1000.0)
    con.close()
    return out[WARMUP:]


def _fsync(folder: str, ops: int) -> list[float]:
    """Append 64 bytes to an open file and fsync it."""
    fd = os.open(os.path.join(folder, "anchor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = []
    try:
        for _ in range(ops + WARMUP):
            start = time.perf_counter()
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            out.append((time.perf_counter() - start) * 1000.0)
    finally:
        os.close(fd)
    return out[WARMUP:]


def measure_anchors(plan: Plan) -> dict[str, Any]:
    """Medians (ms) of each anchor, over ``plan.reps`` repetitions."""
    probes = {
        "duckdb_commit_ms": _duckdb_commit,
        "sqlite_wal_full_commit_ms": _sqlite_commit,
        "fsync_ms": _fsync,
    }
    reps: dict[str, list[float]] = {name: [] for name in probes}
    for _ in range(plan.reps):
        for name, probe in probes.items():  # interleaved, so drift hits every anchor alike
            with tempdir("anchor") as folder:
                reps[name].append(statistics.median(probe(folder, plan.anchor_ops)))
    return {name: summarize(values, plan.anchor_ops * plan.reps) for name, values in reps.items()}
