"""The store: schema, migrations and the only code that speaks SQL to a backend."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable

from .approvals import ApprovalsMixin
from .base import StoreBase, actor, utcnow
from .changes import ChangesMixin
from .checkpoints import CheckpointsMixin
from .claims import ClaimsMixin
from .effects import EffectsMixin
from .expiry import ExpiryMixin
from .facts import FactsMixin
from .heartbeats import HeartbeatsMixin
from .posted_stops import PostedStopsMixin
from .questions import QuestionsMixin
from .restart import RestartMixin
from .runs import RunsMixin, Transition
from .steps import Blob, StepsMixin
from .stop_requests import StopRequestsMixin

__all__ = [
    "Blob",
    "Store",
    "Transition",
    "actor",
    "default_store_path",
    "is_postgres",
    "open_store",
    "utcnow",
]

DEFAULT_DIRNAME = ".kernelext"
DEFAULT_FILENAME = "store.duckdb"


class Store(
    ChangesMixin,
    ApprovalsMixin,
    QuestionsMixin,
    CheckpointsMixin,
    RestartMixin,
    ExpiryMixin,
    ClaimsMixin,
    FactsMixin,
    HeartbeatsMixin,
    PostedStopsMixin,
    EffectsMixin,
    StepsMixin,
    StopRequestsMixin,
    RunsMixin,
    StoreBase,
):
    """Every record operation the core needs, on one backend."""


def default_store_path(cwd: str | None = None) -> str:
    """``KERNELEXT_STORE`` if set, else ``.kernelext/store.duckdb`` in the project.

    The project is the nearest folder upwards that holds ``.git`` or ``pyproject.toml``;
    without one, the current folder.
    """
    env = os.environ.get("KERNELEXT_STORE")
    if env:
        return env
    start = os.path.abspath(cwd or os.getcwd())
    folder = start
    while True:
        if any(os.path.exists(os.path.join(folder, m)) for m in (".git", "pyproject.toml")):
            break
        parent = os.path.dirname(folder)
        if parent == folder:
            folder = start
            break
        folder = parent
    return os.path.join(folder, DEFAULT_DIRNAME, DEFAULT_FILENAME)


def is_postgres(location: str) -> bool:
    """Is ``location`` a PostgreSQL URL (its scheme in any case)?"""
    return location[:13].lower().startswith(("postgresql://", "postgres://"))


def open_store(
    location: str | None = None,
    clock: Callable[[], dt.datetime] = utcnow,
    *,
    read_only: bool | None = None,
    wait_timeout: float | None = None,
) -> Store:
    """Open the store at ``location`` (a DuckDB path, or a ``postgresql://`` URL).

    A DuckDB store whose folder cannot be written opens read-only (``read_only=None``);
    ``read_only=True`` asks for that explicitly. ``wait_timeout``: seconds to wait for
    another process to hand a DuckDB file over (default ``KERNELEXT_STORE_WAIT``, 30 s).
    """
    target = location or default_store_path()
    if target.startswith(("postgresql://", "postgres://")):
        from . import postgres_backend  # psycopg is loaded only for a PostgreSQL store

        return Store(postgres_backend.open_postgres(target), clock=clock)
    from .duckdb.backend import open_duckdb
    from .duckdb.connect import coordination_files, remove_created_coordination_files

    new_files = [f for f in coordination_files(target) if not os.path.exists(f)]
    duck = None
    try:
        duck = open_duckdb(target, read_only=read_only, wait_timeout=wait_timeout)
        return Store(duck, clock=clock)
    except BaseException:  # a failed open leaves no .lock/.want of its own behind
        if duck is not None:
            with contextlib.suppress(Exception):
                duck.close()
        remove_created_coordination_files(new_files)
        raise
