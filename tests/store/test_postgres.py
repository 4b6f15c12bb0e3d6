"""The PostgreSQL store against a real server (tests/support/postgres.py starts one).

The conformance suite runs on PostgreSQL from tests/store/test_store_conformance.py. Here:
what is specific to a server backend (SQL translation, read-only ``kx.sql``,
migrations and sweeps racing between processes), stops across processes, the
stop storm on both backends, crash injection, and many processes sharing one
store while others stop, resume and sweep. The stop storm and the other
engine-level tests run here too, from tests/test_postgres_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, read_log
from support.live import wait_until
from support.postgres import PostgresServer

import kernelext as kx
from kernelext._core.lifecycle.run import engine_of
from kernelext._store import Store, open_store
from kernelext._store.postgres_backend import advisory_key, mask_password, translate
from kernelext._store.schema import MIGRATIONS
from kernelext.errors import ReadOnlyError, StoreError

pytestmark = pytest.mark.postgres

TESTS_DIR = Path(__file__).resolve().parents[1]
WORKER = TESTS_DIR / "support" / "pg_worker.py"


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[Store]:
    store = open_store(postgres_url)
    try:
        yield store
    finally:
        store.close()


def python(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=TESTS_DIR,
    )


# -- the backend ----------------------------------------------------------------------------
def test_translation_leaves_literals_names_and_comments_alone() -> None:
    sql = "SELECT '?', \"a?\", x FROM t -- why?\nWHERE y = ? AND z LIKE 'a%' /* ? */"
    assert translate(sql) == (
        "SELECT '?', \"a?\", x FROM t -- why?\nWHERE y = %s AND z LIKE 'a%%' /* ? */"
    )
    assert translate("CREATE TABLE b (data BLOB, blobby TEXT)") == (
        "CREATE TABLE b (data BYTEA, blobby TEXT)"
    )
    assert translate("SELECT 'BLOB' FROM x") == "SELECT 'BLOB' FROM x"  # only DDL is mapped


def test_location_masks_the_password() -> None:
    assert mask_password("postgresql://ann:s3cret@db.example:5433/kx") == (
        "postgresql://ann:***@db.example:5433/kx"
    )
    assert mask_password("postgresql://ann@db/kx") == "postgresql://ann@db/kx"
    assert mask_password("postgresql://db/kx?user=ann&password=s3cret&sslmode=require") == (
        "postgresql://db/kx?user=ann&password=***&sslmode=require"
    )


def test_open_store_with_a_url_uses_postgres_and_hides_the_password(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    with_password = postgres_url.replace("://kx@", "://kx:not-needed@")
    store = open_store(with_password)
    try:
        assert store.backend.dialect == "postgres"
        assert "not-needed" not in store.location and ":***@" in store.location
        assert store.schema_version() == MIGRATIONS[-1].version
    finally:
        store.close()


def test_unreachable_server_is_a_clear_store_error(postgres_server: PostgresServer) -> None:
    url = f"postgresql://kx:pw@127.0.0.1:{postgres_server.port}/no_such_database"
    with pytest.raises(StoreError, match="Cannot connect") as info:
        open_store(url)
    assert "pw@" not in str(info.value)


def test_kx_sql_is_read_only_and_returns_a_dataframe(pg_store: Store) -> None:
    pg_store.create_run("r1", "agent", args='{"a": 1}')
    frame = kx.sql("SELECT id, status, created_at FROM runs", store=pg_store)
    assert list(frame.columns) == ["id", "status", "created_at"]
    assert frame.to_dict("records")[0]["id"] == "r1"
    table = pg_store.backend.read_arrow(
        "SELECT key, intent_at, resumable FROM effects WHERE run_id = 'nobody'"
    )
    assert [str(t) for t in table.schema.types] == ["string", "timestamp[us]", "bool"]
    for statement in (
        "SELECT * FROM runs FOR UPDATE",
        "SELECT nextval('events_seq')",
        "WITH gone AS (DELETE FROM runs RETURNING id) SELECT * FROM gone",
        "select 1; commit; delete from runs",
    ):
        with pytest.raises(ReadOnlyError, match="read-only"):
            pg_store.backend.read_arrow(statement)
    assert pg_store.read("SELECT count(*) FROM runs") == [(1,)]


def test_large_payloads_stay_in_the_database(pg_store: Store, tmp_path: Path) -> None:
    """A resume on another host must read them: no side files next to a URL."""

    @kx.agent(name="pg-big-state")
    def big(run: kx.Run) -> None:
        for _ in run.steps(range(1)):
            run.state["blob"] = os.urandom(3 << 20).hex()

    handle = big.start(run_id="big", store=pg_store)
    assert handle.wait(60) == "completed", handle.error
    assert pg_store.read("SELECT DISTINCT location FROM blobs") == [("inline",)]
    assert not list(Path.cwd().glob("postgresql*"))


def test_migrations_from_many_processes_at_once(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    code = (
        "import sys; from kernelext._store import open_store\n"
        "s = open_store(sys.argv[1]); print(s.schema_version()); s.close()"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6
    assert set(outs) == {str(MIGRATIONS[-1].version)}
    store = open_store(url)
    try:
        versions = [r[0] for r in store.read("SELECT version FROM schema_version ORDER BY 1")]
        assert versions == [m.version for m in MIGRATIONS]
    finally:
        store.close()


def test_advisory_lock_has_one_holder_across_processes(pg_store: Store, postgres_url: str) -> None:
    holder = (
        "import sys, time; from kernelext._store import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "with s.try_advisory_lock('kernelext:sweep') as mine:\n"
        "    print('held' if mine else 'refused', flush=True); sys.stdin.readline()\n"
        "s.close()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder, postgres_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            assert proc.stdout.readline().strip() == "held"
            with pg_store.try_advisory_lock("kernelext:sweep") as mine:
                assert mine is False
            result = kx.sweep(store=pg_store)
            assert result.busy and result.expired == []
            assert "another process is sweeping" in result.text()
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(60) == 0
        finally:
            proc.kill()
    with pg_store.try_advisory_lock("kernelext:sweep") as mine:
        assert mine is True
    assert kx.sweep(store=pg_store).busy is False
    assert advisory_key("a") != advisory_key("b")


def test_a_dropped_connection_is_replaced(pg_store: Store, postgres_url: str) -> None:
    """A server restart or an admin kill: the next write and read reconnect by themselves."""
    pg_store.create_run("before", "agent")
    assert kx.sql("SELECT count(*) AS n FROM runs", store=pg_store)["n"].tolist() == [1]
    with open_store(postgres_url) as other:
        killed = other.read(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name ="
            " 'kernelext' AND pid <> pg_backend_pid() AND datname = current_database()"
        )
    assert len(killed) >= 3  # the other store's writer, our writer and our reader
    assert pg_store.create_run("after", "agent") is True
    assert [r["id"] for r in pg_store.list_runs()] == ["before", "after"]
    assert kx.sql("SELECT count(*) AS n FROM runs", store=pg_store)["n"].tolist() == [2]


def test_env_var_selects_postgres_in_a_fresh_process(postgres_url: str) -> None:
    proc = python(
        "-c",
        "import kernelext as kx; s = kx.open_store(); print(s.backend.dialect, s.location)",
        env={"KERNELEXT_STORE": postgres_url},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["postgres", postgres_url]


# -- stops ---------------------------------------------------------------------------------
STEP_2_BEGAN = threading.Event()
STEP_2_GATE = threading.Event()  # step 2 lasts until the test sets it


@kx.agent(name="pg-slow-steps")
def slow_steps(run: kx.Run, steps: int, pause: float) -> None:
    for step in run.steps(range(steps)):
        run.state["last"] = step
        if step == 2:
            STEP_2_BEGAN.set()
            STEP_2_GATE.wait(60)
        time.sleep(pause)


def test_kernelext_stop_from_another_process_is_honoured_within_one_step(
    pg_store: Store, postgres_url: str
) -> None:
    STEP_2_BEGAN.clear()
    STEP_2_GATE.clear()
    handle = slow_steps.start(30, 0.3, run_id="remote-stop", store=pg_store)
    try:
        assert STEP_2_BEGAN.wait(60)
        proc = python("-m", "kernelext", "stop", "remote-stop", "--store", postgres_url, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "stopping"
        # Step 2 is still running (held): the run's monitor sees the stop recorded by the
        # other process; the step then ends, and the stop lands at that boundary.
        wait_until(lambda: engine_of(handle.run).stop_event.is_set(), "the run to see the stop")
    finally:
        STEP_2_GATE.set()
    assert handle.wait(60) == "suspended"
    events = pg_store.events("remote-stop")
    request = next(e for e in events if e["kind"] == "stop_requested")
    suspended = next(e for e in events if e["kind"] == "suspended")
    assert request["source"] == "cli" and suspended["source"] == "cli"
    assert request["actor"] != events[0]["actor"]  # recorded by the other process
    done_after = [
        s
        for s in pg_store.steps("remote-stop")
        if s["status"] == "completed" and s["ended_at"] > request["occurred_at"]
    ]
    assert len(done_after) == 1  # step 2, the one running when the stop was asked
    assert pg_store.get_run("remote-stop")["completed_steps"] == 3
    shown = python("-m", "kernelext", "show", "remote-stop", "--json", "--store", postgres_url)
    assert shown.returncode == 3, shown.stderr  # suspended
    assert json.loads(shown.stdout)["run"]["stop_source"] == "cli"
    counted = python(
        "-m",
        "kernelext",
        "sql",
        "SELECT count(*) AS n FROM steps",
        "--json",
        "--store",
        postgres_url,
    )
    assert counted.returncode == 0 and json.loads(counted.stdout)[0]["n"] >= 2


# -- crash injection on PostgreSQL ------------------------------------------------------------
@pytest.mark.crash
@pytest.mark.timeout(600)
def test_sigkill_anywhere_then_resume_on_postgres(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    import random

    from crash import WorkerPool
    from support.engine_crash import (
        ENGINE_WORKER,
        KillTally,
        final_state,
        reference_state,
        resume_until_completed,
    )

    rng = random.Random(int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611")))
    kills_wanted = int(os.environ.get("KERNELEXT_CRASH_PG_KILLS", "20"))
    side_log = tmp_path / "side.log"
    reference = postgres_server.create_database()
    store_url = postgres_server.create_database()
    pool = WorkerPool(ENGINE_WORKER, tmp_path)
    try:
        expected = reference_state(pool, rng, reference, side_log)
        tally = KillTally()
        runs = 0
        while tally.kills < kills_wanted:
            run_id = f"pg-engine-{runs}"
            runs += 1
            resume_until_completed(
                pool,
                rng,
                store_url,
                run_id,
                side_log,
                tally,
                kills_wanted=kills_wanted,
                pause_ms=4.0,
                max_attempts=399,
            )
            assert final_state(store_url, run_id) == expected
        assert not tally.reruns, f"durably completed steps ran again: {tally.reruns}"
    finally:
        pool.close()


# -- many processes, one store ----------------------------------------------------------------
RUNNERS = 4
RUNS_PER_RUNNER = 3
STEPS = 12


def chain_is_consistent(events: list[dict[str, Any]]) -> bool:
    status = None
    for event in events:
        if event["to_status"] is None:
            continue
        if event["from_status"] != status:
            return False
        status = event["to_status"]
    return True


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_processes_share_one_store_while_others_stop_resume_and_sweep(
    postgres_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "deliveries.jsonl"
    normal = [f"w{w}-run{i}" for w in range(RUNNERS) for i in range(RUNS_PER_RUNNER)]
    expiring = [f"w{w}-approval" for w in range(RUNNERS)]
    with DeliveryServer(log_path=log) as server:
        base = {
            "store": postgres_url,
            "server": server.url,
            "all_normal": normal,
            "all_expire": expiring,
            "timeout": 300,
        }
        roles: list[tuple[str, dict[str, Any]]] = []
        for w in range(RUNNERS):
            mine = [r for r in normal if r.startswith(f"w{w}-")]
            roles.append(
                (
                    "runner",
                    {
                        "name": f"runner{w}",
                        "start": mine,
                        "expire": [f"w{w}-approval"],
                        "steps": STEPS,
                        "pause": 0.02,
                        "seed": w,
                    },
                )
            )
        for s in range(2):
            roles.append(
                (
                    "stopper",
                    {
                        "name": f"stopper{s}",
                        "targets": normal + expiring,
                        "duration": 3.0,
                        "seed": 100 + s,
                    },
                )
            )
        for s in range(3):
            roles.append(("sweeper", {"name": f"sweeper{s}"}))
        procs = []
        for role, config in roles:
            with open(tmp_path / f"{config['name']}.err", "w") as stderr:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), role, json.dumps({**base, **config})],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                    )
                )
        try:
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "ready"
            for proc in procs:  # all at once
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            reports = []
            for proc, (_, config) in zip(procs, roles, strict=True):
                out, _ = proc.communicate(timeout=400)
                err = (tmp_path / f"{config['name']}.err").read_text()
                assert proc.returncode == 0, f"{config['name']} failed:\n{err}"
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                proc.kill()
                proc.communicate()

    store = open_store(postgres_url)
    try:
        # Every normal run completed, each step exactly once.
        for run_id in normal:
            assert store.get_run(run_id)["status"] == "completed", store.events(run_id)
            keys = Counter(s["key"] for s in store.completed_steps(run_id))
            assert sorted(keys, key=int) == [str(i) for i in range(STEPS)]
            assert set(keys.values()) == {1}
        # No duplicate delivery; the ledger and the server agree, key by key.
        deliveries = read_log(log)
        keys = Counter(d["idempotency_key"] for d in deliveries)
        duplicates = {k: n for k, n in keys.items() if n > 1}
        assert not duplicates, f"delivered twice: {duplicates}"
        applied = {
            str(r[0]) for r in store.read("SELECT key FROM effects WHERE status = 'applied'")
        }
        assert set(keys) == applied
        assert len(applied) == len(normal) * STEPS + len(expiring) * 3
        assert store.read("SELECT count(*) FROM effects WHERE status <> 'applied'") == [(0,)]
        # No lost event: every request and resume is there, and the statuses chain up.
        stops = Counter[str]()
        resumes = Counter[str]()
        expired: list[str] = []
        for report in reports:
            stops.update(report.get("stops", {}))
            resumes.update(report.get("resumed", {}))
            expired += report.get("expired", [])
        print(
            "\nshared store:",
            json.dumps(
                {
                    "stop_requests": sum(stops.values()),
                    "resumes": sum(resumes.values()),
                    "resume_conflicts": sum(r.get("conflicts", 0) for r in reports),
                    "sweeps": sum(r.get("sweeps", 0) for r in reports),
                    "sweeps_busy": sum(r.get("busy", 0) for r in reports),
                    "deliveries": len(deliveries),
                }
            ),
        )
        assert sum(stops.values()) > 0 and sum(resumes.values()) > 0
        for run_id in normal + expiring:
            events = store.events(run_id)
            kinds = Counter(e["kind"] for e in events)
            assert kinds["created"] == 1
            assert kinds["stop_requested"] == stops[run_id], run_id
            assert kinds["resumed"] == resumes[run_id], run_id
            moves = [
                (e["id"], str(e["occurred_at"]), e["from_status"], e["to_status"]) for e in events
            ]
            assert chain_is_consistent(events), (run_id, moves)
        # Exactly one expiry per expiring run, by exactly one sweeper.
        assert sorted(expired) == sorted(expiring)
        for run_id in expiring:
            assert store.get_run(run_id)["status"] == "expired"
            assert Counter(e["kind"] for e in store.events(run_id))["expired"] == 1
    finally:
        store.close()
