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
from typing import Any

from ...errors import IntegrityError, StoreWriteError
from ..columns import refuse_secret
from .journal import write_all
from .store_files import open_store_file, own_folder, read_store_file

__all__ = [
    "SideFiles",
    "StagedPayload",
    "blob_folder",
    "inside",
    "locate_side_file",
    "read_side_file",
    "side_file_candidates",
    "side_file_error",
    "side_file_location",
    "stage",
    "write_durably",
]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kernelext-payload")
        return _POOL


def blob_folder(folder: str) -> None:
    """Make (0700) or check a run's side-file folder and the blob folder above it."""
    own_folder(os.path.dirname(folder))
    own_folder(folder)


def write_durably(path: str, data: bytes) -> None:
    """Write ``data`` to the new file ``path`` (created 0600, never through a link) and
    fsync it."""
    fd = open_store_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
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
        """Wait until the payload is durable, then give it its final name.

        A write that failed (disk full, I/O error) raises :class:`StoreWriteError`, and the
        temporary file is removed: nothing refers to it."""
        try:
            self._done.result()
            os.replace(self.tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(self.tmp)
            raise side_file_error(path, exc) from None

    def discard(self) -> None:
        """The payload will not be used (the step failed): remove the temporary file."""
        with contextlib.suppress(Exception):
            self._done.result()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


def stage(folder: str, data: bytes) -> StagedPayload:
    refuse_secret(data, "a snapshot value (side file)")  # the door for side files
    try:
        blob_folder(folder)
    except OSError as exc:
        raise side_file_error(folder, exc) from None
    return StagedPayload(folder, data)


def side_file_error(path: str, exc: OSError) -> StoreWriteError:
    return StoreWriteError(
        f"kernelext could not write the side file {path!r} of a large payload: "
        f"{exc.strerror or exc}. Nothing was acknowledged for it (the step did not complete); "
        "what was stored before is kept. Free space (or fix the folder), then resume the run "
        "with kx.resume(run_id)."
    )


def side_file_candidates(location: str, root: str) -> list[str]:
    """Where the side file of a ``file:`` location can be, the likeliest first.

    ``root`` is the store's blob folder (``<store>.blobs``). A relative location (what
    kernelext writes) is under it; one that leads out of it (``file:../../etc/passwd``)
    raises :class:`IntegrityError`, so nothing outside is read, linked or removed. An
    absolute one (what earlier releases wrote) is first looked for under ``root``
    by its last two parts (``<run folder>/<blob id>``), so a project folder that was moved
    or copied reads its own files, then where it was written.
    """
    path = location.removeprefix("file:")
    if not os.path.isabs(path):
        here = os.path.normpath(os.path.join(root, path))
        if here == os.path.normpath(root) or not inside(here, root):
            raise IntegrityError(
                f"The side-file location {location!r} in the blobs table points outside the "
                f"store's side-file folder {root}; it was not read. Side-file locations are "
                "'file:<run folder>/<blob id>' under that folder: the row was changed by hand "
                "or by something other than kernelext."
            )
        return [here]
    parent, name = os.path.split(path)
    here = os.path.join(root, os.path.basename(parent), name)
    return [here] if here == path else [here, path]


def side_file_location(run_folder: str, blob_hex: str) -> str:
    """The ``blobs.location`` of a side file: relative to the store's blob folder, with
    ``/`` on every platform, so the project folder can be moved or copied."""
    return f"file:{run_folder}/{blob_hex}"


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (by name: ``..`` parts are resolved)."""
    top = os.path.normpath(os.path.abspath(root))
    try:
        return os.path.commonpath([top, os.path.normpath(os.path.abspath(path))]) == top
    except ValueError:  # another drive (Windows), or one path relative and one absolute
        return False


def locate_side_file(location: str, root: str) -> str:
    """The first candidate path that exists; where the file belongs if none does."""
    candidates = side_file_candidates(location, root)
    return next((p for p in candidates if os.path.exists(p)), candidates[0])


def read_side_file(location: str, root: str, *, shared: bool = False) -> tuple[str, bytes | None]:
    """(path, bytes) of a side file; when it is nowhere, (where it belongs, ``None``).
    ``shared``: a read-only store's files may be another user's."""
    candidates = side_file_candidates(location, root)
    for path in candidates:
        try:
            return path, read_store_file(path, shared=shared)
        except FileNotFoundError:
            continue
    return candidates[0], None


class SideFiles:
    """The side-file folder of one store, ``<store>.blobs/<run folder>/<blob id>``."""

    def __init__(self, store_path: str, *, read_only: bool = False) -> None:
        self.root = store_path + ".blobs"
        self.read_only = read_only

    def run_dir(self, run_id: str) -> str:
        return os.path.join(self.root, run_folder(run_id))

    def location(self, run_id: str, blob_id: uuid.UUID) -> str:
        return side_file_location(run_folder(run_id), blob_id.hex)

    def stage(self, run_id: str, data: bytes) -> StagedPayload:
        """Start writing a payload on a helper thread (see :class:`StagedPayload`)."""
        return stage(self.run_dir(run_id), data)

    def store(self, run_id: str, blob_id: uuid.UUID, data: bytes, staged: Any) -> str:
        """Make a payload durable under its final name; return its ``blobs.location``."""
        folder = self.run_dir(run_id)
        path = os.path.join(folder, blob_id.hex)
        if staged is not None:
            staged.commit(path)
        else:
            refuse_secret(data, "a snapshot value (side file)")
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            try:
                blob_folder(folder)
                write_durably(tmp, data)
                os.replace(tmp, path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise side_file_error(path, exc) from None
        return self.location(run_id, blob_id)

    def locate(self, location: str) -> str:
        return locate_side_file(location, self.root)

    def read(self, location: str) -> tuple[str, bytes | None]:
        return read_side_file(location, self.root, shared=self.read_only)

    def contains(self, path: str) -> bool:
        return inside(path, self.root)


def run_folder(run_id: str) -> str:
    """The name of a run's folder under the blob folder (any run id is a safe name)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, run_id).hex
