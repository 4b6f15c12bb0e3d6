"""The stores a panel of this user has shown: the notebook server opens no other for a click.

A click's body names its run's store, and whatever controls a widget's state (a shared
notebook's saved widget state, drawn again in someone else's browser) can write that body.
So the notebook server opens a store for a click only when a kernel of the same user drew
buttons for it: kernelext's widgets call :func:`record` as they draw buttons for a store,
in Jupyter's runtime folder (``jupyter --runtime-dir``, private to the user), and the
server asks :func:`was_shown` before it opens any file or connects anywhere.

Each process keeps its own file there, ``kernelext-shown-<pid>.json`` (mode 0600, written
whole and renamed into place, so kernels never lose each other's entries): at most
``MAX_PER_PROCESS`` addresses, each with the time it was last drawn. A file counts while
its process lives on this host, and for ``KEEP_AFTER_EXIT`` seconds after it recorded an
address otherwise (a kernel on another host that shares the folder, an ended kernel);
the next process that records removes the files that no longer count.

Addresses are compared by :func:`store_key`: a PostgreSQL address by what decides where
and how the server connects (host, hostaddr, port, dbname, user and sslmode as libpq
reads them; never its password), a DuckDB path by its real path.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..._store import actor, is_postgres
from .lease import owner_alive

__all__ = [
    "KEEP_AFTER_EXIT",
    "MAX_PER_PROCESS",
    "NOT_SHOWN",
    "record",
    "store_key",
    "was_shown",
]

PREFIX, SUFFIX = "kernelext-shown-", ".json"
MAX_PER_PROCESS = 64  # addresses one process keeps (the most recently drawn)
MAX_FILES = 512  # files read per click (the newest): the folder never makes a click slow
MAX_FILE_BYTES = 64 * 1024
KEEP_AFTER_EXIT = 24 * 3600.0
REFRESH_AFTER = 600.0  # a process rewrites an address it recorded longer ago than this
_KEY_OPTIONS = ("host", "hostaddr", "port", "dbname", "user", "sslmode")
NOT_SHOWN = (
    "The notebook server opens only the stores that a notebook of this server showed "
    "(a run's panel, the runs overview, an approval or question card), and none showed "
    "this one: nothing was opened. Open the run's panel again in a notebook of this "
    "server (kx.panel(run_id), or kx.runs()) and press the button there."
)
_LOCK = threading.Lock()
_RECORDED: dict[tuple[str, str], float] = {}  # (folder, key) -> when this process wrote it


def store_key(address: str) -> str | None:
    """What makes two addresses the same store; None for one that names no store."""
    if not isinstance(address, str) or not address.strip():
        return None
    if is_postgres(address):
        from psycopg import conninfo  # PostgreSQL only

        try:
            options = conninfo.conninfo_to_dict(address)
        except Exception:
            return None
        parts = {name: str(options.get(name, "")) for name in _KEY_OPTIONS}
        parts["host"] = parts["host"].lower()
        return json.dumps(["postgresql", parts], sort_keys=True)
    if not os.path.isabs(address):
        return None
    return json.dumps(["duckdb", os.path.realpath(address)])


def record(folder: str | os.PathLike[str], address: str) -> None:
    """Note in ``folder`` that this process drew buttons for the store at ``address``."""
    key = store_key(address)
    if key is None:
        return
    now = time.time()
    path = Path(folder) / f"{PREFIX}{os.getpid()}{SUFFIX}"
    with _LOCK:
        recent = now - _RECORDED.get((str(folder), key), -REFRESH_AFTER - 1) < REFRESH_AFTER
        if recent and path.exists():
            return
        mine = _read(path) or {}
        stores = [s for s in mine.get("stores", []) if s.get("key") != key]
        stores.append({"key": key, "address": address, "at": now})
        _write(path, {"owner": actor(), "stores": stores[-MAX_PER_PROCESS:]})
        _RECORDED[(str(folder), key)] = now
    _forget_ended(Path(folder), now)


def was_shown(folder: str | os.PathLike[str], address: str) -> bool:
    """Did a process of this user draw buttons for ``address``'s store (and still count)?"""
    key = store_key(address)
    if key is None:
        return False
    now = time.time()
    for _path, content in _files(Path(folder)):
        for entry in content["stores"]:
            if entry.get("key") == key and (now - _at(entry) < KEEP_AFTER_EXIT or _alive(content)):
                return True
    return False


def _alive(content: dict[str, Any]) -> bool:
    owner = content.get("owner")
    return isinstance(owner, str) and owner_alive(owner) is True


def _at(entry: dict[str, Any]) -> float:
    at = entry.get("at")
    return float(at) if isinstance(at, (int, float)) else 0.0


def _files(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    try:
        names = [n for n in os.listdir(folder) if n.startswith(PREFIX) and n.endswith(SUFFIX)]
    except OSError:
        return []
    found: list[tuple[Path, dict[str, Any]]] = []
    for name in names[:MAX_FILES]:
        content = _read(folder / name)
        if content is not None:
            found.append((folder / name, content))
    return found


def _read(path: Path) -> dict[str, Any] | None:
    """The file's content when it is a small regular file of this user that only this
    user may write; None otherwise (missing, foreign, damaged)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o022):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            content = json.loads(handle.read(MAX_FILE_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(content, dict) or not isinstance(content.get("stores", []), list):
        return None
    content["stores"] = [s for s in content.get("stores", []) if isinstance(s, dict)]
    return content


def _write(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{PREFIX}", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:  # mkstemp: mode 0600
            json.dump(content, handle)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _forget_ended(folder: Path, now: float) -> None:
    """Remove the files that no longer count: no live process here, nothing recent."""
    for path, content in _files(folder):
        if _alive(content):
            continue
        if all(now - _at(entry) >= KEEP_AFTER_EXIT for entry in content["stores"]):
            with contextlib.suppress(OSError):
                path.unlink()
