"""The SQL surface is safe for queries nobody reviewed (issue 12, items 1-4).

``kx.sql``, ``%%ledger`` (an in-process IPython shell) and ``kernelext sql`` (a subprocess)
get the same table of attack queries on a real DuckDB store; ``kx.sql`` gets them on
PostgreSQL too. After all of them no file was created, no setting changed, no sequence
moved and no table row changed, and each path refused each query with the same message.
Parameters are bound, never pasted; files outside the store are read only when allowed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from IPython.core.error import UsageError
from support.sql_paths import (
    SECRET,
    cli_sql,
    close_shell,
    refused_on_every_path,
    shell_with_extension,
)

import kernelext as kx
from kernelext._store import Store, open_store
from kernelext._store.sql_guard import Checked
from kernelext._store.sql_refusals import REASONS
from kernelext.errors import QueryError, ReadOnlyError

WAIT = 60
EVIL = "O'Brien'); DROP TABLE runs; --\" ; DELETE FROM events"

# {out}: a folder outside the store (targets of writes); {secret}: a file outside the store.
ATTACKS: list[str] = [
    # EXPLAIN / EXPLAIN ANALYZE wrappers, comment and whitespace variants
    "/**/EXPLAIN ANALYZE COPY (SELECT * FROM effects) TO '{out}/explain.csv'",
    "/**/EXPLAIN ANALYZE SET memory_limit='4MB'",
    "/**/EXPLAIN ANALYZE INSTALL sqlite",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO 'relative.csv'",
    "explain\tanalyse\n  copy effects to '{out}/tabs.csv'",
    "-- a note\nEXPLAIN ANALYZE DELETE FROM runs",
    "EXPLAIN (ANALYZE) DELETE FROM events",
    "EXPLAIN (ANALYZE, FORMAT json) INSERT INTO events (run_id, occurred_at, kind)"
    " VALUES ('x', now(), 'forged')",
    "EXPLAIN UPDATE runs SET status = 'completed'",
    "EXPLAIN ANALYZE SELECT nextval('events_seq')",
    "/* a */ /* b */ CoPy effects TO '{out}/mixed.csv'",
    # sequences
    "SELECT \"nextval\"('events_seq')",
    "SELECT nextval/**/('events_seq')",
    "SELECT 'events_seq'.nextval()",
    "SELECT main.nextval('events_seq')",
    "SELECT setval('events_seq', 1000)",
    "SELECT list_transform([1, 2], x -> nextval('events_seq'))",
    "SELECT * FROM (SELECT nextval('events_seq') AS n) AS t",
    # data-modifying CTEs
    "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
    "WITH x AS (UPDATE effects SET status = 'applied' RETURNING *) SELECT count(*) FROM x",
    "WITH x AS (INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'forged')"
    " RETURNING *) SELECT * FROM x",
    "SELECT * FROM (WITH x AS (DELETE FROM events RETURNING id) SELECT id FROM x) AS y",
    # SQL text run by the database itself (json_execute_serialized_sql: issue 19)
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql("
    "'WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x'))",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql("
    "'SELECT setval(''events_seq'', 1000)'))",
    "SELECT count(*) FROM runs, json_execute_serialized_sql(json_serialize_sql("
    "'SELECT * FROM runs'))",
    "SELECT * FROM query('DELETE FROM runs')",
    "SELECT * FROM query('SELECT * FROM runs')",
    "SELECT * FROM query_table('runs')",
    # settings
    "PRAGMA enable_profiling",
    "PRAGMA threads=4",
    "SET memory_limit = '4MB'",
    "SET threads TO 4",
    "RESET threads",
    "SET VARIABLE x = 1",
    "USE memory",
    # CALL, CHECKPOINT, server functions
    "CALL pragma_version()",
    "CHECKPOINT",
    "FORCE CHECKPOINT",
    "SELECT * FROM checkpoint()",
    "SELECT pg_read_file('{secret}')",
    "SELECT pg_advisory_lock(1)",
    "SELECT set_config('work_mem', '1MB', false)",
    # other databases, extensions, file writes
    "ATTACH '{out}/other.duckdb' AS other",
    "DETACH other",
    "COPY effects TO '{out}/leak.csv'",
    "COPY (SELECT * FROM runs) TO '{out}/leak.parquet' (FORMAT parquet)",
    "COPY runs FROM '{secret}'",
    "EXPORT DATABASE '{out}/export'",
    "INSTALL sqlite",
    "FORCE INSTALL httpfs",
    "LOAD sqlite",
    "UPDATE EXTENSIONS",
    "CREATE SECRET leak (TYPE s3, KEY_ID 'x', SECRET 'y')",
    # reading files outside the store
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_csv_auto('{secret}')",
    "SELECT * FROM read_blob('{secret}')",
    "SELECT * FROM read_json_auto('{secret}')",
    "SELECT * FROM read_parquet('{out}/*.parquet')",
    "SELECT * FROM glob('{out}/*')",
    "SELECT * FROM '{secret}'",
    "FROM '{secret}'",
    "SELECT r.id FROM runs AS r JOIN read_csv('{secret}') AS s ON true -- trailing",
    # plain writes and multi-statement strings
    "DELETE FROM runs",
    "UPDATE runs SET status = 'completed'",
    "INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'forged')",
    "DROP TABLE events",
    "CREATE TABLE notes AS SELECT 1 AS x",
    "CREATE TEMP TABLE notes AS SELECT 1 AS x",
    "CREATE MACRO bump() AS nextval('events_seq')",
    "ALTER TABLE runs ADD COLUMN x INTEGER",
    "MERGE INTO runs USING (SELECT 'x' AS id) AS s ON runs.id = s.id WHEN MATCHED THEN DELETE",
    "BEGIN TRANSACTION",
    "COMMIT",
    "VACUUM",
    "PREPARE p AS DELETE FROM runs",
    "PIVOT runs ON status",
    "SELECT 1; SELECT 2",
    "SELECT count(*) FROM runs; DELETE FROM runs",
    "DELETE FROM runs; SELECT 1",
    "SELECT 1;\n/* hidden */ DROP TABLE runs",
    "SELECT 1; COMMIT; DELETE FROM runs",
    "",
    "  \n\t-- only\n/* comments */ ;",
]

LEGIT = [
    "SELECT tool, status, count(*) AS n FROM effects GROUP BY ALL ORDER BY ALL",
    "SELECT run_id, count(*) AS n FROM effects GROUP BY run_id ORDER BY run_id",
    "SELECT key, row_number() OVER (PARTITION BY run_id ORDER BY call_ordinal) AS nr FROM effects",
    "WITH done AS (SELECT * FROM runs WHERE status = 'completed') SELECT count(*) AS n FROM done",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "SELECT id FROM runs UNION ALL SELECT run_id FROM effects",
    "EXPLAIN SELECT * FROM effects",
    "EXPLAIN ANALYZE SELECT count(*) FROM events",
    "EXPLAIN (FORMAT json) SELECT 1",
    "/* why */ SELECT count(*) AS n FROM runs; -- trailing",
    "DESCRIBE runs",
    "SUMMARIZE effects",
    "SHOW TABLES",
    "FROM runs",
    "VALUES (1), (2)",
    "PIVOT effects ON status IN ('applied') USING count(*)",
    "SELECT * FROM duckdb_settings() WHERE name = 'threads'",
    "SELECT sequence_name, last_value FROM duckdb_sequences()",
    "SELECT * FROM pragma_table_info('runs')",
]
LEGIT_POSTGRES = [
    "SELECT tool, status, count(*) AS n FROM effects GROUP BY tool, status",
    "SELECT key, row_number() OVER (PARTITION BY run_id ORDER BY call_ordinal) AS nr FROM effects",
    "WITH done AS (SELECT * FROM runs WHERE status = 'completed') SELECT count(*) AS n FROM done",
    "EXPLAIN SELECT * FROM effects",
    "SELECT 1 AS one;",
]


def attacks(out: Path, secret: Path) -> list[str]:
    return [a.format(out=out, secret=secret) for a in ATTACKS]


# -- fixtures ---------------------------------------------------------------------------------
def recipient(person: str) -> str:
    """The re-check of a recorded recipient (module-level: resolvable by name)."""
    return person


def populate(store: Store) -> None:
    """A completed run with effects, steps, snapshots, a fact and events."""

    @kx.effect
    def send(to: str, *, idempotency_key: str | None = None) -> dict[str, str]:
        return {"sent": to}

    @kx.agent(name="sql-safety-mail")
    def mail(run: kx.Run, people: list[str]) -> None:
        for person in run.steps(people, key=lambda p: p):
            run.fact("recipient:" + person, person, check=recipient, args=(person,))
            send(person)
            run.state["sent"] = run.state.get("sent", 0) + 1

    assert mail.start(["ann", "bo"], run_id="mail-1", store=store).wait(WAIT) == "completed"


@pytest.fixture
def duck(store_path: Path, places: dict[str, Path]) -> Iterator[Store]:
    store = open_store(str(store_path))
    populate(store)
    yield store
    store.close()


def ledger_state(store: Store) -> dict[str, Any]:
    """Every table's rows (a digest each), the sequences and the settings, by normal reads."""
    duckdb = store.backend.dialect == "duckdb"
    tables = sorted(
        r[0]
        for r in store.read(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
    )
    state: dict[str, Any] = {}
    for table in tables:
        rows = sorted(
            json.dumps(row, default=str) for row in store.read(f'SELECT * FROM "{table}"')
        )
        state[table] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    if duckdb:
        state["sequences"] = store.read(
            "SELECT sequence_name, last_value FROM duckdb_sequences() ORDER BY 1"
        )
        state["settings"] = store.read("SELECT name, value FROM duckdb_settings() ORDER BY 1")
    else:
        state["sequences"] = store.read("SELECT last_value, is_called FROM events_seq")
        state["settings"] = store.read("SELECT name, setting FROM pg_settings ORDER BY 1")
    return state


def files(root: Path, store_path: Path | None) -> list[str]:
    """Every file under ``root``, except the store's own (file, WAL, journal, lock)."""
    found = []
    for path in sorted(root.rglob("*")):
        if store_path is not None and path.name.startswith(store_path.name):
            continue
        found.append(str(path.relative_to(root)))
    return found


def assert_refused_the_same(messages: dict[str, str]) -> None:
    """Every query was refused, each with the one message shape, the same on every path."""
    for query, message in messages.items():
        assert message.startswith("Refused "), (query, message)
        assert "is read-only and" in message, (query, message)
        assert any(instead in message for _, instead in REASONS.values()), (query, message)
        assert SECRET not in message


# -- kx.sql ----------------------------------------------------------------------------------
@pytest.mark.parametrize("attack", ATTACKS)
def test_kx_sql_refuses_each_attack(
    duck: Store, places: dict[str, Path], store_path: Path, attack: str
) -> None:
    before, listed = ledger_state(duck), files(places["root"], store_path)
    query = attack.format(out=places["out"], secret=places["secret"])
    with pytest.raises(ReadOnlyError) as refused:
        kx.sql(query, store=duck)
    assert_refused_the_same({query: str(refused.value)})
    assert ledger_state(duck) == before
    assert files(places["root"], store_path) == listed
    assert duck.read("SELECT count(*) FROM runs") == [(1,)]


def test_all_paths_refuse_every_attack_with_one_message_and_change_nothing(
    store_path: Path, places: dict[str, Path]
) -> None:
    """kx.sql, %%ledger in an in-process shell, and ``kernelext sql`` in a subprocess."""
    queries = attacks(places["out"], places["secret"])
    store = open_store(str(store_path))
    populate(store)
    before, listed = ledger_state(store), files(places["root"], store_path)
    by_api, by_magic, by_cli = refused_on_every_path(store, store_path, places["cwd"], queries)
    assert_refused_the_same(by_api)
    assert by_magic == by_api
    assert by_cli == by_api
    store = open_store(str(store_path))
    try:
        assert ledger_state(store) == before
    finally:
        store.close()
    assert files(places["root"], store_path) == listed
    for target in ("explain.csv", "leak.csv", "leak.parquet", "other.duckdb", "export"):
        assert not (places["out"] / target).exists()
    assert not (places["cwd"] / "relative.csv").exists()


# -- by construction: what a wrong check would let through, the database refuses -------------
BYPASSED = [
    "COPY effects TO '{out}/bypass.csv'",
    "EXPORT DATABASE '{out}/bypass'",
    "ATTACH '{out}/bypass.duckdb' AS b",
    "INSTALL sqlite",
    "LOAD sqlite",
    "SELECT * FROM read_text('{secret}')",
    "SELECT nextval('events_seq')",
    "SELECT setval('events_seq', 1000)",
    "SET memory_limit = '4MB'",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "PRAGMA enable_profiling",
    "DELETE FROM runs",
    "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
    "CREATE TABLE notes AS SELECT 1 AS x",
    "CREATE SEQUENCE s2",
]


def test_the_database_refuses_what_a_wrong_check_would_let_through(
    duck: Store, places: dict[str, Path], store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernelext._store.duckdb.user_queries as backend

    monkeypatch.setattr(
        backend, "check_query", lambda sql, **_: Checked(sql, frozenset(), reads_files=False)
    )
    before, listed = ledger_state(duck), files(places["root"], store_path)
    for attack in BYPASSED:
        query = attack.format(out=places["out"], secret=places["secret"])
        with pytest.raises(ReadOnlyError, match=r"^Refused .* is read-only"):
            duck.read_arrow(query)
    with pytest.raises(QueryError) as raised:  # replacement scans of files are off too
        duck.read_arrow(f"SELECT * FROM '{places['secret']}'")
    assert isinstance(raised.value.__cause__, duckdb.CatalogException)
    assert ledger_state(duck) == before
    assert files(places["root"], store_path) == listed
    monkeypatch.undo()
    locked = kx.sql(
        "SELECT current_setting('enable_external_access') AS files,"
        " current_setting('lock_configuration') AS locked",
        store=duck,
    )
    assert locked.to_dict("records") == [{"files": False, "locked": True}]
    duck.record_event(None, "probe")  # the store still writes normally afterwards
    assert duck.read("SELECT count(*) FROM events WHERE kind = 'probe'") == [(1,)]


# -- what still works ---------------------------------------------------------------------------
@pytest.mark.parametrize("query", LEGIT)
def test_legit_queries_still_work(duck: Store, query: str) -> None:
    before = ledger_state(duck)
    assert kx.sql(query, store=duck) is not None
    assert ledger_state(duck) == before


def test_explain_of_a_select_and_window_functions_give_results(duck: Store) -> None:
    plan = kx.sql("/* c */ EXPLAIN SELECT * FROM effects", store=duck)
    assert "EFFECTS" in " ".join(map(str, plan.iloc[0].tolist())).upper()
    ranked = kx.sql(
        "SELECT step_key, rank() OVER (ORDER BY step_key) AS r FROM effects ORDER BY r",
        store=duck,
    )
    assert ranked["r"].tolist() == [1, 2] and ranked["step_key"].tolist() == ["ann", "bo"]


# -- parameters --------------------------------------------------------------------------------
def test_parameters_round_trip_as_data(duck: Store) -> None:
    positional = kx.sql("SELECT ? AS v, ? AS n", [EVIL, 7], store=duck)
    assert positional.to_dict("records") == [{"v": EVIL, "n": 7}]
    named = kx.sql("SELECT $v AS v", {"v": EVIL}, store=duck)
    assert named["v"].tolist() == [EVIL]
    runs = kx.sql(
        "SELECT id FROM runs WHERE id = $id OR id = $evil",
        {"id": "mail-1", "evil": EVIL},
        store=duck,
    )
    assert runs["id"].tolist() == ["mail-1"]
    assert kx.sql("SELECT count(*) AS n FROM runs WHERE id = ?", [EVIL], store=duck)[
        "n"
    ].tolist() == [0]
    assert duck.read("SELECT count(*) FROM runs") == [(1,)]
    with pytest.raises(TypeError, match="sequence"):
        kx.sql("SELECT ? AS v", "abc", store=duck)


def test_ledger_binds_notebook_variables_as_parameters(store_path: Path) -> None:
    store = open_store(str(store_path))
    populate(store)
    store.close()
    shell = shell_with_extension(store_path)
    try:
        shell.user_ns.update(evil=EVIL, run_id="mail-1")
        result = shell.run_cell("%%ledger\nSELECT {evil} AS v, 'a {not_bound}' AS s -- {nor_this}")
        assert result.success, result.error_in_exec
        assert result.result.to_dict("records") == [{"v": EVIL, "s": "a {not_bound}"}]
        line = shell.run_cell("%ledger SELECT count(*) AS n FROM runs WHERE id = {run_id}")
        assert line.result["n"].tolist() == [1]  # IPython did not paste it into the line
        assert shell.run_cell("%%ledger -o out\nSELECT {evil} AS v").success
        assert shell.user_ns["out"]["v"].tolist() == [EVIL]
        quoted = shell.run_cell("%%ledger\nSELECT * FROM runs WHERE id = '{run_id}'")
        assert isinstance(quoted.error_in_exec, UsageError)
        assert "without quotes" in str(quoted.error_in_exec)
        missing = shell.run_cell("%%ledger\nSELECT {nobody} AS v")
        assert isinstance(missing.error_in_exec, UsageError)
        assert "nobody" in str(missing.error_in_exec)
        assert shell.run_cell("%ledger SELECT count(*) AS n FROM runs").result["n"].tolist() == [1]
    finally:
        close_shell(shell)


def test_cli_binds_params(store_path: Path, places: dict[str, Path]) -> None:
    store = open_store(str(store_path))
    populate(store)
    store.close()
    proc = cli_sql(
        store_path,
        places["cwd"],
        "SELECT $v AS v, count(*) AS n FROM runs WHERE id = $run",
        "--param",
        f"v={EVIL}",
        "--param",
        "run=mail-1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"v": EVIL, "n": 1}]
    bad = cli_sql(store_path, places["cwd"], "SELECT 1", "--param", "no-equals-sign")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr


# -- files outside the store ----------------------------------------------------------------------
def test_files_are_read_only_when_allowed(duck: Store, places: dict[str, Path]) -> None:
    data = places["out"] / "prices.csv"
    data.write_text("id,price\nmail-1,12\n")
    joined = f"SELECT r.id, d.price FROM runs AS r JOIN read_csv('{data}') AS d USING (id)"
    with pytest.raises(ReadOnlyError, match="allow_files=True"):
        kx.sql(joined, store=duck)
    assert kx.sql(joined, allow_files=True, store=duck).to_dict("records") == [
        {"id": "mail-1", "price": 12}
    ]
    scan = kx.sql(f"SELECT count(*) AS n FROM '{data}'", allow_files=True, store=duck)
    assert scan["n"].tolist() == [1]
    by_param = kx.sql(
        "SELECT * FROM read_csv($path) WHERE id = $id",
        {"path": str(data), "id": "mail-1"},
        allow_files=True,
        store=duck,
    )
    assert by_param["price"].tolist() == [12]
    for still_refused in (
        f"COPY runs TO '{places['out']}/copy.csv'",
        "SELECT nextval('events_seq')",
        "INSTALL sqlite",
        f"ATTACH '{places['out']}/x.duckdb' AS x",
    ):
        with pytest.raises(ReadOnlyError):
            kx.sql(still_refused, allow_files=True, store=duck)
    assert not (places["out"] / "copy.csv").exists()
    locked = kx.sql("SELECT current_setting('enable_external_access') AS e", store=duck)
    assert locked["e"].tolist() == [False]  # the store's own instance never opened up


def test_files_through_config_and_cli_flag(store_path: Path, places: dict[str, Path]) -> None:
    store = open_store(str(store_path))
    populate(store)
    store.close()
    query = f"SELECT * FROM read_text('{places['secret']}')"
    shell = shell_with_extension(store_path)
    try:
        refused = shell.run_cell("%%ledger\n" + query)
        assert isinstance(refused.error_in_exec, UsageError)
        assert "%config Kernelext.allow_files = True" in str(refused.error_in_exec)
        shell.run_line_magic("config", "Kernelext.allow_files = True")
        shell.user_ns["path"] = str(places["secret"])
        allowed = shell.run_cell("%%ledger\nSELECT content FROM read_text({path})")
        assert allowed.success, allowed.error_in_exec
        assert SECRET in allowed.result["content"].tolist()[0]
    finally:
        close_shell(shell)
    refused_cli = cli_sql(store_path, places["cwd"], query)
    assert refused_cli.returncode == 2 and "--allow-files" in refused_cli.stderr
    allowed_cli = cli_sql(store_path, places["cwd"], query, "--allow-files", "--json")
    assert allowed_cli.returncode == 0, allowed_cli.stderr
    assert SECRET in json.loads(allowed_cli.stdout)[0]["content"]


# -- PostgreSQL -----------------------------------------------------------------------------------
@pytest.fixture
def pg(postgres_url: str, places: dict[str, Path]) -> Iterator[Store]:
    store = open_store(postgres_url)
    try:
        populate(store)
        yield store
    finally:
        store.close()


@pytest.mark.postgres
def test_kx_sql_on_postgres_refuses_every_attack(pg: Store, places: dict[str, Path]) -> None:
    before, listed = ledger_state(pg), files(places["root"], None)
    messages = {}
    for query in attacks(places["out"], places["secret"]):
        with pytest.raises(ReadOnlyError) as refused:
            kx.sql(query, store=pg)
        messages[query] = str(refused.value)
    assert_refused_the_same(messages)
    assert ledger_state(pg) == before
    assert files(places["root"], None) == listed
    for query in LEGIT_POSTGRES:
        assert kx.sql(query, store=pg) is not None, query
    assert kx.sql("SELECT ? AS v", [EVIL], store=pg)["v"].tolist() == [EVIL]
    assert kx.sql("SELECT $v AS v, '%' AS pct", {"v": EVIL}, store=pg)["v"].tolist() == [EVIL]
    one = kx.sql("SELECT count(*) AS n FROM runs WHERE id = $1", ["mail-1"], store=pg)
    assert one["n"].tolist() == [1]
    assert pg.read("SELECT count(*) FROM runs") == [(1,)]
    with pytest.raises(ReadOnlyError, match="PostgreSQL store"):
        kx.sql(f"SELECT * FROM read_csv('{places['secret']}')", allow_files=True, store=pg)


@pytest.fixture
def pg_reader(pg: Store, postgres_url: str) -> Iterator[Store]:
    """The role kernelext_reader (SELECT only), which this login may take."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("CREATE ROLE kernelext_reader NOLOGIN")
        con.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO kernelext_reader")
        con.execute("GRANT kernelext_reader TO CURRENT_USER")
    try:
        yield pg
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as con:
            con.execute("DROP OWNED BY kernelext_reader")
            con.execute("DROP ROLE kernelext_reader")


@pytest.mark.postgres
def test_postgres_refuses_what_a_wrong_check_would_let_through(
    pg_reader: Store, places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernelext._store.postgres_backend as backend

    assert kx.sql("SELECT current_user AS u", store=pg_reader)["u"].tolist() == ["kernelext_reader"]
    monkeypatch.setattr(
        backend, "check_query", lambda sql, **_: Checked(sql, frozenset(), reads_files=False)
    )
    before = ledger_state(pg_reader)
    for query in (
        "DELETE FROM runs",
        "SELECT nextval('events_seq')",
        "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
        f"COPY (SELECT * FROM runs) TO '{places['out']}/pg.csv'",
        f"SELECT pg_read_file('{places['secret']}')",
        "SELECT 1; DELETE FROM runs",
    ):
        with pytest.raises(ReadOnlyError, match=r"^Refused .* is read-only"):
            pg_reader.read_arrow(query)
    pg_reader.read_arrow("SELECT pg_advisory_lock(4711)")
    pg_reader.read_arrow("SELECT set_config('statement_timeout', '1', false)")
    monkeypatch.undo()
    held = pg_reader.read("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    assert held == [(0,)]  # released after the query
    assert ledger_state(pg_reader) == before
    assert not (places["out"] / "pg.csv").exists()


# -- one message -----------------------------------------------------------------------------------
def test_refusal_says_what_why_and_what_to_do(duck: Store) -> None:
    cases: dict[str, tuple[str, ...]] = {
        "DELETE FROM runs": ("a DELETE statement", "kx.reconcile"),
        "/**/EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'": ("EXPLAIN ANALYZE of a COPY", "to_csv"),
        "SELECT nextval('events_seq')": ("nextval()", "sequence"),
        "SELECT * FROM read_text('x')": ("read_text()", "allow_files=True", "--allow-files"),
        "SET threads = 4": ("a SET statement", "duckdb_settings()"),
        "SELECT 1; SELECT 2": ("2 statements", "one at a time"),
        "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x": ("DELETE inside a query",),
    }
    for query, parts in cases.items():
        with pytest.raises(ReadOnlyError) as refused:
            kx.sql(query, store=duck)
        for part in (*parts, "read-only"):
            assert part in str(refused.value), (query, str(refused.value))


def test_the_guard_reports_tables_and_file_reads() -> None:
    from kernelext._store import sql_guard

    checked = sql_guard.check_query("SELECT * FROM runs r JOIN main.effects e ON r.id = e.run_id")
    assert checked.tables == frozenset({"runs", "effects"}) and not checked.reads_files
    files_query = sql_guard.check_query("FROM read_csv('a.csv')", allow_files=True)
    assert files_query.reads_files
    assert callable(getattr(sql_guard, "runtime_refusal", None))
