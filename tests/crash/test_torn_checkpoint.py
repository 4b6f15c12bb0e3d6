"""A store file torn for real in the middle of a checkpoint opens with every committed run.

A process's multi-page write of the store file stops after its first page and the process
dies of SIGKILL (``support/tear_write.c``): the file holds a block half old, half new, as
Linux leaves it when a fatal signal arrives inside a buffered write. Each test tears, one
process at a time, every write of a checkpoint that rewrites a block in place, then opens
the store with ``kx.open_store`` and reads back every run the dead process saw completed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.torn_writes import rewrites, run_torn, tear_library, writes

import kernelext as kx

pytestmark = pytest.mark.slow

STEPS = 12

# A real kernelext process: each round runs an agent to completion, prints its run id,
# and idles until the writer lets the file go (a checkpoint); the last round closes.
AGENT = f"""
import sys, time
import kernelext as kx

@kx.agent(name="torn")
def torn(run, items):
    for i in run.steps(items, key=lambda i: i):
        run.state["item" + str(i)] = "x" * 300

for r in range({{rounds}}):
    h = torn.start(list(range({STEPS})), run_id="{{prefix}}" + str(r))
    assert h.wait(timeout=60) == "completed"
    print("{{prefix}}" + str(r), flush=True)
    time.sleep(1.3)
"""

# A user's own connection to the store file with kx.duckdb_config(), in a process where no
# kernelext holds the file: a table of the user's, then close.
USER = """
import os, duckdb
import kernelext as kx
con = duckdb.connect(os.environ["KERNELEXT_STORE"], config=kx.duckdb_config())
con.execute("CREATE TABLE IF NOT EXISTS mine (a INTEGER, b VARCHAR)")
con.execute("INSERT INTO mine SELECT range, repeat('z', 50) FROM range(5000)")
con.close()
"""

# A kernelext process killed with its last run's records in the WAL (a kernel restarted).
KILLED = f"""
import os, signal, time
import kernelext as kx

@kx.agent(name="torn")
def torn(run, items):
    for i in run.steps(items, key=lambda i: i):
        run.state["item" + str(i)] = "x" * 300

for r in range(2):  # the first checkpointed when the writer lets the file go
    h = torn.start(list(range({STEPS})), run_id="k" + str(r))
    assert h.wait(timeout=60) == "completed"
    print("k" + str(r), flush=True)
    time.sleep(1.3 - r * 1.3)
os.kill(os.getpid(), signal.SIGKILL)
"""

# The same connection of the user's, only reading.
USER_READS = """
import os, duckdb
import kernelext as kx
con = duckdb.connect(os.environ["KERNELEXT_STORE"], config=kx.duckdb_config())
con.execute("SELECT count(*) FROM runs").fetchall()
con.close()
"""

# docs/notebooks.md's JupySQL connection, in a cell run after kernelext let the file go (it
# does after a second idle): a new DuckDB instance, configured by kx.duckdb_config() only.
LATER_CELL = f"""
import os, pathlib, time
import duckdb
import kernelext as kx

@kx.agent(name="torn")
def torn(run, items):
    for i in run.steps(items, key=lambda i: i):
        run.state["item" + str(i)] = "x" * 300

h = torn.start(list(range({STEPS})), run_id="c0")
assert h.wait(timeout=60) == "completed"
print("c0", flush=True)
time.sleep(1.5)
pathlib.Path(os.environ["TEAR_ARM"]).touch()
con = duckdb.connect(kx.open_store().location, config=kx.duckdb_config())
con.execute("CREATE TABLE IF NOT EXISTS mine (a INTEGER, b VARCHAR)")
con.execute("INSERT INTO mine SELECT range, repeat('z', 50) FROM range(5000)")
con.close()
"""

# Killed after a checkpoint wrote its new header, before it removed <store>.undo (the
# removal is armed once a file exists, after the second run: a checkpoint past the first).
KILLED_AT_REMOVAL = f"""
import os, pathlib, time
import kernelext as kx

@kx.agent(name="torn")
def torn(run, items):
    for i in run.steps(items, key=lambda i: i):
        run.state["item" + str(i)] = "x" * 300

for r in range(3):
    h = torn.start(list(range({STEPS})), run_id="a" + str(r))
    assert h.wait(timeout=60) == "completed"
    print("a" + str(r), flush=True)
    if r == 1:
        pathlib.Path(os.environ["TEAR_ARM"]).touch()
    time.sleep(1.3)
"""


def completed(out: str) -> list[str]:
    return [line for line in out.split("\n") if line]


def assert_runs(store: Path, run_ids: list[str], shown: str, *, read_only: bool = False) -> None:
    """Opened by kernelext, the store holds each run completed with all its steps."""
    s = kx.open_store(str(store), read_only=read_only)
    try:
        for run_id in run_ids:
            rows = s.read(
                "SELECT status, (SELECT count(*) FROM steps WHERE run_id = ?) FROM runs "
                "WHERE id = ?",
                [run_id, run_id],
            )
            assert rows == [("completed", STEPS)], (shown, run_id, rows)
    finally:
        s.close()


def test_kernelext_checkpoint_torn_in_place_loses_nothing(tmp_path: Path) -> None:
    library = tear_library(tmp_path)
    probe = tmp_path / "probe"
    probe.mkdir()
    done = run_torn(
        library, probe / "store.duckdb", AGENT.format(rounds=3, prefix="p"), log=tmp_path / "log"
    )
    assert done.returncode == 0, done.stderr
    in_place = rewrites(tmp_path / "log")
    assert in_place, "no checkpoint rewrote a block in place"
    for n in in_place:
        folder = tmp_path / f"tear-{n}"
        folder.mkdir()
        store = folder / "store.duckdb"
        torn = run_torn(library, store, AGENT.format(rounds=3, prefix=f"t{n}-"), tear_at=n)
        assert torn.returncode == -9, (n, torn.stderr)
        assert_runs(store, completed(torn.stdout), f"torn at write {n}")
        shutil.rmtree(folder)


def test_a_users_own_connection_torn_at_close_loses_nothing(tmp_path: Path) -> None:
    """A user's own DuckDB connection in another process (a script, a second notebook),
    configured with kx.duckdb_config(): DuckDB checkpoints by itself when it closes."""
    library = tear_library(tmp_path)
    base = tmp_path / "base"
    base.mkdir()
    made = run_torn(library, base / "store.duckdb", AGENT.format(rounds=1, prefix="u"))
    assert made.returncode == 0, made.stderr
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    done = run_torn(library, probe / "store.duckdb", USER, log=tmp_path / "log")
    assert done.returncode == 0, done.stderr
    for n, _offset in writes(tmp_path / "log"):
        folder = tmp_path / f"tear-{n}"
        shutil.copytree(base, folder)
        torn = run_torn(library, folder / "store.duckdb", USER, tear_at=n)
        assert torn.returncode == -9, (n, torn.stderr)
        assert_runs(folder / "store.duckdb", ["u0"], f"user's connection torn at write {n}")
        shutil.rmtree(folder)


def test_a_users_reading_connection_after_a_killed_kernel_torn_at_close_loses_nothing(
    tmp_path: Path,
) -> None:
    """The user's connection replays the WAL a killed kernelext process left, and DuckDB
    checkpoints it by itself when the connection closes."""
    library = tear_library(tmp_path)
    base = tmp_path / "base"
    base.mkdir()
    killed = run_torn(library, base / "store.duckdb", KILLED)
    assert killed.returncode == -9, killed.stderr
    assert completed(killed.stdout) == ["k0", "k1"]
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    done = run_torn(library, probe / "store.duckdb", USER_READS, log=tmp_path / "log")
    assert done.returncode == 0, done.stderr
    assert writes(tmp_path / "log"), "the user's connection wrote nothing"
    for n, _offset in writes(tmp_path / "log"):
        folder = tmp_path / f"tear-{n}"
        shutil.copytree(base, folder)
        torn = run_torn(library, folder / "store.duckdb", USER_READS, tear_at=n)
        assert torn.returncode == -9, (n, torn.stderr)
        assert_runs(folder / "store.duckdb", ["k0", "k1"], f"user's reading connection torn at {n}")
        shutil.rmtree(folder)


def test_the_documented_jupysql_connection_in_a_later_cell_torn_at_close_loses_nothing(
    tmp_path: Path,
) -> None:
    library = tear_library(tmp_path)
    probe = tmp_path / "probe"
    probe.mkdir()
    arm = {"TEAR_ARM": str(tmp_path / "arm-probe")}
    done = run_torn(library, probe / "store.duckdb", LATER_CELL, log=tmp_path / "log", extra=arm)
    assert done.returncode == 0, done.stderr
    assert writes(tmp_path / "log"), "the user's connection wrote nothing"
    for n, _offset in writes(tmp_path / "log"):
        folder = tmp_path / f"tear-{n}"
        folder.mkdir()
        store = folder / "store.duckdb"
        arm = {"TEAR_ARM": str(folder / "arm")}
        torn = run_torn(library, store, LATER_CELL, tear_at=n, extra=arm)
        assert torn.returncode == -9, (n, torn.stderr)
        assert_runs(store, ["c0"], f"the user's connection torn at write {n}")
        shutil.rmtree(folder)


def _iteration(store: Path) -> int:
    raw = store.read_bytes()[: 3 * 4096]
    return max(int.from_bytes(raw[at + 8 : at + 16], "little") for at in (4096, 8192))


def test_a_store_file_put_in_place_of_another_is_never_written_with_its_copy(
    tmp_path: Path,
) -> None:
    """A store's file replaced by another store's (a backup, another project's) beside the
    copy a killed checkpoint of the first left: the copy's blocks are not the new file's."""
    library = tear_library(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    killed = run_torn(
        library,
        first / "store.duckdb",
        KILLED_AT_REMOVAL,
        extra={"TEAR_UNLINK": ".duckdb.undo", "TEAR_ARM": str(first / "arm")},
    )
    assert killed.returncode == -9, killed.stderr
    made = run_torn(library, second / "store.duckdb", AGENT.format(rounds=1, prefix="s"))
    assert made.returncode == 0, made.stderr
    copy = (first / "store.duckdb.undo").read_bytes()
    assert int.from_bytes(copy[28:36], "little") == _iteration(second / "store.duckdb")
    folder = tmp_path / "replaced"
    folder.mkdir()
    shutil.copyfile(second / "store.duckdb", folder / "store.duckdb")
    (folder / "store.duckdb.undo").write_bytes(copy)
    (folder / "store.duckdb.undo").chmod(0o600)
    image = (folder / "store.duckdb").read_bytes()
    try:
        assert_runs(folder / "store.duckdb", ["s0"], "the file put in place")
    except kx.errors.StoreError as exc:
        assert "replaced" in str(exc)
        assert (folder / "store.duckdb").read_bytes() == image


def _make_unwritable(path: Path) -> None:
    """No write to ``path`` is allowed (root writes any file: it gets an immutable one)."""
    path.chmod(0o400)
    if os.access(path, os.W_OK):
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode:
            pytest.skip("cannot make a file unwritable for this user")


def test_a_finished_checkpoint_whose_copy_was_left_reads_read_only(tmp_path: Path) -> None:
    """Killed after the new header was written, before <store>.undo was removed: the store
    is whole, and a read-only open of a file it cannot write (a read-only mount, another
    user's store) reads it."""
    library = tear_library(tmp_path)
    store = tmp_path / "store.duckdb"
    torn = run_torn(
        library, store, AGENT.format(rounds=2, prefix="f"), extra={"TEAR_UNLINK": ".duckdb.undo"}
    )
    assert torn.returncode == -9, torn.stderr
    assert (tmp_path / "store.duckdb.undo").exists()
    _make_unwritable(store)
    try:
        assert_runs(store, completed(torn.stdout), "read-only", read_only=True)
    finally:
        if shutil.which("chattr"):
            subprocess.run(["chattr", "-i", str(store)], check=False, capture_output=True)
        store.chmod(0o600)
