"""Per-run fence files beside an embedded store: the ownership epoch, readable in a pread.

On DuckDB an effect's intent is appended to this process's journal and folded into the
tables later, so a check of ``runs.owner_epoch`` made when the intent is folded comes after
the call. The fence makes the check happen before it, linearizable with take-overs:

- ``<store>.fence/<hash of the run id>`` holds the run's current ownership epoch (8 bytes);
- an owner holds a *shared* ``flock`` on it while it checks the epoch and appends (and
  fsyncs) the intent; a different epoch refuses the intent (``OwnershipLost``);
- a take-over holds it *exclusively* while it writes the new epoch, inside the take-over's
  transaction and before that commits. Once it has the lock, every intent checked against
  the old epoch is in a journal file, and every later check sees the new epoch.

So an intent is either appended before the take-over (and the take-over finds it in the
journal files and folds it first, see ``foreign_records``) or refused. ``flock`` never
survives its process: a killed owner holds nothing. A frozen one (SIGSTOP) while checking
keeps the shared lock: a take-over waits ``WAIT_SECONDS`` for it, then refuses.

A fence file removed while a process keeps it open (``rm -r <store>.fence``) is noticed
under the shared lock (the path no longer names the open file): the path is reopened, and a
missing file reads as "no fence yet", so the epoch comes from the tables. Removing the
folder in the instant between an owner's check and its append is not covered (the take-over
locks the new file only); do not remove the fence folder of a store in use.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import os
import threading
import time
from collections.abc import Iterator

from ..._formatting import duration_text
from ...errors import RunStateError
from ..records import FENCED
from .journal import Record, scan_journal
from .store_files import open_folder, open_store_file

__all__ = ["FenceFiles", "foreign_records"]

WAIT_SECONDS = 5.0
KEEP_OPEN = 64  # descriptors kept open (one per run recently written)


class FenceFiles:
    """The fence files of one store (one open descriptor per run, kept)."""

    def __init__(self, store_path: str) -> None:
        self.folder = f"{store_path}.fence"
        self._fds: dict[str, int] = {}
        self._using: dict[str, int] = {}  # run id -> threads inside ``shared`` now
        self._stale: dict[str, list[int]] = {}  # run id -> descriptors of removed files
        self._ids: dict[int, tuple[int, int]] = {}  # kept descriptor -> (device, inode)
        self._paths: dict[str, str] = {}
        self._lock = threading.Lock()

    def path(self, run_id: str) -> str:
        path = self._paths.get(run_id)
        if path is None:
            digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
            path = os.path.join(self.folder, digest)
            if len(self._paths) >= 4 * KEEP_OPEN:
                self._paths.clear()
            self._paths[run_id] = path
        return path

    def _open(self, run_id: str) -> int:
        """The run's fence file, opened inside the folder's descriptor (a folder made 0700,
        never a link; the file never through one)."""
        folder = open_folder(self.folder)
        try:
            path = self.path(run_id)
            name = os.path.basename(path)
            return open_store_file(name, os.O_RDWR | os.O_CREAT, dir_fd=folder, shown=path)
        finally:
            os.close(folder)

    def _take(self, run_id: str) -> int:
        """The run's descriptor, marked in use (kept open for the next record; at most
        ``KEEP_OPEN`` idle ones are kept, so a long-lived kernel never runs out of them)."""
        with self._lock:
            fd = self._fds.get(run_id)
            if fd is None:
                fd = self._fds[run_id] = self._open(run_id)
                held = os.fstat(fd)  # a descriptor stays on its file: read once
                self._ids[fd] = (held.st_dev, held.st_ino)
            self._using[run_id] = self._using.get(run_id, 0) + 1
            return fd

    def _names_file(self, run_id: str, fd: int) -> bool:
        """The run's path still names the file ``fd`` is open on (not removed, not
        recreated since: a kept descriptor of a removed file would read an old epoch and
        lock a file no take-over locks)."""
        try:
            named = os.stat(self.path(run_id), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (named.st_dev, named.st_ino) == self._ids.get(fd)

    def _drop(self, run_id: str, fd: int) -> None:
        """Stop using a kept descriptor whose file the path no longer names (closed once
        no thread of this process uses the run's fence)."""
        with self._lock:
            if self._fds.get(run_id) == fd:
                del self._fds[run_id]
                self._stale.setdefault(run_id, []).append(fd)

    def _give_back(self, run_id: str) -> None:
        with self._lock:
            left = self._using[run_id] - 1
            if left:
                self._using[run_id] = left
            else:
                del self._using[run_id]
                for stale in self._stale.pop(run_id, []):
                    self._ids.pop(stale, None)
                    with contextlib.suppress(OSError):
                        os.close(stale)
            if len(self._fds) > KEEP_OPEN:
                for idle in [r for r in self._fds if r not in self._using][: len(self._fds) // 2]:
                    fd = self._fds.pop(idle)
                    self._ids.pop(fd, None)
                    with contextlib.suppress(OSError):
                        os.close(fd)

    @contextlib.contextmanager
    def shared(self, run_id: str) -> Iterator[int | None]:
        """Hold the run's fence shared; yields its epoch (None: no fence file yet, or it
        was removed: the caller falls back to the tables).

        Under the lock the kept descriptor is checked against the path (device, inode):
        a fence file removed or recreated since it was opened is reopened, so the lock and
        the epoch read are those of the file a take-over locks."""
        for attempt in range(3):
            fd = self._take(run_id)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                try:
                    if self._names_file(run_id, fd):
                        data = os.pread(fd, 8, 0)
                        yield int.from_bytes(data, "little") if len(data) == 8 else None
                        return
                    self._drop(run_id, fd)  # reopened by path on the next attempt
                    if attempt == 2:  # removed again and again: the tables say
                        yield None
                        return
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                self._give_back(run_id)

    def read(self, run_id: str) -> int | None:
        with self.shared(run_id) as epoch:
            return epoch

    def advance(self, run_id: str, epoch: int, *, wait: float = WAIT_SECONDS) -> None:
        """Write ``epoch`` under the exclusive lock (a descriptor of its own, so that a
        thread of this very process that holds the fence shared is waited for too)."""
        fd = self._open(run_id)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() > deadline:
                    raise RunStateError(
                        f"Run {run_id!r} cannot be taken over now: its owner is recording an "
                        f"effect's intent and has held the run's fence ({self.path(run_id)}) "
                        f"for over {duration_text(wait)} (a frozen process?). Try again; if it "
                        "stays frozen, end that process first."
                    )
                time.sleep(0.005)
            os.pwrite(fd, int(epoch).to_bytes(8, "little"), 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def start(self, run_id: str, epoch: int) -> None:
        """Write ``epoch`` only if the run has no fence yet (a run from before fences): a
        take-over that wrote one meanwhile is never overwritten with an older epoch."""
        fd = self._open(run_id)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if len(os.pread(fd, 8, 0)) != 8:
                os.pwrite(fd, int(epoch).to_bytes(8, "little"), 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
            fds += [fd for kept in self._stale.values() for fd in kept]
            self._stale, self._ids = {}, {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def foreign_records(
    store_path: str, own: str | None, run_id: str, kinds: tuple[str, ...] = FENCED
) -> Iterator[tuple[str, list[Record]]]:
    """(journal id, records of run ``run_id`` of the ``kinds`` given) of every other
    journal file of the store (live processes' included): what a previous owner appended
    and may not have folded.

    Read without locks: appends are whole frames (a torn last frame is skipped), and the
    take-over that asks holds the fence, so no intent of the old epoch is appended now.
    """
    prefix = f"{store_path}.journal."
    for path in sorted(glob.glob(glob.escape(prefix) + "*")):
        if path == own:
            continue
        try:
            records = scan_journal(path).records
        except OSError:
            continue
        mine = [r for r in records if r[1] in kinds and r[2].get("run_id") == run_id]
        if mine:
            yield path[len(prefix) :], mine
