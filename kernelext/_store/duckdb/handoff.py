"""Sharing one DuckDB file between processes by handing the connection over.

DuckDB lets one process at a time open a file, and a second one fails at once.
kernelext processes therefore take turns: a process holds an exclusive ``flock`` on
``<store>.lock`` while its connection is open. A process that wants the store takes
a shared lock on ``<store>.want`` while it waits; the holder sees that after its
current group commit (or within one idle tick) and closes its connection. A holder
with nothing to do lets go after a short linger anyway, so that other kernels, the
command line and ``kx.sql`` elsewhere can read. The lock file names its holder
(PID, host, since when) for error messages.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import time

from ..._formatting import duration_text
from ...errors import StoreError, StoreLockedError
from .platform import lock_file, try_lock_file, unlock_file
from .store_files import open_store_file, read_store_file

__all__ = ["HandoffLock"]


class HandoffLock:
    def __init__(self, store_path: str, *, read_only: bool = False) -> None:
        self.store_path = store_path
        self.read_only = read_only  # a read-only folder: take turns only if a lock file exists
        self.lock_path = store_path + ".lock"
        self.want_path = store_path + ".want"
        self._fd: int | None = None
        self._want_fd: int | None = None
        self._courtesy_until = 0.0
        if not read_only:  # so that a read-only opener, who cannot create it, can signal
            with contextlib.suppress(OSError):
                os.close(open_store_file(self.want_path, os.O_RDWR | os.O_CREAT))

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float) -> None:
        """Take the store, waiting up to ``timeout`` seconds for the holder to hand over."""
        if self._fd is not None:
            return
        self._let_waiter_in()
        fd = self._open(self.lock_path)
        if fd is None:  # a read-only folder nobody ever wrote a lock file into
            self._fd = -1
            return
        try:
            if not try_lock_file(fd):
                self._wait(fd, timeout)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if self.read_only:
            return
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)

    def _wait(self, fd: int, timeout: float) -> None:
        want = self._open(self.want_path)
        if want is None:
            want = os.open(os.devnull, os.O_RDONLY)  # nobody to tell
        try:
            lock_file(want, shared=True)  # tell the holder someone waits
            deadline = time.monotonic() + timeout
            pause = 0.001
            while not try_lock_file(fd):
                if time.monotonic() >= deadline:
                    holder = self.holder()
                    pid = holder.get("pid") if holder else None
                    raise StoreLockedError(
                        self.store_path,
                        pid if isinstance(pid, int) else None,
                        f"waited {duration_text(timeout)}; held since {holder.get('since')}"
                        if holder
                        else f"waited {duration_text(timeout)}",
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        finally:
            unlock_file(want)
            os.close(want)

    def others_waiting(self) -> bool:
        """True when another process (or store object) waits for this store."""
        if self._want_fd is None:
            self._want_fd = self._open(self.want_path)
            if self._want_fd is None:
                return False
        if try_lock_file(self._want_fd):
            unlock_file(self._want_fd)
            return False
        return True

    def _let_waiter_in(self) -> None:
        """After handing over, give the waiter time to take the lock before taking it back."""
        me = os.getpid()
        while time.monotonic() < self._courtesy_until:
            holder = self.holder()
            if holder is not None and holder.get("pid") != me:
                break
            time.sleep(0.002)
        self._courtesy_until = 0.0

    def release(self, *, handing_over: bool = False) -> None:
        if handing_over:
            self._courtesy_until = time.monotonic() + 0.5
        fd, self._fd = self._fd, None
        if fd is not None and fd >= 0:
            unlock_file(fd)
            os.close(fd)

    def close(self) -> None:
        self.release()
        if self._want_fd is not None:
            os.close(self._want_fd)
            self._want_fd = None

    def _open(self, path: str) -> int | None:
        """Open (creating) a coordination file; read-only: only an existing one, or None."""
        if not self.read_only:
            return open_store_file(path, os.O_RDWR | os.O_CREAT)
        try:
            return open_store_file(path, os.O_RDONLY, shared=True)
        except FileNotFoundError:
            return None

    def holder(self) -> dict[str, object] | None:
        try:
            text = read_store_file(self.lock_path, shared=True).decode()
            data = json.loads(text) if text else None
        except (OSError, ValueError, StoreError):
            return None
        return data if isinstance(data, dict) else None
