"""Attacks on the SQL surface built from parts: a dangerous call, a wrapper, a spelling.

Hypothesis composes them and checks that ``kx.sql`` refuses each one and that every
table, sequence and setting of the store stays byte-identical; a fixed sample goes
through all three paths (``kx.sql``, ``%%ledger`` in an in-process shell, ``kernelext
sql`` in a subprocess, with ``--param`` and notebook variables carrying the SQL text).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from test_sql_safety import (
    SECRET,
    assert_refused_the_same,
    cli_sql,
    close_shell,
    files,
    ledger_state,
    populate,
    run_in_shell,
    shell_with_extension,
)

import kernelext as kx
from kernelext.errors import ReadOnlyError
from kernelext.store import open_store

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
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """As in test_sql_safety: a folder outside the store with a secret, and a cwd."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text(f"id\n{SECRET}\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return {"root": tmp_path, "out": out, "secret": out / "secret.txt", "cwd": cwd}


@pytest.fixture
def populated(store_path: Path, places: dict[str, Path]) -> Path:
    store = open_store(str(store_path))
    populate(store)
    store.close()
    return store_path


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
        except duckdb.ParserException:
            pass  # not SQL at all: nothing ran
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
    by_api = {}
    for query in queries:
        with pytest.raises(ReadOnlyError) as refused:
            kx.sql(query, store=store)
        by_api[query] = str(refused.value)
    store.close()
    by_magic = run_in_shell(populated, queries)
    by_cli = {}
    for query in queries:
        proc = cli_sql(populated, places["cwd"], query)
        assert proc.returncode == 2, (query, proc.stdout, proc.stderr)
        by_cli[query] = proc.stderr.strip().removeprefix("kernelext: ")
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
