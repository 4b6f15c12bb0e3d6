"""Large payloads in side files, written durably, in the background when possible.

A payload over the inline limit is written to ``<blob dir>/<name>.tmp``, fsynced, then
renamed to its blob id. ``stage`` starts that write on a helper thread as soon as the
payload is encoded, so the disk works while the caller hashes the same bytes (both let
go of the GIL); ``StagedPayload.commit`` waits for it and renames.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

from .journal import write_all

__all__ = ["StagedPayload", "stage", "write_durably"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kernelext-payload")
        return _POOL


def write_durably(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (created 0600) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


class StagedPayload:
    """A payload being written to a temporary side file by a helper thread."""

    def __init__(self, folder: str, data: bytes) -> None:
        self.tmp = os.path.join(folder, f"{uuid.uuid4().hex}.tmp")
        self._done: Future[None] = _pool().submit(write_durably, self.tmp, data)

    def commit(self, path: str) -> None:
        """Wait until the payload is durable, then give it its final name."""
        self._done.result()
        os.replace(self.tmp, path)

    def discard(self) -> None:
        """The payload will not be used (the step failed): remove the temporary file."""
        with contextlib.suppress(Exception):
            self._done.result()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


def stage(folder: str, data: bytes) -> StagedPayload:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return StagedPayload(folder, data)
