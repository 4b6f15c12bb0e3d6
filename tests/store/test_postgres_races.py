"""Several processes racing on one PostgreSQL store: exactly one winner each time.

Each worker process opens the store, creates its own run and waits for a common start
time. Then it claims the same resources as the others, one after another (a claim is
exclusive: every resource ends with one holder), and creates the same run ids (each id
is created once; the others are told it is taken, with no database error).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.postgres import PostgresServer

from kernelext._core.encoding.names import CELL_AGENT
from kernelext._store import open_store

pytestmark = pytest.mark.slow

CLAIMER = """
import json, sys, time
from kernelext.errors import ClaimConflict
from kernelext._store import open_store

url, run_id, start_at, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
store = open_store(url)
store.create_run(run_id, "claims-race")
store.read("SELECT 1")  # the read connection is open before the start
won, refused, created = [], 0, 0
while time.time() < start_at:
    time.sleep(0.001)
for i in range(count):
    try:
        store.claim(run_id, f"customer:{i}")
        won.append(i)
    except ClaimConflict:
        refused += 1
while time.time() < start_at + 3.0:  # the second race starts together too
    time.sleep(0.001)
for i in range(count):
    created += store.create_run(f"shared-{i}", "claims-race")
store.close()
print(json.dumps({"won": won, "refused": refused, "created": created}))
"""

WORKERS = 4
RESOURCES = 150


def race(script: str, argvs: list[list[str]]) -> list[Any]:
    """Run ``script`` once per argument list, all at once; each prints one JSON value."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    return results


def test_processes_racing_for_resources_and_run_ids_get_one_winner_each(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.create_database()
    open_store(url).close()  # migrated once, before the race
    start_at = time.time() + 4.0
    results = race(
        CLAIMER, [[url, f"racer-{n}", str(start_at), str(RESOURCES)] for n in range(WORKERS)]
    )
    assert sum(len(r["won"]) for r in results) == RESOURCES  # every resource has one winner
    assert sum(r["refused"] for r in results) == RESOURCES * (WORKERS - 1)
    assert sum(r["created"] for r in results) == RESOURCES  # each shared id created once
    store = open_store(url)
    try:
        holders = store.read(
            "SELECT resource, count(*) FROM claims WHERE released_at IS NULL"
            " GROUP BY resource HAVING count(*) > 1"
        )
        assert holders == []  # never two holders of one resource
        assert store.read("SELECT count(DISTINCT resource) FROM claims") == [(RESOURCES,)]
        created = store.read(
            "SELECT count(*) FROM events WHERE kind = 'created' AND run_id LIKE 'shared-%'"
        )
        assert created == [(RESOURCES,)]
    finally:
        store.close()


RESUMER = """
import json, sys, time
from kernelext._core.lifecycle.control import resume
from kernelext.errors import RunStateError
from kernelext._store import open_store

url, run_id, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(url)
store.read("SELECT 1")
while time.time() < start_at:
    time.sleep(0.001)
try:
    resume(run_id, store=store, source="race")
    outcome = "resumed"
except RunStateError as exc:
    outcome = "refused: " + str(exc)
print(json.dumps(outcome), flush=True)
time.sleep(3.0)  # stay alive (and the owner) while the others try
store.close()
"""


@pytest.mark.parametrize("backend", ["postgresql", "duckdb"])
def test_processes_resuming_one_suspended_cell_run_get_one_owner(
    backend: str, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = (
        postgres_server.create_database()
        if backend == "postgresql"
        else str(tmp_path / "shared.duckdb")
    )
    store = open_store(url)
    try:
        store.create_run("cells-race", CELL_AGENT)
        assert store.transition("cells-race", "suspended", ("running",)).ok
    finally:
        store.close()
    start_at = time.time() + 5.0
    outcomes = race(RESUMER, [[url, "cells-race", str(start_at)] for _ in range(WORKERS)])
    assert outcomes.count("resumed") == 1, outcomes  # one owner, never two
    assert all("cannot be resumed twice" in o for o in outcomes if o != "resumed"), outcomes
    store = open_store(url)
    try:
        resumed = [e for e in store.events("cells-race") if e["kind"] == "resumed"]
        assert len(resumed) == 1
    finally:
        store.close()
