"""The write-ahead journal: hot-path records are durable after one ``fdatasync``.

A DuckDB commit costs a millisecond or more, which is too much to pay on every step
and effect. Hot-path records (a step begun or completed with its snapshot, an effect's
intent and outcome) are appended to a per-process journal file beside the store and
fsynced; the writer thread then folds them into the tables with group commits (see
``fold``). A record counts as stored once its ``fdatasync`` returned, and from then on
it is in the journal file or in the tables, always: nothing is dropped from memory
before its fold committed, and a file is deleted only when everything in it is folded.

Each process has its own journal (``<store>.journal.<pid>.<random>``) and holds an
``flock`` on it while it lives. Whoever opens the store folds the journals that nobody
holds any more (a process that was killed) before anything else.

Frames: see ``frames``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import StoreWriteError
from .frames import (
    FORMAT_VERSION,
    HEADER,
    LEGACY,
    Record,
    encode_body,
    encode_payload,
    frame,
    frame_body,
)
from .frames import parse as _parse
from .platform import lock_file, sync_data, try_lock_file, unlock_file
from .store_files import open_store_file, read_store_file

__all__ = [
    "FORMAT_VERSION",
    "Journal",
    "Record",
    "Scan",
    "encode_payload",
    "frame",
    "orphaned_journals",
    "scan_journal",
    "write_all",
]

_MAX_FRAME = 1 << 30
TRUNCATE_AT = 4 << 20


@dataclass
class Scan:
    """What a journal file holds: its intact records, and where it is damaged."""

    records: list[Record] = field(default_factory=list)
    # (offset, end, why) of each damaged stretch, records after it were found again
    damage: list[tuple[int, int, str]] = field(default_factory=list)
    # payloads whose frame is intact but whose content cannot be read: (offset, text, why)
    unreadable: list[tuple[int, str, str]] = field(default_factory=list)
    torn_tail: bool = False  # the last frame is cut short (a crash mid-append): normal


def _frame_at(blob: bytes, offset: int) -> tuple[int, bytes] | None:
    """(end, payload) of an intact frame at ``offset``, or None."""
    version = blob[offset]
    header = HEADER if version == FORMAT_VERSION else LEGACY if version == 0 else None
    if header is None or offset + header.size > len(blob):
        return None
    if header is HEADER:
        _, length, crc = HEADER.unpack_from(blob, offset)
    else:
        length, crc = LEGACY.unpack_from(blob, offset)
    start = offset + header.size
    if length > _MAX_FRAME or start + length > len(blob):
        return None
    payload = blob[start : start + length]
    if zlib.crc32(payload) != crc:
        return None
    return start + length, payload


def _cut_short(blob: bytes, offset: int) -> bool:
    """Is the frame at ``offset`` a prefix of a frame (an append cut off by a crash)?"""
    version = blob[offset]
    header = HEADER if version == FORMAT_VERSION else LEGACY if version == 0 else None
    if header is None:
        return False
    if offset + header.size > len(blob):
        return True
    length = header.unpack_from(blob, offset)[-2]
    return bool(length <= _MAX_FRAME and offset + header.size + length > len(blob))


def _resync(blob: bytes, offset: int) -> int | None:
    """The offset of the next intact versioned frame after damage at ``offset``."""
    marker = bytes([FORMAT_VERSION])
    probe = blob.find(marker, offset + 1)
    while probe != -1:
        found = _frame_at(blob, probe)
        if found is not None and _parse(found[1]) is not None:
            return probe
        probe = blob.find(marker, probe + 1)
    return None


def scan_journal(path: str) -> Scan:
    """Read every intact record of a journal; note damage instead of stopping at it."""
    blob = read_store_file(path)
    scan = Scan()
    offset = 0
    while offset < len(blob):
        found = _frame_at(blob, offset)
        if found is not None:
            end, payload = found
            record = _parse(payload)
            if record is None:
                text = payload.decode("utf-8", "replace")[:10_000]
                scan.unreadable.append((offset, text, "the payload is not a journal record"))
            else:
                scan.records.append(record)
            offset = end
            continue
        after = _resync(blob, offset)
        if after is None:
            if _cut_short(blob, offset):
                scan.torn_tail = True
            else:
                scan.damage.append((offset, len(blob), "bytes that are not a frame"))
            break
        scan.damage.append((offset, after, "bytes that are not a frame"))
        offset = after
    return scan


class Journal:
    """This process's journal for one store."""

    def __init__(self, store_path: str) -> None:
        self.store_path = store_path
        self.id = f"{os.getpid()}.{secrets.token_hex(4)}"
        self.path = f"{store_path}.journal.{self.id}"
        try:
            self._fd = open_store_file(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        except OSError as exc:
            raise StoreWriteError(
                f"Cannot create the kernelext journal {self.path!r}: {exc.strerror}. The folder "
                "of the store must be writable (and have free space) to run agents; reading "
                "works with a read-only store (kx.open_store(path, read_only=True))."
            ) from None
        lock_file(self._fd)  # alive: nobody else folds this journal
        self._lock = threading.Lock()
        self._folded_cv = threading.Condition(self._lock)  # told when records are folded
        self._sync_lock = threading.Lock()  # one fdatasync at a time (group commit)
        self.synced_seq = 0  # every record up to here is on disk
        self.syncs = 0  # fdatasync calls made (records per sync: benchmarks)
        self._pending: list[Record] = []
        self.last_seq = 0
        self.folded_seq = 0  # every record up to here is committed in the tables
        self.applied_seq = 0  # applied in the writer's open transaction (maybe not committed)
        self._size = 0
        self.closed = False

    # -- appending (any thread) -------------------------------------------------
    def append(
        self, kind: str, data: dict[str, Any], *, sync: bool, enqueue: Callable[[], None]
    ) -> int:
        """Write one record; with ``sync`` return only once it is on disk.

        A write that fails (disk full, I/O error) is cut off again and raises
        :class:`StoreWriteError`: the record was not stored, and the file holds only
        whole records, so later appends and recovery still read it.
        """
        body = encode_body(kind, data)  # before the lock: appending threads encode at once
        with self._lock:
            if self.closed:
                raise RuntimeError("the kernelext store is closed")
            seq = self.last_seq + 1
            payload_frame = frame_body(seq, body)
            before = self._size
            try:
                write_all(self._fd, payload_frame)
            except OSError as exc:
                self._cut(before)
                raise _write_error(self.path, kind, exc) from None
            self._size += len(payload_frame)
            self.last_seq = seq
            self._pending.append((seq, kind, data))
        enqueue()
        if sync:
            self.sync(kind, upto=seq)
        return seq

    def sync(self, kind: str = "record", *, upto: int | None = None) -> None:
        """Make every record appended so far durable (one ``fdatasync``).

        Group commit: threads that append at once share one sync. A caller whose record
        (``upto``) was covered by a sync that began after it was written returns at once;
        the others wait for the sync in progress, and the first of them syncs for all.
        """
        with self._sync_lock:
            if upto is not None and self.synced_seq >= upto:
                return
            with self._lock:
                target = self.last_seq
            try:
                sync_data(self._fd)
            except OSError as exc:
                raise _write_error(self.path, kind, exc) from None
            self.syncs += 1
            self.synced_seq = max(self.synced_seq, target)

    def _cut(self, size: int) -> None:
        with contextlib.suppress(OSError):  # else the torn frame stays; readers skip it
            os.ftruncate(self._fd, size)

    @property
    def unfolded(self) -> bool:
        return self.folded_seq < self.last_seq

    def wait_folded(self, seq: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for record ``seq`` to be folded; True once it is."""
        with self._folded_cv:
            return self._folded_cv.wait_for(lambda: self.folded_seq >= seq, timeout)

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    # -- folding (writer thread) --------------------------------------------------
    def take(self, limit: int | None = None) -> list[Record]:
        """The records not yet applied in the writer's current transaction (all, or the
        first ``limit``)."""
        with self._lock:
            records = [r for r in self._pending if r[0] > self.applied_seq][:limit]
            if records:
                self.applied_seq = records[-1][0]
            return records

    def pending(self) -> list[Record]:
        with self._lock:
            return list(self._pending)

    def rolled_back(self) -> None:
        """The writer's transaction was rolled back: what it applied must be applied again."""
        with self._lock:
            self.applied_seq = self.folded_seq

    def folded(self, upto: int) -> None:
        """The records up to ``upto`` are committed in the tables (or in quarantine)."""
        with self._lock:
            self._pending = [r for r in self._pending if r[0] > upto]
            self.folded_seq = max(self.folded_seq, upto)
            self.applied_seq = max(self.applied_seq, self.folded_seq)
            self._folded_cv.notify_all()
            if not self._pending and self._size >= TRUNCATE_AT:
                try:
                    os.ftruncate(self._fd, 0)
                    self._size = 0
                except OSError:
                    pass  # kept whole; the next fold tries again

    def close(self) -> bool:
        """Forget the file if everything was folded; otherwise leave it for recovery.

        Returns True when records are left in the file.
        """
        with self._lock:
            if self.closed:
                return bool(self._pending)
            self.closed = True
            left = bool(self._pending)
            if not left:
                with contextlib.suppress(OSError):  # an empty one left is folded as nothing
                    os.unlink(self.path)
            unlock_file(self._fd)
            os.close(self._fd)
            return left


def _write_error(path: str, kind: str, exc: OSError) -> StoreWriteError:
    return StoreWriteError(
        f"kernelext could not store a {kind} record in its journal {path!r}: "
        f"{exc.strerror or exc}. Nothing was acknowledged for this call; what was stored "
        "before is kept. Free space (or fix the folder), then resume the run with "
        "kx.resume(run_id)."
    )


def orphaned_journals(store_path: str, own: str | None) -> Iterator[tuple[str, str, int]]:
    """(journal id, path, locked fd) of every journal whose process is gone."""
    prefix = f"{store_path}.journal."
    for path in sorted(glob.glob(glob.escape(prefix) + "*")):
        if path == own:
            continue
        try:
            fd = open_store_file(path, os.O_RDWR)
        except (FileNotFoundError, IsADirectoryError):
            continue
        if not try_lock_file(fd):
            os.close(fd)
            continue
        yield path[len(prefix) :], path, fd


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
