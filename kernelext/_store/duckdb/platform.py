"""The few operating-system calls the store needs, with what each platform offers.

Supported: Linux (tested) and macOS (POSIX ``flock``; ``fsync`` where ``fdatasync`` is
missing). Windows has no ``fcntl``: the embedded store refuses to open there with a
clear message; point ``KERNELEXT_STORE`` at PostgreSQL instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ...errors import StoreError

__all__ = ["lock_file", "sync_data", "try_lock_file", "unlock_file"]

_fcntl_mod: Any
try:
    import fcntl as _fcntl_mod
except ImportError:  # pragma: no cover - Windows
    _fcntl_mod = None


def _need_fcntl() -> Any:
    if _fcntl_mod is None:  # pragma: no cover - Windows
        raise StoreError(
            f"The embedded kernelext store needs POSIX file locks, which {sys.platform} does "
            "not have. Use a PostgreSQL store: KERNELEXT_STORE=postgresql://... "
            "(or run the notebook under WSL)."
        )
    return _fcntl_mod


def lock_file(fd: int, *, shared: bool = False) -> None:
    """Take an ``flock`` on ``fd``, waiting for it."""
    fcntl = _need_fcntl()
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


def try_lock_file(fd: int, *, shared: bool = False) -> bool:
    """Take an ``flock`` on ``fd`` if nobody holds a conflicting one."""
    fcntl = _need_fcntl()
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock_file(fd: int) -> None:
    fcntl = _need_fcntl()
    fcntl.flock(fd, fcntl.LOCK_UN)


_fdatasync = getattr(os, "fdatasync", None)


def sync_data(fd: int) -> None:
    """Make the file's data durable: ``fdatasync`` on Linux, ``fsync`` where it is missing."""
    if _fdatasync is not None:
        _fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)
