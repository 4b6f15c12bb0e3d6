"""The SQL surface admits a reviewed list, not "everything but" (issue 19, item 1).

On the installed DuckDB: every function of ``duckdb_functions()`` that the list does not
name is refused wherever it is called; nothing the list names runs SQL, writes, reads a
file, moves a sequence or changes a setting (by name, by expanding every listed macro, and
by running every listed function on a scratch store that must stay byte-identical); and the
third layer catches what a wrong list would let through. On PostgreSQL, every listed name
that the server knows is pure there, or reviewed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from test_sql_safety import ledger_state, populate

import kernelext as kx
from kernelext._store import Store, open_store, sql_allowed, sql_tree
from kernelext._store.sql_guard import check_query
from kernelext.errors import QueryError, ReadOnlyError, SurfaceBreach

ESCAPE = (
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql("
    "'WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x'))"
)
ESCAPE_SEQUENCE = (
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql("
    "'SELECT setval(''events_seq'', 1000)'))"
)


def catalogue() -> list[tuple[str, str, str, list[str]]]:
    """(name, type, macro body, parameter types) of every function this DuckDB has."""
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            "SELECT function_name, function_type, coalesce(macro_definition, ''),"
            " parameter_types FROM duckdb_functions() ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    return [(str(n), str(t), str(m), [str(p) for p in (ps or [])]) for n, t, m, ps in rows]


CATALOGUE = catalogue()
NAMES = sorted({(name.lower(), kind) for name, kind, _, _ in CATALOGUE})


def call(name: str, kind: str) -> str:
    quoted = '"' + name.replace('"', '""') + '"'
    if kind in ("table", "table_macro", "pragma"):
        return f"SELECT * FROM {quoted}()"
    if kind == "window":
        return f"SELECT {quoted}() OVER () FROM range(1)"
    return f"SELECT {quoted}()"


def listed(name: str, kind: str) -> bool:
    if kind in ("table", "table_macro", "pragma"):
        return sql_allowed.allowed_table_function(name, allow_files=False)
    return sql_allowed.allowed_function(name, window=kind == "window")


@pytest.fixture
def duck(store_path: Path) -> Iterator[Store]:
    store = open_store(str(store_path))
    populate(store)
    yield store
    store.close()


# -- the escape of issue 19 ------------------------------------------------------------------
@pytest.mark.parametrize("query", [ESCAPE, ESCAPE_SEQUENCE])
def test_json_execute_serialized_sql_is_refused(duck: Store, query: str) -> None:
    before = ledger_state(duck)
    with pytest.raises(ReadOnlyError, match="json_execute_serialized_sql"):
        kx.sql(query, store=duck)
    assert ledger_state(duck) == before
    assert duck.read("SELECT count(*) FROM runs") == [(1,)]


def test_the_third_layer_catches_the_escape_if_the_list_allowed_it(
    duck: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong list: the query runs, and the transaction counter gives it away, loudly."""
    table, scalar = sql_tree.allowed_table_function, sql_tree.allowed_function
    escape = "json_execute_serialized_sql"
    monkeypatch.setattr(
        sql_tree,
        "allowed_table_function",
        lambda n, allow_files: n == escape or table(n, allow_files=allow_files),
    )
    monkeypatch.setattr(
        sql_tree,
        "allowed_function",
        lambda n, window=False: n == "json_serialize_sql" or scalar(n, window=window),
    )
    with pytest.raises(SurfaceBreach, match="transaction"):
        kx.sql(ESCAPE_SEQUENCE, store=duck)
    assert "SQL surface breach" in caplog.text
    monkeypatch.undo()
    kx.sql("SELECT count(*) FROM runs", store=duck)  # the store still reads normally


def test_the_third_layer_stays_quiet_for_ordinary_queries(duck: Store) -> None:
    for query in (
        "SELECT count(*) FROM runs",
        "SUMMARIZE events",
        "EXPLAIN ANALYZE SELECT count(*) FROM effects",
        "SELECT * FROM duckdb_functions() LIMIT 5",
        "SELECT * FROM pragma_table_info('runs')",
        "SHOW TABLES",
        "PIVOT effects ON status IN ('applied') USING count(*)",
        "SELECT id.upper() AS u, system.main.lower(id) AS l FROM runs",
        "SELECT run_id, sum((result->>'$.usage.total_tokens')::BIGINT) FROM effects WHERE tool"
        " LIKE 'openai:%' GROUP BY run_id",  # docs/frameworks.md, "Tokens so far"
        "SELECT status, count(*) FROM runs GROUP BY ALL",
        "SELECT list_aggregate([1, 2], 'sum') AS s, histogram(status) AS h FROM runs",
    ):
        kx.sql(query, store=duck)


# -- (a) everything not listed is refused ------------------------------------------------------
def test_every_function_the_list_does_not_name_is_refused() -> None:
    admitted, refused = [], []
    for name, kind in NAMES:
        query = call(name, kind)
        try:
            check_query(query)
        except ReadOnlyError as exc:
            assert str(exc).startswith("Refused ") and "is read-only and" in str(exc)
            refused.append(name)
            continue
        admitted.append(name)
        assert listed(name, kind), f"{query} passed the check but {name} is not listed"
    assert "json_execute_serialized_sql" in refused and "query" in refused
    assert len(admitted) > 400 and len(refused) > 100  # generous, but not everything


@pytest.mark.parametrize(
    "query",
    [
        "SELECT some_function_duckdb_adds_next_year(1)",
        "SELECT * FROM some_table_function_duckdb_adds()",
        "SELECT evil() OVER ()",
        "SELECT * FROM main.evil()",
        "SELECT main.nextval('events_seq')",
        "SELECT 'events_seq'.nextval()",
        "SELECT * FROM system.main.query('SELECT 1')",
        "SELECT list_aggregate([1], 'nextval')",
        "SELECT list_aggregate([1], (SELECT 'sum'))",
        "SELECT * FROM histogram_values(runs, status)",  # its body calls query_table
        "SELECT * FROM duckdb_logs",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM duckdb_extensions()",
        "SELECT * FROM read_duckdb('x.duckdb')",
        "SELECT setseed(0.5)",
        "SELECT write_log('x')",
        "SELECT pg_sleep(1)",
        # the escape wherever a query can stand
        "SUMMARIZE FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "DESCRIBE FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "SELECT (SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1')))",
        "SELECT 1 WHERE 1 IN (FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1')))",
        "SELECT * FROM json_each(json_serialize_sql('DELETE FROM runs'))",
        "FROM range(1), LATERAL json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "SELECT json_execute_serialized_sql('x')",
        "FROM list_value(1)",
        "SELECT [1].list_transform(x -> x.nextval())",
        "SELECT * FROM runs AT (VERSION => nextval('events_seq'))",
        "SELECT * REPLACE (nextval('events_seq') AS id) FROM events",
        "SELECT string_agg(kind, ',' ORDER BY nextval('events_seq')) FROM events",
    ],
)
def test_unknown_and_unreviewed_calls_are_refused(query: str) -> None:
    with pytest.raises(ReadOnlyError, match=r"^Refused .* is read-only and"):
        check_query(query)


# -- (b) nothing listed does harm ------------------------------------------------------------
DANGEROUS = re.compile(
    r"execute|query|sql|setval|nextval|currval|read_|write|copy|attach|install|load|"
    r"checkpoint|pragma_|secret|log|sleep|seed|export|import|glob|scan|file|extension"
)
# Each name the pattern matches, and why it is harmless anyway.
REVIEWED_MATCHES = {
    "current_query": "returns the text of the running query",
    "current_query_id": "returns a number",
    "log": "the logarithm",
    "log10": "the logarithm",
    "log2": "the logarithm",
    "ln": "the logarithm",
    "pragma_table_info": "reads the catalogue (columns of a table)",
    "pragma_show": "reads the catalogue (columns of a table)",
    "pragma_version": "reads the version",
    "pragma_platform": "reads the platform name",
    "pragma_database_size": "reads the size of the attached databases",
    "pragma_storage_info": "reads the storage layout of a table",
    "pragma_metadata_info": "reads the metadata blocks' use",
    "pragma_collations": "lists collations",
    "pragma_user_agent": "reads the user agent string",
    "parse_filename": "splits a string",
    "lgamma": "the log-gamma function",
    "current_catalog": "the name of the current database",
    "duckdb_temporary_files": "lists the spill files' names and sizes",
    "pg_conf_load_time": "a macro for current_timestamp",
}


def test_no_listed_name_looks_dangerous_unless_reviewed() -> None:
    every = sql_allowed.FUNCTIONS | sql_allowed.TABLE_FUNCTIONS | sql_allowed.WINDOW_FUNCTIONS
    flagged = {name for name in every if DANGEROUS.search(name)}
    assert flagged <= REVIEWED_MATCHES.keys(), sorted(flagged - REVIEWED_MATCHES.keys())
    for known in (
        "json_execute_serialized_sql",
        "json_serialize_sql",
        "json_serialize_plan",
        "query",
        "query_table",
        "nextval",
        "setval",
        "checkpoint",
        "force_checkpoint",
        "enable_logging",
        "truncate_duckdb_logs",
        "setseed",
        "write_log",
        "sleep_ms",
        "index_key",
        "duckdb_secrets",
        "which_secret",
        "read_duckdb",
        "python_map_function",
        "register_external_resource",
        "add_grammar_extension",
    ):
        assert known not in every, known


def test_every_listed_name_exists_or_is_the_parsers_own() -> None:
    known = {name.lower() for name, _, _, _ in CATALOGUE}
    parser_only = {"unnest"}  # a special function of the binder, in no catalogue
    every = sql_allowed.FUNCTIONS | sql_allowed.TABLE_FUNCTIONS | sql_allowed.FILE_READERS
    assert every - known <= parser_only, sorted(every - known - parser_only)


def test_every_listed_macro_expands_to_listed_calls_only() -> None:
    checked = 0
    for name, kind, body, _ in CATALOGUE:
        if kind not in ("macro", "table_macro") or not listed(name.lower(), kind):
            continue
        query = body if kind == "table_macro" else f"SELECT {body}"
        check_query(query)  # raises for a call that is not listed
        checked += 1
    assert checked > 90


def test_every_system_view_reads_listed_functions_or_is_refused() -> None:
    con = duckdb.connect(":memory:")
    views = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE internal").fetchall()
    con.close()
    for view, sql in views:
        body = re.sub(r"^CREATE TEMP VIEW [^ ]+ AS ", "", str(sql))
        if str(view).lower() in sql_allowed.REFUSED_VIEWS:
            with pytest.raises(ReadOnlyError):
                check_query(f"SELECT * FROM {view}")
            continue
        check_query(body)


TYPED = {
    "VARCHAR": "'a'",
    "BIGINT": "1",
    "INTEGER": "1",
    "DOUBLE": "1.5",
    "FLOAT": "1.5",
    "BOOLEAN": "true",
    "ANY": "1",
    "DATE": "DATE '2026-01-02'",
    "TIMESTAMP": "TIMESTAMP '2026-01-02 03:04:05'",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ '2026-01-02 03:04:05+00'",
    "INTERVAL": "INTERVAL 1 DAY",
    "JSON": "'{\"a\": [1, 2]}'::JSON",
    "BLOB": "'\\x01'::BLOB",
    "ANY[]": "[1, 2]",
    "BIGINT[]": "[1, 2]",
    "VARCHAR[]": "['a', 'b']",
    "DOUBLE[]": "[1.5, 2.5]",
}


def calls_to_run() -> list[str]:
    """A call with typed arguments for each overload of a listed function we can build."""
    queries = set()
    for name, kind, _, params in CATALOGUE:
        low = name.lower()
        if not listed(low, kind) or not re.fullmatch(r"[a-z_][a-z0-9_]*", low):
            continue
        if not all(p in TYPED for p in params):
            continue
        args = ", ".join(TYPED[p] for p in params)
        if kind in ("table", "table_macro"):
            queries.add(f"SELECT * FROM {low}({args}) LIMIT 5")
        elif kind == "window":
            queries.add(f"SELECT {low}({args}) OVER () FROM range(2)")
        elif kind == "aggregate":
            queries.add(f"SELECT {low}({args}) FROM range(2)")
        else:
            queries.add(f"SELECT {low}({args})")
    return sorted(queries)


def test_running_every_listed_function_changes_nothing(duck: Store) -> None:
    """Each one runs on the store (errors for odd arguments are fine); the third layer sees
    no transaction of its own, and every table, sequence and setting stays the same."""
    queries = calls_to_run()
    assert len(queries) > 300
    before = ledger_state(duck)
    ran = 0
    for query in queries:
        try:
            kx.sql(query, store=duck)
            ran += 1
        except SurfaceBreach:  # pragma: no cover - that would be the bug this test is for
            raise
        except (QueryError, ReadOnlyError):
            pass
    assert ran > 250
    assert ledger_state(duck) == before


# -- PostgreSQL -------------------------------------------------------------------------------
# Listed names that PostgreSQL marks volatile, and why each is harmless there.
POSTGRES_VOLATILE_REVIEWED: dict[str, str] = {
    "current_query": "returns the text of the running query",
    "random": "a random number; moves no shared state (setseed is not listed)",
    "gen_random_uuid": "a random UUID",
    "uuidv4": "a random UUID",
    "uuidv7": "a time-based UUID",
    "error": "fails the query",
    "to_char": "formatting",
    "clock_timestamp": "the time",
    "now": "the time",
    "timeofday": "the time",
}
POSTGRES_NEVER = re.compile(
    r"^(pg_read|pg_ls_|pg_stat_file|lo_|dblink|set_config|pg_advisory|pg_try_advisory|"
    r"pg_sleep|pg_terminate|pg_cancel|pg_reload|pg_notify|nextval|setval|txid_current$|"
    r"pg_current_xact_id$)"
)


@pytest.mark.postgres
def test_listed_names_are_pure_on_postgres(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url) as con:
        rows = con.execute("SELECT proname, provolatile FROM pg_proc").fetchall()
    volatility: dict[str, set[str]] = {}
    for name, kind in rows:
        volatility.setdefault(str(name).lower(), set()).add(str(kind))
    every = sql_allowed.FUNCTIONS | sql_allowed.TABLE_FUNCTIONS | sql_allowed.WINDOW_FUNCTIONS
    impure = {n for n in every & volatility.keys() if "v" in volatility[n]}
    assert impure <= POSTGRES_VOLATILE_REVIEWED.keys(), sorted(impure)
    dangerous = {n for n in volatility if POSTGRES_NEVER.match(n)}
    assert dangerous, "the pattern found none of PostgreSQL's server-side functions"
    for name in sorted(dangerous):
        with pytest.raises(ReadOnlyError):
            check_query(f"SELECT {name}(1)", strict_parse=True)
    assert not dangerous & every


@pytest.mark.postgres
def test_the_third_layer_catches_a_write_on_postgres(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """txid_current() takes a transaction id, as a write would: the check sees it."""
    store = open_store(postgres_url)
    try:
        scalar = sql_tree.allowed_function
        monkeypatch.setattr(
            sql_tree,
            "allowed_function",
            lambda n, window=False: n == "txid_current" or scalar(n, window=window),
        )
        with pytest.raises(SurfaceBreach, match="transaction id"):
            kx.sql("SELECT txid_current() AS x", store=store)
        monkeypatch.undo()
        assert kx.sql("SELECT count(*) AS n FROM runs", store=store)["n"].tolist() == [0]
    finally:
        store.close()
