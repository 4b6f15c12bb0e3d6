"""DuckDB's checkpoint, made safe against a process killed in the middle of it.

A checkpoint moves what the WAL holds into the store file. It writes new data to free
blocks, then rewrites the file's **metadata blocks in place** (the header the file opens
under still points into them), then writes the new header. A process killed inside one of
those block writes (a SIGKILL interrupts a write of several pages between two pages; a
power cut can too) leaves a metadata block half old, half new: its checksum fails, and the
file opens under neither header ("Corrupt database file: computed checksum ... in block at
location 12288"). Every record in it would be out of reach.

So kernelext never lets DuckDB checkpoint on its own (``CHECKPOINT_CONFIG``: no automatic
checkpoint, none on shutdown) and checkpoints through ``checkpoint`` only:

1. the blocks DuckDB will rewrite in place (``pragma_metadata_info``) are copied, with the
   header's iteration, into ``<store>.undo``, written whole and synced before anything else;
2. ``CHECKPOINT``;
3. ``<store>.undo`` is removed.

The next open (``undo_interrupted_checkpoint``, under the store's hand-over lock, before
DuckDB opens the file) finds a ``<store>.undo`` left behind by a process that died: if the
file's header did not move, the checkpoint never finished, so the saved blocks are written
back; the file is then exactly what it was before, and its WAL (which DuckDB removes only
after the new header is written) replays everything the checkpoint was moving. If the
header moved, the checkpoint finished and the copy is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct

import duckdb

from ...errors import StoreError
from .platform import sync_data
from .store_files import open_store_file, read_store_file

__all__ = [
    "CHECKPOINT_CONFIG",
    "CHECKPOINT_WAL_BYTES",
    "checkpoint",
    "disable_shutdown_checkpoint",
    "save_undo",
    "undo_before_open",
    "undo_interrupted_checkpoint",
    "wal_is_full",
]

# DuckDB's own triggers, off: a WAL never reaches this size, so no commit checkpoints by
# itself; the writer checkpoints (through ``checkpoint``) when the WAL passes
# ``CHECKPOINT_WAL_BYTES``, and when it lets the file go.
CHECKPOINT_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "checkpoint_threshold": "1000000GB"
}
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024  # DuckDB's own default threshold

_MAGIC = b"kernelext checkpoint undo 2\n"  # 2: with the file's main header, its identity
_MAGIC_1 = b"kernelext checkpoint undo 1\n"  # no identity: read, never written
_MAIN_HEADER = 4096  # DuckDB's main header: written once, with the database's own identifier
_HEAD = struct.Struct("<QQI")  # the header's iteration, the block size, how many blocks
_OFFSET = struct.Struct("<Q")
_DIGEST = 32
_HEADERS = (4096, 8192)  # DuckDB's two database headers; blocks start at 3 * 4096
_FIRST_BLOCK = 3 * 4096
_HEADER_FIELDS = struct.Struct("<QQQQQ")  # iteration, meta block, free list, count, block size


def disable_shutdown_checkpoint(con: duckdb.DuckDBPyConnection) -> None:
    """Closing the file never checkpoints by itself (a read-write connection, before its
    configuration is locked): the writer checkpoints through ``checkpoint`` first."""
    con.execute("PRAGMA disable_checkpoint_on_shutdown")


def _header(fd: int, shown: str) -> tuple[int, int]:
    """The file's newest header: (iteration, block size)."""
    best: tuple[int, int] | None = None
    for offset in _HEADERS:
        raw = os.pread(fd, 8 + _HEADER_FIELDS.size, offset)
        if len(raw) < 8 + _HEADER_FIELDS.size:
            raise StoreError(f"The kernelext store {shown!r} is shorter than its headers.")
        iteration, _meta, _free, _count, block_size = _HEADER_FIELDS.unpack_from(raw, 8)
        if best is None or iteration > best[0]:
            best = (iteration, block_size)
    assert best is not None
    return best


def _encode(iteration: int, block_size: int, blocks: list[tuple[int, bytes]], main: bytes) -> bytes:
    parts = [_MAGIC, _HEAD.pack(iteration, block_size, len(blocks)), main]
    for offset, data in blocks:
        parts += [_OFFSET.pack(offset), data]
    body = b"".join(parts)
    return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()


def _decode(raw: bytes, shown: str) -> tuple[int, int, list[tuple[int, bytes]], bytes | None]:
    """(iteration, block size, blocks, the file's main header: None in a copy of format 1)."""
    body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if (
        len(raw) < len(_MAGIC) + _HEAD.size + _DIGEST
        or not body.startswith((_MAGIC, _MAGIC_1))
        or hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest
    ):
        raise StoreError(
            f"{shown!r} (the blocks a checkpoint of the kernelext store saved before it "
            "rewrote them) is damaged, so an interrupted checkpoint cannot be undone. Keep "
            "a copy of the store's folder and open the store again; if the store opens, "
            f"remove {shown!r}."
        )
    iteration, block_size, count = _HEAD.unpack_from(body, len(_MAGIC))
    at = len(_MAGIC) + _HEAD.size
    main = None
    if body.startswith(_MAGIC):
        main = body[at : at + _MAIN_HEADER]
        at += _MAIN_HEADER
    blocks = []
    for _ in range(count):
        (offset,) = _OFFSET.unpack_from(body, at)
        at += _OFFSET.size
        blocks.append((offset, body[at : at + block_size]))
        at += block_size
    return iteration, block_size, blocks, main


def _sync_folder(path: str) -> None:
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_undo(con: duckdb.DuckDBPyConnection, path: str, fd: int) -> None:
    """Copy the blocks a checkpoint rewrites in place to ``<path>.undo``, durably.

    ``fd``: a descriptor of the store file this process keeps open while connected
    (closing any descriptor of it would drop DuckDB's lock).
    """
    ids = [
        int(row[0]) for row in con.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()
    ]
    iteration, block_size = _header(fd, path)
    blocks = []
    for block_id in sorted(set(ids)):
        offset = _FIRST_BLOCK + block_id * block_size
        data = os.pread(fd, block_size, offset)
        if len(data) != block_size:
            raise StoreError(f"The kernelext store {path!r} ends inside metadata block {block_id}.")
        blocks.append((offset, data))
    raw = _encode(iteration, block_size, blocks, os.pread(fd, _MAIN_HEADER, 0))
    tmp = path + ".undo.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    out = open_store_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(out, view) :]
        sync_data(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(out)
    os.replace(tmp, path + ".undo")
    _sync_folder(path)


def checkpoint(con: duckdb.DuckDBPyConnection, path: str, fd: int) -> bool:
    """Checkpoint the store's WAL into its file, undoable until it is done (see above).

    False, with nothing changed, when the WAL is empty or the copy cannot be written (a full
    disk: the WAL keeps the records, and the next checkpoint tries again). A failing
    ``CHECKPOINT`` raises, and leaves ``<path>.undo`` for the next open.
    """
    try:
        if os.path.getsize(path + ".wal") == 0:
            return False
    except FileNotFoundError:
        return False
    try:
        save_undo(con, path, fd)
    except OSError:
        return False
    con.execute("CHECKPOINT")
    os.unlink(path + ".undo")
    return True


def _lock_whole_file(fd: int, kind: str = "F_WRLCK") -> bool:
    """An open-file-description write lock on the whole file (``kind="F_UNLCK"`` lets it
    go): taken only if no process has the file open through DuckDB, this one included
    (its lock conflicts with this one). True where the platform has none."""
    import fcntl

    command = getattr(fcntl, "F_OFD_SETLK", None)
    if command is None:  # pragma: no cover - macOS: the hand-over lock alone
        return True
    try:
        fcntl.fcntl(fd, command, struct.pack("hhqqi", getattr(fcntl, kind), os.SEEK_SET, 0, 0, 0))
    except OSError:
        return False
    return True


def wal_is_full(path: str) -> bool:
    """The WAL passed ``CHECKPOINT_WAL_BYTES``: time for a checkpoint."""
    try:
        return os.path.getsize(path + ".wal") >= CHECKPOINT_WAL_BYTES
    except OSError:
        return False


def _checkpoint_finished(path: str) -> bool:
    """The checkpoint that left ``<path>.undo`` wrote its new header, or the copy is of
    another file: nothing in it applies. (For a read-only open: the files may be another
    user's.)"""
    raw = read_store_file(path + ".undo", shared=True)
    iteration, _block_size, _blocks, main = _decode(raw, path + ".undo")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        other = main is not None and os.pread(fd, _MAIN_HEADER, 0) != main
        return other or _header(fd, path)[0] > iteration
    finally:
        os.close(fd)


def undo_before_open(path: str, *, read_only: bool, fd: int | None) -> None:
    """Under the hand-over lock, before DuckDB reads ``path``: a checkpoint a dead process
    left half written is undone (``undo_interrupted_checkpoint``). ``fd``: the read-write
    descriptor of the file the connection keeps (None: one is opened and closed)."""
    if not os.path.lexists(path + ".undo"):
        return
    if read_only and not os.access(path, os.W_OK):
        if _checkpoint_finished(path):
            return  # killed before it removed the copy: nothing to undo, nothing to write
        raise StoreError(
            f"The kernelext store {path!r} was left in the middle of a checkpoint by a "
            "process that died, and this read-only open cannot finish it. Open it once "
            "read-write (kx.open_store(path)) as the store's owner, then read it."
        )
    undo_interrupted_checkpoint(path, fd)


def undo_interrupted_checkpoint(path: str, fd: int | None = None) -> bool:
    """Before DuckDB opens ``path``: undo a checkpoint a dead process left half written.

    Called under the store's hand-over lock. True when blocks were written back. ``fd``:
    a read-write descriptor of the file that stays open (closing a descriptor of a file
    drops every POSIX lock this process holds on it: DuckDB's, were it open here).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + ".undo.tmp")  # a copy never finished: its checkpoint never began
    try:
        raw = read_store_file(path + ".undo")
    except FileNotFoundError:
        return False
    iteration, _block_size, blocks, main = _decode(raw, path + ".undo")
    own = fd is None
    if fd is None:
        fd = open_store_file(path, os.O_RDWR)
    try:
        if not _lock_whole_file(fd):
            return False  # DuckDB has it open: its own process finishes or dies first
        try:
            now, _ = _header(fd, path)
            if now < iteration or (main is not None and os.pread(fd, _MAIN_HEADER, 0) != main):
                raise StoreError(
                    f"The kernelext store {path!r} is not the file the checkpoint copy beside "
                    f"it ({path + '.undo'!r}) was taken from (it is older, or another "
                    "database): the file was replaced. Keep both and open the store from the "
                    "file you want."
                )
            restored = now == iteration
            if restored:  # the new header was never written: put the old blocks back
                for offset, data in blocks:
                    os.pwrite(fd, data, offset)
                os.fsync(fd)
            os.unlink(path + ".undo")
            _sync_folder(path)
            return restored
        finally:
            _lock_whole_file(fd, "F_UNLCK")
    finally:
        if own:
            os.close(fd)
