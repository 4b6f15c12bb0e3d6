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

The shared lock is this process's, not a thread's: ``flock`` locks belong to the open
file, so one thread's unlock would let go of every thread's. The threads of a process
appending records for one run at once share one hold of the lock (``_Hold``): the first
takes it and reads the epoch, the last lets go. A hold takes no newcomer after
``HOLD_SECONDS``; once it ends, nobody here takes the lock again for ``YIELD_SECONDS``, so
a take-over polling for it gets in however busy the run is.

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
HOLD_SECONDS = 1.0  # a hold of the shared lock takes newcomers this long, ...
YIELD_SECONDS = 0.025  # ... then, once it ended, is not taken again this long


class _Hold:
    """This process's shared lock on one run's fence, and the epoch read under it."""

    __slots__ = ("epoch", "fd", "holders", "since")

    def __init__(self, fd: int, epoch: int, since: float) -> None:
        self.fd, self.epoch, self.since, self.holders = fd, epoch, since, 1


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
        # A hold began or ended. Entered as ``with self._lock`` (a C-level enter), never as
        # ``with self._turn``: Condition.__enter__ is Python code, and an exception raised
        # into the thread as it returns (KeyboardInterrupt, a forced stop) would leave the
        # lock taken for good, every thread of the process waiting on it.
        self._turn = threading.Condition(self._lock)
        self._holds: dict[str, _Hold] = {}  # run id -> the hold of its lock now
        self._taking: set[str] = set()  # runs whose lock a thread is taking now
        self._resume_at: dict[str, float] = {}  # run id -> no new hold before this
        self._mine = threading.local()  # run id -> how often this thread is in its hold
        self._closed = False  # closed: a descriptor still in use is closed by its last user

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

    def _named(self, run_id: str) -> tuple[int, int] | None:
        """(device, inode) of the file the run's path names now (None: no such file)."""
        try:
            named = os.stat(self.path(run_id), follow_symlinks=False)
        except FileNotFoundError:
            return None
        return named.st_dev, named.st_ino

    def _names_file(self, run_id: str, fd: int) -> bool:
        """The run's path still names the file ``fd`` is open on (not removed, not
        recreated since: a kept descriptor of a removed file would read an old epoch and
        lock a file no take-over locks)."""
        named = self._named(run_id)
        return named is not None and named == self._ids.get(fd)

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
                done = self._stale.pop(run_id, [])
                if self._closed and run_id in self._fds:  # left to its last user by close
                    done.append(self._fds.pop(run_id))
                for stale in done:
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
        was removed: the caller falls back to the tables, and nothing is held).

        The threads inside at once share one hold (see the module doc); the epoch is read
        when the hold begins, under the lock, which no take-over has until it ends."""
        mine: dict[str, int] = self._mine.__dict__.setdefault("runs", {})
        if run_id in mine:  # this thread is in the hold already: never wait for itself
            with self._lock:
                self._holds[run_id].holders += 1
        elif self._enter(run_id) is None:
            yield None
            return
        mine[run_id] = mine.get(run_id, 0) + 1
        try:
            yield self._holds[run_id].epoch
        finally:
            mine[run_id] -= 1
            if not mine[run_id]:
                del mine[run_id]
            self._leave(run_id)

    def _enter(self, run_id: str) -> int | None:
        """Join the run's hold, or begin one (None: no epoch to hold)."""
        came = time.monotonic()
        while True:
            named = self._named(run_id)  # read before the lock: no thread waits on a stat
            with self._lock:
                hold, now = self._holds.get(run_id), time.monotonic()
                # Past WAIT_SECONDS a hold that does not end is joined anyway: one whose
                # holder was cut off between joining and leaving (a KeyboardInterrupt)
                # keeps the lock, as a lock taken and never let go did, but nobody waits.
                # A newcomer joins only while the path still names the held file: a fence
                # removed meanwhile (and made anew by a take-over) is locked afresh.
                if hold is not None and (
                    (now - hold.since < HOLD_SECONDS and named == self._ids.get(hold.fd))
                    or now - came > WAIT_SECONDS
                ):
                    hold.holders += 1
                    return hold.epoch
                pause = self._resume_at.get(run_id, 0.0) - now
                if hold is not None or run_id in self._taking:
                    self._turn.wait(HOLD_SECONDS)  # told when it ends, or when it is taken
                elif pause > 0:
                    self._turn.wait(pause)
                else:
                    self._resume_at.pop(run_id, None)
                    self._taking.add(run_id)
                    break
        held: tuple[int, int] | None = None
        try:
            held = self._lock_shared(run_id)
        finally:
            with self._lock:
                self._taking.discard(run_id)
                if held is not None:
                    self._holds[run_id] = _Hold(held[0], held[1], time.monotonic())
                self._turn.notify_all()
        return None if held is None else held[1]

    def _lock_shared(self, run_id: str) -> tuple[int, int] | None:
        """(descriptor, epoch) with the run's fence locked shared, or None (nothing held).

        The kept descriptor is checked against the path (device, inode) under the lock: a
        fence file removed or recreated since it was opened is reopened, so the lock and
        the epoch read are those of the file a take-over locks."""
        for _ in range(3):
            fd = self._take(run_id)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if self._names_file(run_id, fd):
                    data = os.pread(fd, 8, 0)
                    if len(data) == 8:
                        fd, kept = -1, fd  # the hold keeps it (and its use) until it ends
                        return kept, int.from_bytes(data, "little")
                    return None  # no epoch yet
                self._drop(run_id, fd)  # reopened by path on the next attempt
            finally:
                if fd != -1:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    self._give_back(run_id)
        return None  # removed again and again: the tables say

    def _leave(self, run_id: str) -> None:
        """One thread less in the hold; the last one lets go of the lock."""
        with self._lock:
            hold = self._holds[run_id]
            hold.holders -= 1
            if hold.holders:
                return
            del self._holds[run_id]
            fcntl.flock(hold.fd, fcntl.LOCK_UN)  # before any new hold may take it
            now = time.monotonic()
            if now - hold.since >= HOLD_SECONDS:  # a busy run: a take-over gets its turn
                self._resume_at[run_id] = now + YIELD_SECONDS
                if len(self._resume_at) > KEEP_OPEN:
                    self._resume_at = {r: t for r, t in self._resume_at.items() if t > now}
            self._turn.notify_all()
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
        """Close the descriptors no thread uses; one in use (a hold, a lock being taken: a
        store closed while items append) is closed by its last user, after its unlock: a
        descriptor closed under it could be reused by a file opened next, whose ``flock``
        that unlock would let go."""
        with self._lock:
            self._closed = True
            fds = [self._fds.pop(r) for r in [r for r in self._fds if r not in self._using]]
            for run_id in [r for r in self._stale if r not in self._using]:
                fds += self._stale.pop(run_id)
            for fd in fds:
                self._ids.pop(fd, None)
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
