"""DuckDB's checkpoint, made safe against a process killed in the middle of it.

A checkpoint moves what the WAL holds into the store file. It writes new data to free
blocks, then rewrites the file's **metadata blocks in place** (the header the file opens
under still points into them), then writes the new header. A process killed inside one of
those block writes (a SIGKILL interrupts a write of several pages between two pages; a
power cut can too) leaves a metadata block half old, half new: its checksum fails, and the
file opens under neither header ("Corrupt database file: computed checksum ... in block at
location 12288"). Every record in it would be out of reach.

So the store keeps a **standing copy**, ``<store>.undo``: the metadata blocks of the header
the file is at, with that header's iteration and the file's main header (its identity),
written whole and synced. kernelext makes sure it is current before every checkpoint of its
own, writes it again after each, and after every open. DuckDB never checkpoints by itself in
kernelext's connections (``CHECKPOINT_CONFIG``: no automatic checkpoint, none on shutdown).
The first checkpoint DuckDB makes in someone else's connection after kernelext had the file
(JupySQL's at close, the ``duckdb`` shell's) starts from the header the copy holds too; a
second one, with no kernelext open between them, does not (not covered).

The next open (``restore_torn_checkpoint``, under the store's hand-over lock, before DuckDB
opens the file, while no DuckDB anywhere has it open) compares: the same file at the same
header whose metadata blocks differ from the copy, one of them failing DuckDB's block
checksum, was cut in the middle of a checkpoint, so the blocks are written back (blocks that
differ whole are a checkpoint the copy never saw, such as a backup put back and checkpointed
by another connection to the same iteration: left as they are). The file is then exactly
what it was before, and its WAL (which DuckDB removes only after the new header) replays
everything the checkpoint was moving. A file at another header, or another file, has
nothing to take from the copy: it is left as it is, and the copy is written again once the
file is open.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct

import duckdb

from ...errors import StoreError
from .platform import sync_data
from .store_files import open_store_file, read_store_file

_log = logging.getLogger("kernelext")

__all__ = [
    "CHECKPOINT_CONFIG",
    "CHECKPOINT_WAL_BYTES",
    "checkpoint",
    "disable_shutdown_checkpoint",
    "keep_copy_current",
    "restore_before_open",
    "restore_torn_checkpoint",
    "save_undo",
    "wal_is_full",
]

# DuckDB's own triggers, off: a WAL never reaches this size, so no commit checkpoints by
# itself; the writer checkpoints (through ``checkpoint``) when the WAL passes
# ``CHECKPOINT_WAL_BYTES``, and when it lets the file go.
CHECKPOINT_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "checkpoint_threshold": "1000000GB"
}
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024  # DuckDB's own default threshold

_MAGIC = b"kernelext checkpoint undo 2\n"
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


_CHECKSUM_SEED = 5381
_CHECKSUM_MULTIPLIER = 0xBF58476D1CE4E5B9
_U64 = (1 << 64) - 1


def _block_is_whole(data: bytes, block_size: int) -> bool:
    """DuckDB's block checksum (its first 8 bytes, over the rest) holds. A block the file
    ends inside is not one a checkpoint rewrote in place: whole, for this purpose."""
    if len(data) != block_size:
        return True
    words: tuple[int, ...] = struct.unpack_from(f"<{block_size // 8}Q", data)
    total = _CHECKSUM_SEED
    for word in words[1:]:
        total ^= (word * _CHECKSUM_MULTIPLIER) & _U64
    return total == words[0]


def _encode(iteration: int, block_size: int, blocks: list[tuple[int, bytes]], main: bytes) -> bytes:
    parts = [_MAGIC, _HEAD.pack(iteration, block_size, len(blocks)), main]
    for offset, data in blocks:
        parts += [_OFFSET.pack(offset), data]
    body = b"".join(parts)
    return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()


class _Copy:
    """A decoded ``<store>.undo``: the header's iteration, the main header, the blocks."""

    def __init__(self, raw: bytes) -> None:
        body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
        if (
            len(raw) < len(_MAGIC) + _HEAD.size + _MAIN_HEADER + _DIGEST
            or not body.startswith(_MAGIC)
            or hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest
        ):
            raise ValueError("damaged")
        self.iteration, block_size, count = _HEAD.unpack_from(body, len(_MAGIC))
        at = len(_MAGIC) + _HEAD.size
        self.main = body[at : at + _MAIN_HEADER]
        at += _MAIN_HEADER
        self.blocks: list[tuple[int, bytes]] = []
        for _ in range(count):
            (offset,) = _OFFSET.unpack_from(body, at)
            at += _OFFSET.size
            self.blocks.append((offset, body[at : at + block_size]))
            at += block_size

    def applies_to(self, fd: int, shown: str) -> bool:
        """The copy is of this file (its identity) at the header it is at now."""
        return (
            os.pread(fd, _MAIN_HEADER, 0) == self.main and _header(fd, shown)[0] == self.iteration
        )

    def torn_blocks(self, fd: int) -> list[tuple[int, bytes]]:
        """The blocks whose bytes in the file are not the copy's: a checkpoint cut short."""
        return [(o, data) for o, data in self.blocks if os.pread(fd, len(data), o) != data]

    def cut_short(self, fd: int) -> list[tuple[int, bytes]]:
        """The blocks to write back: those that differ, when one of them fails its checksum
        (a write cut short). Whole blocks that differ are a checkpoint the copy never saw
        (a backup put back, then checkpointed by another connection, at the same
        iteration): that file is whole, and nothing of the copy belongs in it."""
        differ = self.torn_blocks(fd)
        if any(not _block_is_whole(os.pread(fd, len(data), o), len(data)) for o, data in differ):
            return differ
        return []


def _sync_folder(path: str) -> None:
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_undo(con: duckdb.DuckDBPyConnection, path: str, fd: int) -> None:
    """Write the standing copy of the file's metadata blocks at its current header, durably.

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
    _remove_unfinished(tmp)
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


def _copy_is_current(path: str, fd: int) -> bool:
    """``<path>.undo`` holds the file's metadata blocks at the header it is at now."""
    try:
        copy = _Copy(read_store_file(path + ".undo"))
    except (OSError, StoreError, ValueError):
        return False
    return copy.applies_to(fd, path) and not copy.torn_blocks(fd)


def keep_copy_current(con: duckdb.DuckDBPyConnection, path: str, fd: int) -> bool:
    """After an open: the standing copy is made current if it is not (a new store, a file a
    checkpoint of another connection moved on). False when it cannot be written."""
    if _copy_is_current(path, fd):
        return True
    try:
        save_undo(con, path, fd)
    except (OSError, StoreError):
        return False
    return True


def checkpoint(con: duckdb.DuckDBPyConnection, path: str, fd: int) -> bool:
    """Checkpoint the store's WAL into its file, undoable until it is done (see above).

    False, with nothing changed, when the WAL is empty or the copy cannot be made current
    (a full disk: the WAL keeps the records, and the next checkpoint tries again). A failing
    ``CHECKPOINT`` raises; the copy undoes what it wrote at the next open.
    """
    try:
        if os.path.getsize(path + ".wal") == 0:
            return False
    except FileNotFoundError:
        return False
    if not keep_copy_current(con, path, fd):
        return False
    con.execute("CHECKPOINT")
    with contextlib.suppress(
        OSError, StoreError
    ):  # stale until the next checkpoint or open makes it
        save_undo(con, path, fd)
    return True


def _lock_whole_file(fd: int, kind: str = "F_WRLCK") -> bool:
    """An open-file-description lock on the whole file (``F_WRLCK``, ``F_RDLCK``;
    ``F_UNLCK`` lets it go): taken only if no DuckDB has the file open for writing (a
    write lock: for reading either), in any process, this one included (its lock conflicts
    with this one). True where the platform has none."""
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


def _remove_unfinished(tmp: str) -> None:
    """Remove ``<store>.undo.tmp``, a copy never finished (a file or a link, never followed).
    Anything else there is not kernelext's: refused with what to do."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StoreError(
            f"{tmp!r} beside the kernelext store is not a file kernelext left ({exc.strerror}); "
            f"kernelext writes its checkpoint copy there. Remove it (rm -r {tmp}) if it is not "
            "yours to keep, or point KERNELEXT_STORE (or kx.open_store) at another path."
        ) from None


def _read_copy(path: str, *, shared: bool) -> _Copy | None:
    """The standing copy, or None. A damaged one is moved aside (kept for a person to look
    at) and the store opens without it: it only ever undoes a torn checkpoint."""
    if not shared:
        _remove_unfinished(path + ".undo.tmp")  # a copy never finished: the old one stands
    try:
        raw = read_store_file(path + ".undo", shared=shared)
    except FileNotFoundError:
        return None
    try:
        return _Copy(raw)
    except ValueError:
        if not shared:
            os.replace(path + ".undo", path + ".undo.damaged")
        _log.warning(
            "kernelext: %s (the copy that undoes a checkpoint cut short) is damaged; it was "
            "set aside as %s. The store opens without it.",
            path + ".undo",
            path + ".undo.damaged",
        )
        return None


def restore_before_open(path: str, *, read_only: bool, fd: int | None) -> None:
    """Under the hand-over lock, before DuckDB reads ``path``: a checkpoint cut short is
    undone (``restore_torn_checkpoint``). ``fd``: the read-write descriptor of the file the
    connection keeps (None: one is opened and closed)."""
    if not os.path.lexists(path + ".undo") or not os.path.lexists(path):
        return  # no copy, or no file for it (a new store is made: the copy is replaced)
    if read_only:  # writes nothing: a torn file is refused, with what to do
        copy = _read_copy(path, shared=True)
        if copy is None:
            return
        own = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            torn = _lock_whole_file(own, "F_RDLCK") and (
                copy.applies_to(own, path) and bool(copy.cut_short(own))
            )
            _lock_whole_file(own, "F_UNLCK")
        finally:
            os.close(own)
        if torn:
            raise StoreError(
                f"The kernelext store {path!r} was left in the middle of a checkpoint by a "
                "process that died, and a read-only open cannot finish it (it writes "
                "nothing). Open it once read-write (kx.open_store(path)) as the store's "
                "owner: that puts back the blocks the checkpoint left torn; then read it."
            )
        return
    restore_torn_checkpoint(path, fd)


def restore_torn_checkpoint(path: str, fd: int | None = None) -> bool:
    """Before DuckDB opens ``path``: write back the metadata blocks a checkpoint cut short
    left torn. True when blocks were written back.

    Called under the store's hand-over lock. ``fd``: a read-write descriptor of the file
    that stays open (closing a descriptor of a file drops every POSIX lock this process
    holds on it: DuckDB's, were it open here).
    """
    copy = _read_copy(path, shared=False)
    if copy is None:
        return False
    own = fd is None
    if fd is None:
        fd = open_store_file(path, os.O_RDWR)
    try:
        if not _lock_whole_file(fd):
            return False  # a DuckDB has it open: its own process finishes or dies first
        try:
            if not copy.applies_to(fd, path):
                return False  # another header (or file): the copy is written again later
            torn = copy.cut_short(fd)
            for offset, data in torn:  # the new header was never written: the old blocks
                os.pwrite(fd, data, offset)
            if torn:
                os.fsync(fd)
            return bool(torn)
        finally:
            _lock_whole_file(fd, "F_UNLCK")
    finally:
        if own:
            os.close(fd)
