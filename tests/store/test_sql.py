"""``kx.sql``: a read-only view of the store (issue 3), on a real DuckDB file."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import kernelext as kx
import kernelext._core.process.api
from kernelext._core.ledger.effect import args_hash, effect_key
from kernelext._store import Store, open_store
from kernelext._store.schema import TABLES
from kernelext.errors import ReadOnlyError

STORE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "store.md"
WAIT = 60


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    """A store with a completed-then-failed run and a run with one unknown effect."""
    opened = open_store(str(store_path))

    @kx.effect
    def send(to: str, *, idempotency_key: str | None = None) -> str:
        return f"sent to {to}"

    @kx.effect
    def charge(amount: int, *, idempotency_key: str | None = None) -> str:
        raise RuntimeError("card declined")

    @kx.agent(name="sql-orders")
    def orders(run: kx.Run) -> None:
        with run.step("mail"):
            send("a@example.org")
            send("b@example.org")
        with run.step("pay"):
            charge(12)

    assert orders.start(run_id="orders", store=opened).wait(WAIT) == "failed"

    @kx.agent(name="sql-booking")
    def booking(run: kx.Run) -> None:
        with run.step("book"):
            raise RuntimeError("stops before the call")

    assert booking.start(run_id="booking", store=opened).wait(WAIT) == "failed"
    opened.write_intent(
        {  # a dead process left this intent; a resume would find it
            "key": effect_key("booking", "book", "book", 0),
            "run_id": "booking",
            "step_key": "book",
            "step_ordinal": 0,
            "tool": "book",
            "call_ordinal": 0,
            "args_hash": args_hash(("blue",), {}),
            "args": '{"room": "blue"}',
            "resumable": True,
        }
    )
    opened.write(lambda tx: opened.mark_pending_unknown(tx, "booking"))
    yield opened
    opened.close()


def fingerprint(store: Store) -> dict[str, str]:
    """A digest of every table, to show that nothing changed."""
    out = {}
    for table in (*TABLES, "schema_version"):
        rows = sorted(json.dumps(row, default=str) for row in store.read(f"SELECT * FROM {table}"))
        out[table] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    out["next event id"] = str(store.read("SELECT max(id) FROM events")[0][0])
    return out


def test_returns_a_dataframe_when_pandas_is_installed(store: Store) -> None:
    frame = kx.sql("SELECT tool, status FROM effects ORDER BY tool, call_ordinal", store=store)
    assert isinstance(frame, pd.DataFrame)
    assert frame.to_dict("records") == [
        {"tool": "book", "status": "unknown"},
        {"tool": "charge", "status": "failed"},
        {"tool": "send", "status": "applied"},
        {"tool": "send", "status": "applied"},
    ]


def test_returns_an_arrow_table_without_pandas(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernelext._core.process.api, "_has_pandas", lambda: False)
    table = kx.sql(
        "SELECT status, count(*) AS n FROM effects GROUP BY status ORDER BY status", store=store
    )
    assert isinstance(table, pa.Table)
    assert table.to_pylist() == [
        {"status": "applied", "n": 2},
        {"status": "failed", "n": 1},
        {"status": "unknown", "n": 1},
    ]
    assert isinstance(kx.runs(store=store), pa.Table)


WRITES = [
    "INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'forged')",
    "UPDATE effects SET status = 'applied' WHERE status = 'unknown'",
    "DELETE FROM events",
    "CREATE TABLE notes AS SELECT 1 AS x",
    "CREATE VIEW v AS SELECT 1 AS x",
    "DROP TABLE events",
    "COPY effects TO '{tmp}/leak.csv'",
    "COPY (SELECT * FROM effects) TO '{tmp}/leak.csv'",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "EXPLAIN ANALYZE INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'x')",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp}/leak.csv'",
    "SELECT nextval('events_seq')",
    "PRAGMA enable_profiling",
    "CHECKPOINT",
    "EXPORT DATABASE '{tmp}/export'",
]
MULTIPLE = [
    "SELECT 1; SELECT 2",
    "SELECT count(*) FROM runs; DELETE FROM runs",
    "DELETE FROM effects; SELECT 1",
]


@pytest.mark.parametrize("statement", WRITES + MULTIPLE)
def test_refuses_statements_that_write_and_leaves_the_store_alone(
    store: Store, tmp_path: Path, statement: str
) -> None:
    before = fingerprint(store)
    with pytest.raises(ReadOnlyError, match="read-only"):
        kx.sql(statement.format(tmp=tmp_path), store=store)
    assert fingerprint(store) == before
    assert not (tmp_path / "leak.csv").exists() and not (tmp_path / "export").exists()
    assert not (tmp_path / "other.duckdb").exists()
    names = {r[0] for r in store.read("SELECT table_name FROM information_schema.tables")}
    assert not names & {"notes", "v"}
    store.record_event(None, "probe")  # the store still writes normally afterwards
    assert store.read("SELECT count(*) FROM events WHERE kind = 'probe'") == [(1,)]


def test_read_only_error_says_what_to_do(store: Store) -> None:
    with pytest.raises(ReadOnlyError) as refused:
        kx.sql("DELETE FROM runs", store=store)
    assert "DELETE" in str(refused.value) and "kx.reconcile" in str(refused.value)
    assert isinstance(refused.value, kx.KernelextError)


def test_plain_explain_and_trailing_semicolon_are_fine(store: Store) -> None:
    assert len(kx.sql("EXPLAIN SELECT * FROM effects", store=store)) >= 1
    assert kx.sql("SELECT count(*) AS n FROM runs;", store=store)["n"].tolist() == [2]


def documented_queries() -> dict[str, str]:
    """``kx.sql("...")  # what it shows`` examples from docs/store.md, by their comment."""
    found: dict[str, str] = {}
    text = STORE_PAGE.read_text()
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL):
        lines = block.splitlines()
        for node in ast.walk(ast.parse(block)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "sql"
                and node.args
            ):
                query = ast.literal_eval(node.args[0])
                last = lines[(node.end_lineno or node.lineno) - 1]
                comment = last.split("#", 1)[1].strip() if "#" in last else query
                found[comment] = query
    return found


def test_documented_examples_work(store: Store) -> None:
    queries = documented_queries()
    assert {"all unknown effects", "effects per tool and status"} <= set(queries), queries
    unknown = kx.sql(queries["all unknown effects"], store=store)
    assert unknown["tool"].tolist() == ["book"] and unknown["run_id"].tolist() == ["booking"]
    per_tool = kx.sql(queries["effects per tool and status"], store=store)
    counts: dict[tuple[Any, ...], Any] = {
        (row[0], row[1]): row[2] for row in per_tool.itertuples(index=False)
    }
    assert counts == {("send", "applied"): 2, ("charge", "failed"): 1, ("book", "unknown"): 1}
    for comment, query in queries.items():  # every other example runs too
        assert kx.sql(query, store=store) is not None, comment
