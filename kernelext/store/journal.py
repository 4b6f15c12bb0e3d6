"""The write-ahead journal: hot-path records are durable after one ``fdatasync``.

A DuckDB commit costs a millisecond or more, which is too much to pay on every step
and effect. Hot-path records (a step begun or completed with its snapshot, an effect's
intent and outcome) are appended to a per-process journal file beside the store and
fsynced; the writer thread then folds them into the tables with group commits, in the
order of the writer's queue. A record counts as stored once its ``fdatasync`` returned.

Each process has its own journal (``<store>.journal.<pid>.<random>``) and holds an
``flock`` on it while it lives. Whoever opens the store folds the journals that nobody
holds any more (a process that was killed) before anything else, skipping the records
already folded (``journal_state.last_seq`` is updated in the same transaction). Records
are idempotent, so folding one twice is harmless.
"""

from __future__ import annotations

import base64
import datetime as dt
import fcntl
import glob
import json
import os
import secrets
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Journal", "Record", "read_records", "write_all"]

Record = tuple[int, str, dict[str, Any]]  # (seq, kind, data)
_HEADER = struct.Struct(">II")  # payload length, crc32
TRUNCATE_AT = 4 << 20


def _encode(obj: Any) -> Any:
    if isinstance(obj, uuid.UUID):
        return {"$u": obj.hex}
    if isinstance(obj, dt.datetime):
        return {"$t": obj.isoformat()}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(obj)).decode()}
    raise TypeError(f"cannot journal {type(obj).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        if "$u" in obj:
            return uuid.UUID(hex=obj["$u"])
        if "$t" in obj:
            return dt.datetime.fromisoformat(obj["$t"])
        if "$b" in obj:
            return base64.b64decode(obj["$b"])
    return obj


def _frame(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps([seq, kind, data], default=_encode, separators=(",", ":")).encode()
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_records(path: str) -> Iterator[Record]:
    """The intact records of a journal file; a torn tail (a crash mid-append) is ignored."""
    with open(path, "rb") as handle:
        blob = handle.read()
    offset = 0
    while offset + _HEADER.size <= len(blob):
        length, crc = _HEADER.unpack_from(blob, offset)
        start = offset + _HEADER.size
        payload = blob[start : start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            return
        seq, kind, data = json.loads(payload, object_hook=_decode)
        yield int(seq), str(kind), data
        offset = start + length


class Journal:
    """This process's journal for one store."""

    def __init__(self, store_path: str) -> None:
        self.store_path = store_path
        self.id = f"{os.getpid()}.{secrets.token_hex(4)}"
        self.path = f"{store_path}.journal.{self.id}"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # alive: nobody else folds this journal
        self._lock = threading.Lock()
        self._pending: list[Record] = []
        self.last_seq = 0
        self.folded_seq = 0  # committed in the tables
        self.applied_seq = 0  # applied in the writer's open transaction (maybe not committed)
        self._bytes = 0
        self.closed = False

    # -- appending (any thread) -------------------------------------------------
    def append(
        self, kind: str, data: dict[str, Any], *, sync: bool, enqueue: Callable[[int], None]
    ) -> int:
        """Write one record; with ``sync`` return only once it is on disk."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the kernelext store is closed")
            self.last_seq += 1
            seq = self.last_seq
            frame = _frame(seq, kind, data)
            write_all(self._fd, frame)
            self._bytes += len(frame)
            self._pending.append((seq, kind, data))
            enqueue(seq)
        if sync:
            os.fdatasync(self._fd)
        return seq

    def sync(self) -> None:
        os.fdatasync(self._fd)

    @property
    def unfolded(self) -> bool:
        return self.folded_seq < self.last_seq

    # -- folding (writer thread) --------------------------------------------------
    def take(self, upto: int) -> list[Record]:
        """Records up to ``upto`` not yet applied in the writer's current transaction."""
        with self._lock:
            records = [r for r in self._pending if self.applied_seq < r[0] <= upto]
            if records:
                self.applied_seq = records[-1][0]
            return records

    def pending_upto(self, upto: int) -> list[Record]:
        with self._lock:
            return [r for r in self._pending if r[0] <= upto]

    def discard(self, seq: int) -> None:
        """Drop a record the tables refuse (it stays in the journal file for inspection)."""
        with self._lock:
            self._pending = [r for r in self._pending if r[0] != seq]
            if not self._pending:
                self.folded_seq = self.last_seq

    def rolled_back(self) -> None:
        """The writer's transaction was rolled back: what it applied must be applied again."""
        with self._lock:
            self.applied_seq = self.folded_seq

    def folded(self, upto: int) -> None:
        """The records up to ``upto`` are committed in the tables."""
        with self._lock:
            self._pending = [r for r in self._pending if r[0] > upto]
            self.folded_seq = max(self.folded_seq, upto)
            if not self._pending and self._bytes >= TRUNCATE_AT:
                os.ftruncate(self._fd, 0)
                self._bytes = 0

    def close(self) -> None:
        """Forget the file if everything was folded; otherwise leave it for recovery."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            done = not self._pending
            if done:
                os.unlink(self.path)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)


def orphaned_journals(store_path: str, own: str | None) -> Iterator[tuple[str, str, int]]:
    """(journal id, path, locked fd) of every journal whose process is gone."""
    prefix = f"{store_path}.journal."
    for path in sorted(glob.glob(glob.escape(prefix) + "*")):
        if path == own:
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        yield path[len(prefix) :], path, fd


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
