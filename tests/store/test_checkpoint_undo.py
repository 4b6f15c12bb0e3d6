"""A checkpoint killed anywhere leaves a store that opens with every commit in it.

DuckDB's checkpoint rewrites the file's metadata blocks in place; a process killed inside
one of those writes (SIGKILL stops a write of several pages between two pages) leaves a
block half old, half new, and the file opens under neither header. These tests build every
file a kill can leave, page by page, from a real checkpoint of a real store file: the file
before it, the file after it, and each block it changed, whole or torn after each page.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from support.small_disk import fill, small_disk  # noqa: F401  (fixture)

from kernelext._store.duckdb.checkpoint import (
    _Copy,
    checkpoint,
    disable_shutdown_checkpoint,
    restore_torn_checkpoint,
    save_undo,
)
from kernelext._store.duckdb.connect import DUCKDB_CONFIG
from kernelext.errors import StoreError

PAGE = 4096
HEADERS = 3 * PAGE
TABLES = 5


def _change(con: duckdb.DuckDBPyConnection, rng: random.Random) -> None:
    """Inserts, updates and deletes in every table, each commit its own."""
    for t in range(TABLES):
        con.execute(f"CREATE TABLE IF NOT EXISTS t{t} (id INTEGER, note VARCHAR, n DOUBLE)")
        start = rng.randrange(10_000)
        con.execute(
            f"INSERT INTO t{t} SELECT range, 'note ' || range || repeat('x', ?), random() "
            "FROM range(?, ?)",
            [rng.randrange(40), start, start + rng.randrange(1, 400)],
        )
        if rng.random() < 0.5:
            con.execute(
                f"UPDATE t{t} SET note = note || '!' WHERE id % ? = 0", [rng.randrange(2, 9)]
            )
        if rng.random() < 0.4:
            con.execute(f"DELETE FROM t{t} WHERE id % ? = 1", [rng.randrange(3, 11)])


def connect(path: str | Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection configured as the store's own (DuckDB never checkpoints by itself)."""
    con = duckdb.connect(str(path), read_only=read_only, config=DUCKDB_CONFIG)
    if not read_only:
        disable_shutdown_checkpoint(con)
    return con


@contextlib.contextmanager
def _checkpointable(
    path: str | Path, *, full_disk: bool = False
) -> Iterator[tuple[duckdb.DuckDBPyConnection, int]]:
    """A store connection to ``path`` and the read-only descriptor that ``checkpoint`` and
    ``save_undo`` take, both closed at the end. On a ``full_disk`` DuckDB may refuse the
    close as well, and that is let pass."""
    con = connect(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield con, fd
    finally:
        if full_disk:
            with contextlib.suppress(duckdb.Error):
                con.close()
        else:
            con.close()
        os.close(fd)


def _contents(con: duckdb.DuckDBPyConnection) -> list[list[tuple[object, ...]]]:
    return [con.execute(f"SELECT * FROM t{t} ORDER BY ALL").fetchall() for t in range(TABLES)]


class _Checkpoint:
    """One real checkpoint: the file before and after, its WAL, the copy kernelext saved."""

    def __init__(self, folder: Path, seed: int) -> None:
        folder.mkdir(mode=0o700)
        path = folder / "store.duckdb"
        rng = random.Random(seed)
        with _checkpointable(path) as (con, fd):
            for _ in range(rng.randrange(1, 4)):  # checkpointed rounds: metadata to rewrite
                _change(con, rng)
                assert checkpoint(con, str(path), fd)
            _change(con, rng)  # in the WAL only
            self.expected = _contents(con)
            self.before = path.read_bytes()
            self.wal = (folder / "store.duckdb.wal").read_bytes()
            save_undo(con, str(path), fd)
            self.undo = (folder / "store.duckdb.undo").read_bytes()
            con.execute("CHECKPOINT")
            self.after = path.read_bytes()
        self.block = len(self.before) and _block_size(self.before)

    def changed_blocks(self) -> list[int]:
        end = max(len(self.before), len(self.after))
        return [
            at
            for at in range(HEADERS, end, self.block)
            if self.before[at : at + self.block] != self.after[at : at + self.block]
        ]

    def killed_states(self) -> Iterator[tuple[str, bytes]]:
        """Every file a kill before the new header leaves: the old headers over any mix of
        the old and new blocks, with one block torn after each of its pages."""
        end = max(len(self.before), len(self.after))
        old = self.before.ljust(end, b"\0")[:end]
        new = self.after.ljust(end, b"\0")[:end]
        base_new = old[:HEADERS] + new[HEADERS:]
        yield "every block written, header not", base_new
        for at in self.changed_blocks():
            for pages in range(1, self.block // PAGE):
                cut = at + pages * PAGE
                for name, base in (("others written", base_new), ("others not", old)):
                    torn = base[:at] + new[at:cut] + old[cut : at + self.block]
                    yield (
                        f"block at {at} torn after {pages} pages, {name}",
                        (base[:at] + torn[at : at + self.block] + base[at + self.block :]),
                    )


def _block_size(image: bytes) -> int:
    import struct

    sizes = [struct.unpack_from("<QQQQQ", image, at + 8) for at in (4096, 8192)]
    return int(max(sizes)[4])


def _lay_out(folder: Path, image: bytes, wal: bytes | None, undo: bytes | None) -> str:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    path = folder / "store.duckdb"
    for name, data in (("", image), (".wal", wal), (".undo", undo)):
        if data is not None:
            fd = os.open(f"{path}{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, data)
            os.close(fd)
    return str(path)


def _opens_with(path: str) -> list[list[tuple[object, ...]]]:
    con = connect(path, read_only=True)
    try:
        return _contents(con)
    finally:
        con.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_checkpoint_killed_at_any_page_is_undone_and_every_commit_is_there(
    tmp_path: Path, seed: int
) -> None:
    made = _Checkpoint(tmp_path / "made", seed)
    assert made.changed_blocks(), "the checkpoint changed nothing: no case to build"
    states = list(made.killed_states())
    unreadable_without_undo = []
    for name, image in states:
        path = _lay_out(tmp_path / "state", image, made.wal, made.undo)
        restore_torn_checkpoint(path)  # the header had not moved: torn blocks written back
        assert _opens_with(path) == made.expected, name
        assert Path(path + ".undo").read_bytes() == made.undo, name  # the copy stands
        # Without the copy, the same file: the torn metadata block makes it unreadable.
        path = _lay_out(tmp_path / "state", image, made.wal, None)
        try:
            assert _opens_with(path) == made.expected
        except (StoreError, duckdb.Error, AssertionError):
            unreadable_without_undo.append(name)
    # The hazard is real: DuckDB rewrites in place blocks the old header still uses.
    assert unreadable_without_undo, "no kill point lost the store without the copy"


def test_a_checkpoint_that_finished_keeps_its_file_and_nothing_is_written_back(
    tmp_path: Path,
) -> None:
    made = _Checkpoint(tmp_path / "made", 4)
    path = _lay_out(tmp_path / "state", made.after, None, made.undo)
    assert not restore_torn_checkpoint(path)  # the header moved: the copy is of the old one
    assert Path(path).read_bytes() == made.after
    assert _opens_with(path) == made.expected


def test_a_damaged_copy_is_set_aside_and_a_whole_store_opens_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    made = _Checkpoint(tmp_path / "made", 5)
    damaged = bytearray(made.undo)
    damaged[len(damaged) // 2] ^= 0xFF
    path = _lay_out(tmp_path / "state", made.after, None, bytes(damaged))
    assert not restore_torn_checkpoint(path)
    assert Path(path).read_bytes() == made.after  # nothing written from a damaged copy
    assert Path(path + ".undo.damaged").read_bytes() == bytes(damaged)  # kept to look at
    assert not os.path.exists(path + ".undo")
    assert "is damaged; it was set aside" in caplog.text
    assert _opens_with(path) == made.expected


def test_a_checkpoint_on_a_full_disk_loses_no_commit(
    small_disk: Path,  # noqa: F811
) -> None:
    path = str(small_disk / "store.duckdb")
    rng = random.Random(6)
    with _checkpointable(path, full_disk=True) as (con, fd):
        _change(con, rng)
        assert checkpoint(con, path, fd)  # the copy now stands for this header
        _change(con, rng)
        expected = _contents(con)
        fill(small_disk / "filler")
        with contextlib.suppress(duckdb.Error):  # DuckDB's own writes fail: it gives up
            checkpoint(con, path, fd)
    os.unlink(small_disk / "filler")
    restore_torn_checkpoint(path)
    assert _opens_with(path) == expected


def test_a_copy_that_cannot_be_written_skips_the_checkpoint(
    small_disk: Path,  # noqa: F811
) -> None:
    path = str(small_disk / "store.duckdb")
    rng = random.Random(7)
    with _checkpointable(path) as (con, fd):
        _change(con, rng)
        fill(small_disk / "filler")  # no copy exists yet, and none can be written
        before = Path(path).read_bytes()
        assert not checkpoint(con, path, fd)
        assert Path(path).read_bytes() == before  # DuckDB was not asked to checkpoint
        assert not os.path.exists(path + ".undo") and not os.path.exists(path + ".undo.tmp")
        expected = _contents(con)
    os.unlink(small_disk / "filler")
    assert _opens_with(path) == expected


_RECORD = """
import os, sys, kernelext as kx
store = kx.open_store(sys.argv[1])
# Held until the process ends: after a second idle the store lets the file go with a
# checkpoint, which would empty the WAL this process must die with (a busy machine can
# pause this script that long between the fold and the kill).
store.backend.linger = 3600.0

@kx.agent(name="counted")
def counted(run, n):
    total = 0
    for i in run.steps(range(n)):
        total += i
    return total

h = counted.start(int(sys.argv[2]), run_id=sys.argv[3])
assert h.wait(60) == "completed" and h.result == sum(range(int(sys.argv[2])))
kx.sql("SELECT 1")  # a read folds every record first: they are in the WAL now
if sys.argv[4] == "die":
    os._exit(0)  # killed: nothing closes, the WAL stays
store.close()
"""


def _record(path: Path, steps: int, run_id: str, end: str) -> None:
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-c", _RECORD, str(path), str(steps), run_id, end],
        check=True,
        timeout=120,
        env={**os.environ, "KERNELEXT_STORE": str(path)},
    )


def test_kx_open_store_undoes_a_checkpoint_its_process_was_killed_in(tmp_path: Path) -> None:
    """The whole way: a store whose process died in a checkpoint, torn where DuckDB
    rewrites in place, opens with ``kx.open_store`` and shows every run it recorded."""
    import kernelext as kx

    first = tmp_path / "first"
    first.mkdir(mode=0o700)
    path = first / "store.duckdb"
    _record(path, 5, "run-a", "close")
    _record(path, 7, "run-b", "die")
    before, wal = path.read_bytes(), Path(f"{path}.wal").read_bytes()
    assert wal, "the second run should be in the WAL"
    # The checkpoint the next open would make, made here.
    with _checkpointable(path) as (con, fd):
        save_undo(con, str(path), fd)
        undo = Path(f"{path}.undo").read_bytes()
        con.execute("CHECKPOINT")
    after = path.read_bytes()
    rewritten = [o for o, data in _Copy(undo).blocks if after[o : o + len(data)] != data]
    assert rewritten, "the checkpoint rewrote no metadata block in place"
    at = rewritten[0]  # torn after its first page
    torn = before[:at] + after[at : at + PAGE] + before[at + PAGE :]
    for undo_left, folder in ((None, tmp_path / "without"), (undo, tmp_path / "with")):
        shutil.copytree(first, folder)
        store = folder / "store.duckdb"
        store.write_bytes(torn)
        Path(f"{store}.wal").write_bytes(wal)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{store}.undo")
        if undo_left is not None:
            Path(f"{store}.undo").write_bytes(undo_left)
        if undo_left is None:  # the same file, no copy beside it: unreadable
            with pytest.raises(StoreError, match="Corrupt database file"):
                kx.open_store(str(store))
                kx.sql("SELECT count(*) FROM runs")
            continue
        with pytest.raises(StoreError, match="read-only open cannot finish it"):
            kx.open_store(str(store), read_only=True)  # it writes nothing, so it refuses
        assert store.read_bytes() == torn
        try:
            opened = kx.open_store(str(store))
            rows = kx.sql("SELECT id, status FROM runs ORDER BY id").values.tolist()
            assert rows == [["run-a", "completed"], ["run-b", "completed"]]
        finally:
            with contextlib.suppress(Exception):
                opened.close()


def test_a_folder_where_the_copy_is_written_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """Something not kernelext's at ``<store>.undo.tmp`` (a folder): the open says what it
    is and what to do, and leaves it and the store as they are."""
    made = _Checkpoint(tmp_path / "made", 3)
    path = _lay_out(tmp_path / "state", made.after, None, made.undo)
    os.mkdir(path + ".undo.tmp")
    with pytest.raises(StoreError, match=r"not a file kernelext left.*Remove it \(rm -r "):
        restore_torn_checkpoint(path)
    assert os.path.isdir(path + ".undo.tmp")
    assert Path(path).read_bytes() == made.after


def test_a_store_file_removed_beside_its_copy_opens_as_a_new_store(tmp_path: Path) -> None:
    """The user removed the store file and kept its folder: the copy beside it belongs to
    no file, and a new store opens (and gets a copy of its own)."""
    import kernelext as kx

    path = tmp_path / "store" / "s.duckdb"
    _record(path, 3, "run-a", "close")
    old_copy = Path(f"{path}.undo").read_bytes()
    path.unlink()
    store = kx.open_store(str(path))
    try:
        assert kx.sql("SELECT count(*) AS n FROM runs", store=store)["n"].tolist() == [0]
    finally:
        store.close()
    assert Path(f"{path}.undo").read_bytes() != old_copy
