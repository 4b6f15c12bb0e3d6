"""Attacks on the SQL surface built from parts: a dangerous call, a wrapper, a spelling.

Hypothesis composes them and checks that ``kx.sql`` refuses each one and that every
table, sequence and setting of the store stays byte-identical; a fixed sample goes
through all three paths (``kx.sql``, ``%%ledger`` in an in-process shell, ``kernelext
sql`` in a subprocess, with ``--param`` and notebook variables carrying the SQL text).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from support.sql_paths import (
    cli_sql,
    close_shell,
    refused_on_every_path,
    run_in_shell,
    shell_with_extension,
)
from test_sql_safety import assert_refused_the_same, files, ledger_state, populate

import kernelext as kx
from kernelext._store import Store, open_store, sql_guard
from kernelext._store.sql_guard import Checked
from kernelext.errors import QueryError, QueryTimeout, ReadOnlyError

INNER = "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x"
# (function name, its arguments): each would write, run SQL text, touch the session or a file
CALLS = [
    ("json_execute_serialized_sql", f"json_serialize_sql('{INNER}')"),
    ("nextval", "'events_seq'"),
    ("setval", "'events_seq', 1"),
    ("query", "'DELETE FROM runs'"),
    ("query_table", "'runs'"),
    ("checkpoint", ""),
    ("setseed", "0.5"),
    ("write_log", "'x'"),
    ("read_text", "'/etc/passwd'"),
    ("json_serialize_plan", "'SELECT 1'"),
    ("sleep_ms", "1"),
    ("enable_logging", ""),
    ("index_key", "'runs', 'x'"),
]
SPELLINGS = [
    "{name}",
    "{upper}",
    '"{name}"',
    "main.{name}",
    "system.main.{name}",
    '"system"."main"."{name}"',
    "{name}/**/",
    "{name} -- c\n",
]
WRAPPERS = [
    "SELECT {call}",
    "SELECT CAST({call} AS VARCHAR)",
    "SELECT ({call})::VARCHAR",
    "SELECT TRY_CAST({call} AS INT)",
    "SELECT * FROM (SELECT {call} AS v) AS t",
    "SELECT list_transform([1], x -> {call})",
    "SELECT [{call} FOR x IN [1]]",
    "SELECT invoke(x -> {call}, 1)",
    "SELECT CASE WHEN true THEN {call} END",
    "SELECT coalesce(NULL, {call})",
    "WITH c AS (SELECT {call} AS v) SELECT * FROM c",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r, (SELECT {call}) WHERE n < 2)"
    " SELECT * FROM r",
    "SELECT COLUMNS(c -> {call} IS NULL) FROM runs",
    "EXPLAIN ANALYZE SELECT {call}",
    "EXPLAIN SELECT {call}",
    "PIVOT runs ON status IN ('x') USING max({call})",
    "SELECT 1 WHERE {call} IS NULL",
    "SELECT id FROM runs ORDER BY {call}",
    "SELECT id FROM runs LIMIT ({call})",
    "SELECT count(*) FILTER (WHERE {call} IS NULL) FROM runs",
    "SELECT sum(1) OVER (ORDER BY {call}) FROM runs",
    "SELECT * FROM range(1) AS t(x) QUALIFY {call} IS NULL",
    "SELECT ?::VARCHAR AS p, {call}",
    "SELECT 1 UNION ALL SELECT {call}",
    "SELECT TRY({call})",
    "SELECT {{'a': {call}}}",
    "FROM runs SELECT {call}",
    "SELECT * FROM {call}",
    "SELECT * FROM runs, {call}",
    "SELECT * FROM runs JOIN {call} ON true",
    "SELECT * FROM runs WHERE EXISTS (SELECT * FROM {call})",
    "SELECT * FROM (SELECT 1) AS a, LATERAL (SELECT * FROM {call})",
    "/* x */ SELECT {call}; -- trailing",
    "DESCRIBE SELECT {call}",
    "SELECT list_reduce([1, 2], (a, b) -> {call})",
    "SELECT map_from_entries([('k', {call})])",
    "SELECT 1 IN (SELECT {call})",
]


def spell(name: str, spelling: str) -> str:
    return spelling.format(name=name, upper=name.upper())


def attack(call: tuple[str, str], spelling: str, wrapper: str) -> str:
    name, args = call
    return wrapper.format(call=f"{spell(name, spelling)}({args})")


@pytest.fixture
def populated(store_path: Path, places: dict[str, Path]) -> Path:
    store = open_store(str(store_path))
    populate(store)
    store.close()
    return store_path


@pytest.fixture
def duck(populated: Path) -> Iterator[Store]:
    store = open_store(str(populated))
    try:
        yield store
    finally:
        store.close()


def test_composed_attacks_are_refused_by_kx_sql_and_change_nothing(populated: Path) -> None:
    store = open_store(str(populated))
    before = ledger_state(store)
    refused = {"n": 0}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(CALLS), st.sampled_from(SPELLINGS), st.sampled_from(WRAPPERS))
    def each(call: tuple[str, str], spelling: str, wrapper: str) -> None:
        query = attack(call, spelling, wrapper)
        try:
            kx.sql(query, ["p"] if "?" in query else None, store=store)
        except ReadOnlyError as exc:
            assert str(exc).startswith("Refused ") and "is read-only and" in str(exc)
            refused["n"] += 1
        except QueryError as exc:
            assert isinstance(exc.__cause__, duckdb.ParserException)  # not SQL: nothing ran
        else:
            raise AssertionError(f"ran: {query}")

    try:
        each()
        assert refused["n"] > 100
        assert ledger_state(store) == before
        assert store.read("SELECT count(*) FROM runs") == [(1,)]
    finally:
        store.close()


def test_every_wrapper_of_the_escape_is_refused_on_every_path(
    populated: Path, places: dict[str, Path]
) -> None:
    """kx.sql, %%ledger and kernelext sql refuse the same way; nothing changed after."""
    escape = CALLS[0]
    queries = [attack(escape, SPELLINGS[i % len(SPELLINGS)], w) for i, w in enumerate(WRAPPERS)]
    queries = [q for q in queries if "?" not in q][::3]  # a sample (each CLI call is a process)
    store = open_store(str(populated))
    before, listed = ledger_state(store), files(places["root"], populated)
    by_api, by_magic, by_cli = refused_on_every_path(store, populated, places["cwd"], queries)
    assert_refused_the_same(by_api)
    assert by_magic == by_api and by_cli == by_api
    store = open_store(str(populated))
    try:
        assert ledger_state(store) == before
    finally:
        store.close()
    assert files(places["root"], populated) == listed


def test_the_sql_text_as_a_parameter_or_notebook_variable_is_refused(
    populated: Path, places: dict[str, Path]
) -> None:
    """The serialized statement comes in as data: the call itself is what is refused."""
    store = open_store(str(populated))
    before = ledger_state(store)
    query = "SELECT * FROM json_execute_serialized_sql(json_serialize_sql($q))"
    with pytest.raises(ReadOnlyError, match="json_execute_serialized_sql"):
        kx.sql(query, {"q": INNER}, store=store)
    with pytest.raises(ReadOnlyError, match="json_execute_serialized_sql"):
        kx.sql("SELECT * FROM json_execute_serialized_sql(?)", [INNER], store=store)
    store.close()
    proc = cli_sql(populated, places["cwd"], query, "--param", f"q={INNER}")
    assert proc.returncode == 2 and "json_execute_serialized_sql" in proc.stderr, proc.stderr
    setval = cli_sql(
        populated,
        places["cwd"],
        "SELECT * FROM json_execute_serialized_sql(json_serialize_sql($q))",
        "--param",
        "q=SELECT setval('events_seq', 1000)",
    )
    assert setval.returncode == 2, setval.stderr
    shell = shell_with_extension(populated)
    try:
        shell.user_ns["inner"] = INNER
        cell = shell.run_cell(
            "%%ledger\nSELECT * FROM json_execute_serialized_sql(json_serialize_sql({inner}))"
        )
        assert isinstance(cell.error_in_exec, UsageError)
        assert "json_execute_serialized_sql" in str(cell.error_in_exec)
    finally:
        shell.user_ns.pop("inner", None)
        close_shell(shell)
    store = open_store(str(populated))
    try:
        assert ledger_state(store) == before
        assert store.read("SELECT count(*) FROM runs") == [(1,)]
    finally:
        store.close()


# -- the reviewer's second round: what runs is exactly what was checked -----------------------
def full_state(store: Store) -> dict[str, Any]:
    """ledger_state, and the session: variables, prepared statements, temporary objects."""
    state = ledger_state(store)
    if store.backend.dialect == "duckdb":
        for name, query in (
            ("variables", "SELECT name, value::VARCHAR FROM duckdb_variables() ORDER BY 1"),
            ("prepared", "SELECT name FROM duckdb_prepared_statements() ORDER BY 1"),
            ("macros", "SELECT function_name FROM duckdb_functions() WHERE NOT internal"),
            ("tables", "SELECT table_name, temporary FROM duckdb_tables() ORDER BY ALL"),
        ):
            state[name] = store.read(query)
    return state


def hide(full: str, tail: str = "SELECT 1", wrapper: str = "EXPLAIN ANALYZE") -> str:
    """The offset shift: a comment of multibyte characters as long as the hidden part.

    ``duckdb.tokenize`` counts bytes; a check that cut the text by characters there saw
    only ``tail``, while DuckDB ran all of ``full``.
    """
    assert full.endswith(tail)
    return f"{wrapper} /*" + "é" * (len(full) - len(tail)) + "*/ " + full


def hidden_payloads(out: Path) -> list[str]:
    return [
        f"SELECT count(*) FROM json_execute_serialized_sql(json_serialize_sql('{INNER}'))"
        " UNION ALL SELECT 1",
        "SELECT count(*) FROM json_execute_serialized_sql(json_serialize_sql("
        "$$SELECT setval('events_seq', 1000000)$$)) UNION ALL SELECT 1",
        "SELECT count(*) FROM force_checkpoint() UNION ALL SELECT 1",
        "SET VARIABLE pwn = $x$ SELECT 1",
        "PREPARE pwn AS SELECT 1",
        "SELECT setseed(0.5) UNION ALL SELECT 1",
        "CREATE TEMP MACRO pwn() AS TABLE SELECT 1",
        "CREATE TEMP TABLE pwn AS SELECT 1",
        "WITH d AS (DELETE FROM runs RETURNING *) SELECT 1",
        f"COPY (SELECT * FROM duckdb_settings()) TO '{out}/pwned.csv' (FORMAT csv, DATEFORMAT $x$"
        " SELECT 1",
    ]


def multibyte_attacks(out: Path) -> list[str]:
    found = []
    for full in hidden_payloads(out):
        for wrapper in ("EXPLAIN ANALYZE", "EXPLAIN", "EXPLAIN (ANALYZE)", "EXPLAIN (FORMAT json)"):
            query = hide(full, wrapper=wrapper)
            if "$x$" in full:  # the dollar quote closes in a comment after the tail
                query += " --$x$" + (")" if full.startswith("COPY") else "")
            found.append(query)
    return found


def test_multibyte_comments_in_explain_hide_nothing(
    populated: Path, places: dict[str, Path]
) -> None:
    """B1: every hidden statement is refused by kx.sql, with and without allow_files."""
    store = open_store(str(populated))
    before, listed = full_state(store), files(places["root"], populated)
    try:
        for query in multibyte_attacks(places["out"]):
            for allow_files in (False, True):
                with pytest.raises(ReadOnlyError, match=r"^Refused EXPLAIN"):
                    kx.sql(query, allow_files=allow_files, store=store)
        assert full_state(store) == before
        assert store.read("SELECT count(*) FROM runs") == [(1,)]
    finally:
        store.close()
    assert files(places["root"], populated) == listed
    assert not (places["out"] / "pwned.csv").exists()


def test_multibyte_explain_is_refused_by_ledger_and_cli(
    populated: Path, places: dict[str, Path]
) -> None:
    """B1 through %%ledger and kernelext sql (a01_cli.sh, a01_magic.py): one message each."""
    queries = [hide(full) for full in hidden_payloads(places["out"])[:2]]
    store = open_store(str(populated))
    before = full_state(store)
    by_api, by_magic, by_cli = refused_on_every_path(store, populated, places["cwd"], queries)
    assert by_magic == by_api and by_cli == by_api
    store = open_store(str(populated))
    try:
        assert full_state(store) == before
    finally:
        store.close()


def test_what_runs_is_what_was_checked_even_if_the_cut_were_wrong(
    populated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By construction: an EXPLAIN runs as EXPLAIN + the checked statement, nothing else.

    Were the statement inside an EXPLAIN cut wrongly again (the old offset bug), only the
    part that was checked would run: the rest of the text is never executed.
    """
    store = open_store(str(populated))
    before = full_state(store)
    hidden = hidden_payloads(Path("/nonexistent"))[0]
    query = "EXPLAIN ANALYZE " + hidden
    monkeypatch.setattr(sql_guard, "_explained", lambda _: ("SELECT 1", ["ANALYZE"]))
    try:
        assert sql_guard.check_query(query).sql == "EXPLAIN (ANALYZE) SELECT 1"
        plan = kx.sql(query, store=store)
        assert len(plan) >= 1
        assert full_state(store) == before
        assert store.read("SELECT count(*) FROM runs") == [(1,)]
    finally:
        store.close()


def test_tokens_are_cut_by_characters_not_bytes() -> None:
    words = sql_guard._words("/*éé*/ EXPLAIN /* ü */ SELECT 'ö' AS x")
    assert [(start, text) for start, text, _ in words] == [
        (7, "EXPLAIN"),
        (23, "SELECT"),
        (30, "'ö'"),
        (34, "AS"),
        (37, "x"),
    ]
    inner, options = sql_guard._explained("EXPLAIN /* ééé */ ANALYZE /*ü*/ SELECT 'ö'")
    assert (inner, options) == ("SELECT 'ö'", ["ANALYZE"])


def test_explain_runs_as_kernelext_writes_it(duck: Store) -> None:
    """Plain EXPLAIN, EXPLAIN ANALYZE and listed options work; other options are refused."""
    rewritten = {
        "EXPLAIN SELECT 1": "EXPLAIN SELECT 1",
        "explain /* c */ analyse SELECT 1": "EXPLAIN (ANALYZE) SELECT 1",
        "EXPLAIN (format JSON, analyze) SELECT 1": "EXPLAIN (ANALYZE, FORMAT JSON) SELECT 1",
        "EXPLAIN (SELECT 1)": "EXPLAIN (FORMAT TEXT) (SELECT 1)",
    }
    for query, runs in rewritten.items():
        assert sql_guard.check_query(query).sql == runs
        assert len(kx.sql(query, store=duck)) >= 1
    for query in (
        "EXPLAIN (FORMAT html) SELECT 1",
        "EXPLAIN (ANALYZE, FORMAT 'x') SELECT 1",
        "EXPLAIN (ANALYZE false) SELECT 1",
        "EXPLAIN EXPLAIN SELECT 1",
    ):
        with pytest.raises((ReadOnlyError, QueryError)):
            kx.sql(query, store=duck)


def test_allow_files_never_reruns_what_the_store_refused(
    duck: Store, places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B2: a COPY the check missed is refused by the store's instance and tried nowhere else."""
    import kernelext._store.duckdb.user_queries as backend

    target = places["out"] / "written.csv"
    before = full_state(duck)
    copy = f"COPY (SELECT 'import os' AS line) TO '{target}' (FORMAT csv, HEADER false)"
    monkeypatch.setattr(
        backend, "check_query", lambda sql, **_: Checked(copy, frozenset(), reads_files=False)
    )
    with pytest.raises(ReadOnlyError, match="Refused file access"):
        kx.sql("SELECT 1", allow_files=True, store=duck)
    monkeypatch.undo()
    assert not target.exists()
    assert full_state(duck) == before


def test_the_file_reading_instance_spills_to_a_private_directory(
    duck: Store, places: dict[str, Path]
) -> None:
    """B2: the throw-away instance's temp_directory is its own, and is removed after."""
    query = f"SELECT current_setting('temp_directory') AS t FROM read_text('{places['secret']}')"
    spill = kx.sql(query, allow_files=True, store=duck)["t"].tolist()[0]
    assert Path(spill).name.startswith("kernelext-sql-")
    assert not Path(spill).exists()


def test_deep_nesting_is_refused_as_unchecked(populated: Path, places: dict[str, Path]) -> None:
    """Low: RecursionError and DuckDB's depth limit become the standard refusal (exit 2)."""
    queries = [
        "SELECT " + "[" * 500 + "1" + "]" * 500,
        "SELECT " + "+".join(["1"] * 500),
        "SELECT " + "(" * 5000 + "1" + ")" * 5000,
    ]
    store = open_store(str(populated))
    try:
        for query in queries:
            with pytest.raises(ReadOnlyError, match="nested too deeply to check"):
                kx.sql(query, store=store)
    finally:
        store.close()
    proc = cli_sql(populated, places["cwd"], queries[1])
    assert proc.returncode == 2 and "nested too deeply" in proc.stderr, proc.stderr
    by_magic = run_in_shell(populated, queries[:1])
    assert "nested too deeply" in by_magic[queries[0]]


def test_postgres_calls_name_no_other_schema_and_no_method() -> None:
    """B4 at the check: s.f(x) is someone's function on PostgreSQL; x.f() is no SQL there."""
    for query in (
        "SELECT util.lower('X') AS x",
        "SELECT public.lower('X') AS x",
        "SELECT db.pg_catalog.lower('X') AS x",
        "SELECT 'X'.util.lower() AS x",
        "SELECT 'X'.lower() AS x",
        "SELECT util.count(*) OVER () FROM runs",
    ):
        with pytest.raises(ReadOnlyError, match=r"^Refused (a call to|the method call)"):
            sql_guard.check_query(query, postgres=True)
    for query in (
        "SELECT pg_catalog.lower('X')",
        "SELECT lower(id), count(*) OVER () FROM runs",
        # infix operators: their left operand comes first, and they are no method call
        "SELECT id FROM runs WHERE agent LIKE 'tri%' OR agent NOT ILIKE '%x'",
        "SELECT args ->> 'to', id || '-' || agent FROM runs, effects",
    ):
        sql_guard.check_query(query, postgres=True)
    sql_guard.check_query("SELECT id.upper() AS u, 'X'.lower() AS l FROM runs")  # DuckDB


@pytest.mark.postgres
def test_postgres_runs_only_what_was_checked(postgres_url: str, places: dict[str, Path]) -> None:
    """B3 and B4 on a real server: the hidden pg_* calls and a user's util.lower()."""
    import psycopg

    store = open_store(postgres_url)
    try:
        populate(store)
        with psycopg.connect(postgres_url, autocommit=True) as con:
            con.execute(
                "CREATE SCHEMA util; CREATE FUNCTION util.lower(text) RETURNS text"
                " LANGUAGE sql AS $$ SELECT 'ran: ' || $1 $$"
            )
        before = ledger_state(store)
        alive = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        sessions = {row[0] for row in store.read(alive)}
        for full in (
            f"SELECT CAST(pg_read_file('{places['secret']}') AS int)::text UNION ALL SELECT 'x'",
            "SELECT string_agg(f, ',') FROM pg_ls_dir('/') f UNION ALL SELECT 'x'",
            "SELECT count(pg_terminate_backend(pid))::text FROM pg_stat_activity"
            " UNION ALL SELECT 'x'",
        ):
            for wrapper in ("EXPLAIN ANALYZE", "EXPLAIN"):
                with pytest.raises(ReadOnlyError, match=r"^Refused EXPLAIN"):
                    kx.sql(hide(full, "SELECT 'x'", wrapper), store=store)
        for query in ("SELECT util.lower('X') AS x", "SELECT 'X'.util.lower() AS x"):
            with pytest.raises(ReadOnlyError, match=r"^Refused "):
                kx.sql(query, store=store)
        assert kx.sql("SELECT pg_catalog.lower('X') AS x", store=store)["x"].tolist() == ["x"]
        assert len(kx.sql("EXPLAIN ANALYZE SELECT count(*) FROM runs", store=store)) >= 1
        assert len(kx.sql("EXPLAIN (FORMAT json) SELECT 1", store=store)) >= 1
        assert ledger_state(store) == before
        # No session was ended (a pool may have opened one more meanwhile).
        assert sessions <= {row[0] for row in store.read(alive)}
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as con:
            con.execute("DROP SCHEMA IF EXISTS util CASCADE")
        store.close()


ENDLESS = "SELECT count(*) FROM range(1000000000000000) t(i), range(10) u(j) WHERE i + j < 0"


def test_a_timeout_interrupts_a_long_query_and_frees_the_store(duck: Store) -> None:
    """DoS: kx.sql(..., timeout=) interrupts the query; the store reads and writes after."""
    import time

    before = full_state(duck)
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match=r"timeout=0\.3s") as raised:
        kx.sql(ENDLESS, timeout=0.3, store=duck)
    assert time.monotonic() - started < 10
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, kx.KernelextError)
    assert kx.sql("SELECT count(*) AS n FROM runs", timeout=5, store=duck)["n"].tolist() == [1]
    assert full_state(duck) == before


@pytest.mark.postgres
def test_a_timeout_cancels_a_long_query_on_postgres(postgres_url: str) -> None:
    store = open_store(postgres_url)
    try:
        with pytest.raises(QueryTimeout, match=r"timeout=0\.3s"):
            kx.sql(
                "SELECT count(*) FROM generate_series(1, 100000000000) AS g(i)",
                timeout=0.3,
                store=store,
            )
        assert kx.sql("SELECT 1 AS one", timeout=5, store=store)["one"].tolist() == [1]
        assert store.read("SHOW statement_timeout") == [("0",)]  # SET LOCAL: this query only
    finally:
        store.close()
