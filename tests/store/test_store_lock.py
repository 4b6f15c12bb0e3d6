"""One store file, several processes: they take turns, and when a process cannot get
its turn it gets an error that names the file, the holder and what to do — never a
DuckDB traceback, never a damaged file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from kernelext._store import Store, open_store

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120.0

CATCHING = """
import json, sys
import kernelext as kx
try:
    kx.open_store(sys.argv[1])
except kx.StoreLockedError as exc:
    print(json.dumps({"message": str(exc), "path": exc.path, "pid": exc.pid,
                      "is_kernelext_error": isinstance(exc, kx.KernelextError)}))
else:
    print(json.dumps({"opened": True}))
"""

UNCAUGHT = """
import kernelext as kx
kx.runs()  # the default store comes from KERNELEXT_STORE
"""

SHARING = """
import json, sys
from kernelext._store import open_store
store = open_store(sys.argv[1])
before = [r["id"] for r in store.list_runs()]
store.create_run("from-child", "agent")
print(json.dumps({"before": before, "version": store.schema_version()}))
store.close()
"""


def python(code: str, *args: str, wait: float | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("KERNELEXT_STORE", None)
    if wait is not None:
        env["KERNELEXT_STORE_WAIT"] = str(wait)
    if len(args) == 1:
        env["KERNELEXT_STORE"] = args[0]
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def assert_actionable(message: str, path: str) -> None:
    assert path in message
    assert f"process {os.getpid()}" in message
    assert "KERNELEXT_STORE" in message
    assert "%config Kernelext.store" in message


def assert_no_duckdb_traceback(stderr: str, path: str) -> None:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("kernelext.errors.StoreLockedError:"), stderr
    assert path in last and str(os.getpid()) in last
    for raw in ("IOException", "Could not set lock", "During handling of the above"):
        assert raw not in stderr, stderr


def reads_back(path: str) -> list[str]:
    """Open the file in a fresh process: it must open cleanly and hold every run."""
    done = python(
        "import json, sys\n"
        "from kernelext._store import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "print(json.dumps({'runs': sorted(r['id'] for r in s.list_runs()),"
        " 'version': s.schema_version()}))\n"
        "s.close()\n",
        path,
    )
    seen = last_json(done)
    assert seen["version"] >= 1
    return list(seen["runs"])


@pytest.fixture
def busy_holder(store_path: Path) -> Iterator[Store]:
    """This process holds the store, in the middle of a long transaction."""
    holder = open_store(str(store_path))
    holder.create_run("held-1", "agent")
    entered, release = threading.Event(), threading.Event()

    def long_job(tx: Any) -> None:
        entered.set()
        release.wait(TIMEOUT)

    pending = holder.write_async(long_job)
    assert entered.wait(TIMEOUT)
    try:
        yield holder
    finally:
        release.set()
        pending.result(TIMEOUT)
        holder.close()


def test_a_busy_holder_gives_the_waiting_process_an_actionable_error(
    busy_holder: Store, store_path: Path
) -> None:
    path = str(store_path)
    report = last_json(python(CATCHING, path, wait=1))
    assert report.get("opened") is None, "the store was opened while its holder wrote"
    assert report["path"] == path
    assert report["pid"] == os.getpid()
    assert report["is_kernelext_error"] is True
    assert_actionable(report["message"], path)

    failed = python(UNCAUGHT, path, wait=1)
    assert failed.returncode != 0
    assert_no_duckdb_traceback(failed.stderr, path)


def test_a_foreign_duckdb_holder_gives_an_actionable_error(store_path: Path) -> None:
    path = str(store_path)
    store = open_store(path)
    store.create_run("before", "agent")
    store.close()
    foreign = duckdb.connect(path)  # e.g. a DuckDB shell left open on the file
    try:
        report = last_json(python(CATCHING, path, wait=1))
        assert report.get("opened") is None
        assert report["pid"] == os.getpid()
        assert_actionable(report["message"], path)
        failed = python(UNCAUGHT, path, wait=1)
        assert failed.returncode != 0
        assert_no_duckdb_traceback(failed.stderr, path)
    finally:
        foreign.close()
    assert reads_back(path) == ["before"]


def test_processes_take_turns_and_lose_nothing(store_path: Path) -> None:
    path = str(store_path)
    holder = open_store(path)
    try:
        holder.create_run("parent-1", "agent")
        child = last_json(python(SHARING, path))
        assert child["before"] == ["parent-1"]
        # The holder gets the file back on its next write and sees the child's run.
        holder.create_run("parent-2", "agent")
        assert sorted(r["id"] for r in holder.list_runs()) == ["from-child", "parent-1", "parent-2"]
    finally:
        holder.close()
    assert reads_back(path) == ["from-child", "parent-1", "parent-2"]


def test_store_file_is_created_private(store_path: Path) -> None:
    old = os.umask(0o022)  # a permissive umask must not leak into the store's files
    try:
        store = open_store(str(store_path))
        # Held until closed: after a second idle the store lets the file go with a
        # checkpoint, which deletes the WAL (a busy machine can pause this test that long).
        store.backend.linger = 3600.0  # type: ignore[attr-defined]
        try:
            store.create_run("r1", "agent")
            # DuckDB deletes its WAL at a checkpoint and creates it again on the next write.
            store.write(lambda tx: tx.execute("CHECKPOINT"))
            store.create_run("r2", "agent")
            wal = Path(str(store_path) + ".wal")
            assert wal.exists()
            for candidate in (store_path, wal):
                mode = stat.S_IMODE(candidate.stat().st_mode)
                assert mode == 0o600, f"{candidate} has mode {oct(mode)}"
        finally:
            store.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(store_path.stat().st_mode) == 0o600


FOREIGN_OPEN = """
import json, sys
import duckdb
try:
    duckdb.connect(sys.argv[1], read_only=True).close()
except duckdb.IOException as exc:
    print(json.dumps({"refused": "lock" in str(exc).lower()}))
else:
    print(json.dumps({"refused": False}))
"""


def test_the_file_stays_locked_while_this_process_holds_it_through_its_own_checks(
    store_path: Path,
) -> None:
    """A process that holds the store keeps DuckDB's lock on the file for as long as its
    connection is open. Closing any descriptor of a file drops every POSIX lock the
    process holds on it, so a check that opened and closed the store file (to read its
    header) let another process open it beside a writing connection. A process that does
    not ask for the file (no hand-over) must be refused after every kind of write."""
    path = str(store_path)
    holder = open_store(path)
    holder.backend.linger = TIMEOUT  # type: ignore[attr-defined]  # keep the file while idle
    try:
        holder.create_run("held-1", "agent")  # a transaction: the file's checks ran
        holder.record_event("held-1", "note", source="test")
        holder.flush()
        assert holder.backend.con is not None  # type: ignore[attr-defined]
        for _ in range(2):
            assert last_json(python(FOREIGN_OPEN, path)) == {"refused": True}
            holder.create_run(f"held-{_ + 2}", "agent")
    finally:
        holder.close()
    assert reads_back(path) == ["held-1", "held-2", "held-3"]
