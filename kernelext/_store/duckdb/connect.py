"""Connecting to the store file, and the files around it: the file's identity, its
header's magic, the WAL kept private, and the lock files an open leaves."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import duckdb

from ...errors import StoreError, StoreLockedError
from .checkpoint import CHECKPOINT_CONFIG, disable_shutdown_checkpoint
from .store_files import open_store_file, own_folder

_PID = re.compile(r"\(PID (\d+)\)")
_UMASK_LOCK = threading.Lock()
# New store files get 16 KiB blocks instead of 256 KiB: a store is many small tables, and
# every table and index costs at least a block. (An existing file keeps its block size.)
# Another connection to the same file in this process must pass the same config.
# DuckDB never checkpoints by itself: kernelext does, undoably (``checkpoint``).
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "default_block_size": "16384",
    **CHECKPOINT_CONFIG,
}

# Failures that the same records would meet again: the tables refuse them.
PERMANENT_ERRORS = (
    duckdb.ConstraintException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.TypeMismatchException,
    duckdb.OutOfRangeException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.ParserException,
    duckdb.NotImplementedException,  # e.g. a batch's VALUES mixing a text into a number column
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
)


def duckdb_config() -> dict[str, str | bool | int | float | list[str]]:
    """``kx.duckdb_config()``: the configuration another DuckDB connection to the store file
    in this process must pass (DuckDB refuses a second configuration of an open file), e.g.
    ``duckdb.connect(kx.open_store().location, config=kx.duckdb_config())`` for JupySQL.
    A new dict each call: changing it changes nothing in kernelext."""
    return dict(DUCKDB_CONFIG)


class DuckTx:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._con.execute(sql, list(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._con.executemany(sql, [list(r) for r in rows])

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._con.execute(sql, list(params)).fetchone()

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._con.execute(sql, list(params)).fetchall()


def connect_file(
    path: str, timeout: float, *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Connect (creating the file with mode 0600); wait out a foreign holder up to ``timeout``.

    A file written by a newer kernelext, or someone else's DuckDB file, is refused here,
    on every connect, before anything writes to it.
    """
    from ..compat import check_store

    if not read_only:  # DuckDB opens (and rewrites) the WAL by name: never a link
        with contextlib.suppress(FileNotFoundError):
            os.close(open_store_file(path + ".wal", os.O_RDONLY, make_private=True))
        if os.path.lexists(path + ".tmp"):  # DuckDB spills there: a folder of this user's
            own_folder(path + ".tmp")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with _UMASK_LOCK:
                old = os.umask(0o077)
                try:
                    con = duckdb.connect(path, read_only=read_only, config=DUCKDB_CONFIG)
                finally:
                    os.umask(old)
        except duckdb.IOException as exc:
            msg = str(exc)
            if "Could not set lock" not in msg and "Conflicting lock" not in msg:
                raise StoreError(f"Cannot open the kernelext store {path!r}: {msg}") from None
            if time.monotonic() >= deadline:
                match = _PID.search(msg)
                raise StoreLockedError(path, int(match.group(1)) if match else None) from None
            time.sleep(0.05)
            continue
        except duckdb.Error as exc:
            raise StoreError(
                f"Cannot open the kernelext store {path!r}: {exc}. If the file is not a "
                "kernelext store, point KERNELEXT_STORE at another path."
            ) from None
        try:  # before anything touches the file: the journal fold, chmod, the WAL
            check_store(DuckTx(con).fetchall, path, True)
        except BaseException:
            con.close()
            raise
        # Store statements are tiny: one thread avoids DuckDB's per-statement scheduling
        # cost (about half of a small insert here); analytics over a million rows stay fast.
        con.execute("SET threads = 1")
        if not read_only:
            disable_shutdown_checkpoint(con)
        lock_down(con)
        if read_only:
            return con
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o600)  # the store file (through a link to it the user made)
        private_wal(path)
        return con


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Settle the instance for good, after the store's own settings (``threads``).

    External access off: no SQL on this instance reads or writes a file other than the
    store's own, installs or loads an extension, or attaches a database; kernelext's side
    files and journals are Python I/O. Then the configuration is locked: no statement can
    change a setting (``memory_limit``, ``enable_external_access``, ...) while it is open.
    Both hold for every cursor; neither can be undone until the instance closes.
    """
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def private_wal(path: str) -> None:
    """Make sure the WAL exists with mode 0600 before DuckDB writes records into it.

    DuckDB deletes the WAL at every checkpoint and creates it again on the next write
    with the process umask (often 0644): the records would be readable by every user.
    An empty WAL that DuckDB finds is used as it is (and removed on open).
    """
    with contextlib.suppress(FileExistsError):
        os.close(open_store_file(path + ".wal", os.O_WRONLY | os.O_CREAT | os.O_EXCL))


def file_identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``, or None when there is none."""
    st = stat_or_none(path)
    return None if st is None else (st.st_dev, st.st_ino)


def file_signal(path: str) -> tuple[int, int, int] | None:
    st = stat_or_none(path)
    if st is None or st.st_size == 0:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


DUCKDB_MAGIC = b"DUCK"  # bytes 8-12 of every DuckDB database file
DUCKDB_HEADERS = 3 * 4096  # its main header and two database headers: no file is shorter


def open_header(path: str) -> int | None:
    """A descriptor of the store file, held while connected (see ``_header_fd``); read-write
    where it can be (an interrupted checkpoint is undone through it)."""
    for mode in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, mode | os.O_NONBLOCK)  # never waits on a FIFO
        except PermissionError:
            continue
        except OSError:
            return None
    return None


def header_magic(fd: int | None) -> bytes | None:
    """Bytes 8-12 of the file (DuckDB's magic) read through ``fd`` (never by opening the
    file: see ``_header_fd``), or None without a descriptor or when it cannot be read."""
    if fd is None:
        return None
    try:
        return os.pread(fd, 4, 8)
    except OSError:
        return None


def coordination_files(path: str) -> list[str]:
    """The lock files beside the store at ``path`` that an open creates."""
    path = os.path.abspath(path)
    return [path + ".lock", path + ".want"]


def remove_created_coordination_files(before: list[str]) -> None:
    """After a failed open: remove the coordination files in ``before`` (files that did
    not exist before it) that nobody holds now, so a failed open leaves no litter."""
    from .platform import try_lock_file, unlock_file

    for name in before:
        try:
            fd = open_store_file(name, os.O_RDWR)
        except (OSError, StoreError):
            continue
        try:
            if try_lock_file(fd):  # nobody waits on it or holds it
                try:
                    os.unlink(name)
                finally:
                    unlock_file(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def is_writable(path: str) -> bool:
    """Can this process create the store's files beside ``path`` (and write the file)?"""
    folder = os.path.dirname(path)
    while not os.path.isdir(folder):  # the folder is created: look at the nearest parent
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    return not os.path.exists(path) or os.access(path, os.W_OK)
