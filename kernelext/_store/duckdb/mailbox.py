"""Stop requests that reach a run while another process holds the store file.

DuckDB lets one process at a time open the file, and a holder running a long query keeps
it until the query ends. A stop (or a forced stop) asked from another process then cannot
wait for the file: it is appended, as a ``stop_request`` record (``force`` set for a
forced one), to a journal file of the asking process's own and ``fdatasync``ed (see
:func:`post`). The file is left behind unlocked, as a process that ended leaves its
journal: whoever opens the store next folds it (``recovery``), and until then it is
durable where it is. The request's ``request`` id makes folding it twice harmless.

The process that executes the run does not wait for that fold: its monitor reads the
other journal files beside the store (:class:`ForeignStops`: only files whose inode, size
or modification time changed, from the offset read last time, parsing only frames that
mention a stop request), raises the run's stop flag at once and queues the same record
into its own journal, so the stop is folded before the suspension it causes.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import OwnershipLost, StoreError, StoreLockedError
from .fence import FenceFiles
from .frames import parse as _parse
from .handoff import HandoffLock
from .journal import Journal, _cut_short, _frame_at, _resync
from .store_files import open_store_file

if TYPE_CHECKING:
    from .backend import DuckDBConnection

__all__ = ["BUSY_WAIT", "ForeignStops", "Posted", "post", "post_when_busy", "post_when_busy_at"]

BUSY_WAIT = 1.0  # seconds a stop from another process waits for the file before posting
_MARK = b'"stop_request"'
_SEEN_LIMIT = 4096
_HEAD = 16  # bytes of a journal's start remembered (a frame's header and crc are 9)


class Posted(NamedTuple):
    """A stop request journaled because process ``pid`` held the store file."""

    pid: int | None
    since: str | None
    file: str


def post_when_busy(
    conn: DuckDBConnection, data: dict[str, Any], *, epoch: int | None, wait: float = BUSY_WAIT
) -> Posted | None:
    """Post ``data`` (a ``stop_request`` record) if the open store's file stays busy
    ``wait`` seconds; None when this process holds or got the file (then write the request
    in the tables as usual). See :func:`post_when_busy_at`."""
    if conn.read_only or conn.fence is None or conn.con is not None:
        return None
    if not _known(conn.path, str(data["run_id"])):
        return None
    if not conn._mutex.acquire(timeout=wait):  # a long query of this very process
        return _post(conn.path, data, epoch, {"pid": os.getpid()})
    try:
        if conn.con is not None:
            return None
        saved, conn.wait_timeout = conn.wait_timeout, wait
        try:
            conn._open()
            return None
        except StoreLockedError as exc:
            holder = conn.lock.holder() or {"pid": exc.pid}
        finally:
            conn.wait_timeout = saved
    finally:
        conn._mutex.release()
    return _post(conn.path, data, epoch, holder)


def post_when_busy_at(
    store_path: str, data: dict[str, Any], *, epoch: int | None, wait: float = BUSY_WAIT
) -> Posted | None:
    """Post ``data`` (a ``stop_request`` record) if the store file at ``store_path`` stays
    busy ``wait`` seconds, before this process opens the store (opening needs the file);
    None when the file was free (open the store and write the request as usual).

    Only a run the store knows is posted for: its fence file (made when the run was
    created) must exist, else None and the caller waits for the file as before (an
    unknown id then gets its usual answer). ``epoch``: the owner epoch the person saw; a
    run taken over since (the fence holds another epoch) raises ``OwnershipLost``.
    """
    if not _known(store_path, str(data["run_id"])):
        return None
    lock = HandoffLock(store_path)
    try:
        lock.acquire(wait)
    except StoreLockedError as exc:
        return _post(store_path, data, epoch, lock.holder() or {"pid": exc.pid})
    finally:
        lock.close()  # free (or not ours): the caller opens the store as usual
    return None


def _known(store_path: str, run_id: str) -> bool:
    return os.path.isfile(store_path) and os.path.exists(FenceFiles(store_path).path(run_id))


def _post(
    store_path: str, data: dict[str, Any], epoch: int | None, holder: dict[str, Any]
) -> Posted:
    run_id = str(data["run_id"])
    fence = FenceFiles(store_path)
    try:
        fenced = fence.read(run_id)
    finally:
        fence.close()
    if epoch is not None and fenced is not None and fenced != epoch:
        raise OwnershipLost(run_id, owner=None, epoch=fenced, held=epoch, what="stop")
    pid, since = holder.get("pid"), holder.get("since")
    return Posted(
        pid if isinstance(pid, int) else None,
        since if isinstance(since, str) else None,
        post(store_path, data),
    )


def post(store_path: str, data: dict[str, Any]) -> str:
    """Make a ``stop_request`` record durable without the store file; return the file.

    A journal of this process's own is made, the record appended and ``fdatasync``ed,
    the folder synced (so the new name survives a power cut), and the file let go with
    the record in it: it is folded by whoever opens the store next, like the journal of a
    process that ended, and read at once by the process that executes the run.
    """
    journal = Journal(store_path)
    try:
        journal.append("stop_request", data, sync=True, enqueue=lambda: None)
        _sync_folder(os.path.dirname(os.path.abspath(store_path)))
    finally:
        journal.close()  # records left in it: the file stays, unlocked, for the next fold
    return journal.path


def _sync_folder(folder: str) -> None:
    with contextlib.suppress(OSError):  # the record itself is synced already
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ForeignStops:
    """The stop requests other processes journaled for runs this process executes.

    ``poll`` reads only what was appended since the last poll. Each request is returned
    once (by its ``request`` id), and only if it was made at or after ``since`` (a request
    left unfolded from before a run was resumed here is not for this execution).
    """

    def __init__(self, store_path: str, own: str | None) -> None:
        self._prefix = f"{store_path}.journal."
        self._own = own
        self._signals: dict[str, tuple[int, int, int]] = {}  # path -> (inode, size, mtime)
        # path -> (inode, the first bytes read, bytes read)
        self._offsets: dict[str, tuple[int, bytes, int]] = {}
        self._seen: set[str] = set()

    def poll(self, run_ids: Collection[str], since: Any = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        paths = glob.glob(glob.escape(self._prefix) + "*")
        for path in paths:
            if path == self._own:
                continue
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            signal = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._signals.get(path) == signal:
                continue
            self._signals[path] = signal
            found += self._read(path, st.st_ino, run_ids, since)
        gone = set(self._signals) - set(paths)
        for path in gone:  # folded and deleted
            self._signals.pop(path, None)
            self._offsets.pop(path, None)
        return found

    def _read(
        self, path: str, inode: int, run_ids: Collection[str], since: Any
    ) -> list[dict[str, Any]]:
        held, head, offset = self._offsets.get(path, (inode, b"", 0))
        try:
            fd = open_store_file(path, os.O_RDONLY)
        except (OSError, StoreError):  # gone meanwhile, or not a file of ours: not read
            return []
        try:
            size = os.fstat(fd).st_size
            first = os.pread(fd, _HEAD, 0)  # its first frame's header: new after a truncation
            if held != inode or size < offset or first[: len(head)] != head:
                offset = 0  # another file, or truncated after a fold (and written again)
            blob = os.pread(fd, size - offset, offset) if size > offset else b""
        finally:
            os.close(fd)
        used, records = _stop_records(blob)
        self._offsets[path] = (inode, first[: min(_HEAD, offset + used)], offset + used)
        found = []
        for data in records:
            request = data.get("request")
            if data.get("run_id") not in run_ids or not isinstance(request, str):
                continue
            if request in self._seen or (since is not None and data.get("at", since) < since):
                continue
            if len(self._seen) >= _SEEN_LIMIT:
                self._seen.clear()
            self._seen.add(request)
            found.append(data)
        return found


def _stop_records(blob: bytes) -> tuple[int, list[dict[str, Any]]]:
    """(bytes consumed, data of the stop requests) of the frames in ``blob``; a frame cut
    short at the end is left for the next read, damage is skipped."""
    records: list[dict[str, Any]] = []
    offset = 0
    while offset < len(blob):
        found = _frame_at(blob, offset)
        if found is None:
            if _cut_short(blob, offset):
                break
            after = _resync(blob, offset)
            if after is None:
                break
            offset = after
            continue
        end, payload = found
        if _MARK in payload:
            record = _parse(payload)
            if record is not None and record[1] == "stop_request":
                records.append(record[2])
        offset = end
    return offset, records
