"""What travels between a run's owner and the processes that run its items.

A ``RemoteTask`` is one item attempt: where the store is (its URL without a password:
workers connect with their own credentials), the run and the ownership epoch its owner
holds (the worker's writes are fenced with it), the step the owner began for the item,
and ``fn`` and the item, pickled here (cloudpickle when installed, as Dask sends them),
so that what cannot travel is refused before anything is dispatched. An item attempt
answers with a ``RemoteOutcome``: its kind (``done``, ``raised``, ``stopped``,
``waiting``, ``decision``, ``lost``, ``ended``) and what goes with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import traceback
from typing import Any

from ...errors import RemoteItemError, SerializationError
from ..encoding.secrets import scrub_text, scrubbed_excerpt

__all__ = [
    "RemoteOutcome",
    "RemoteTask",
    "dumps",
    "error_from_wire",
    "error_to_wire",
    "loads",
    "pack",
]


def _pickler() -> Any:
    try:
        import cloudpickle  # type: ignore[import-untyped]  # the extra's (kernelext[dask]); Dask's own serializer

        return cloudpickle
    except ImportError:  # a process pool without the extra: functions by reference
        return pickle


def dumps(value: Any) -> bytes:
    return bytes(_pickler().dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def loads(blob: bytes) -> Any:
    return pickle.loads(blob)  # cloudpickle's output is read by plain pickle


def pack(value: Any, what: str, executor: str) -> bytes:
    """``value`` pickled to travel to ``executor``'s workers; a clear error if it cannot."""
    try:
        return dumps(value)
    except Exception as exc:
        raise SerializationError(
            f"run.map(executor={executor}) sends fn and each item to other processes, but "
            f"{what} cannot be sent: {type(exc).__name__}: {scrub_text(str(exc))}. Nothing "
            "was dispatched. Send plain values (dicts, lists, text, numbers, dataframes) and "
            "functions; make what cannot travel (open connections, clients, locks, files) "
            "inside fn, on the worker."
        ) from exc


@dataclasses.dataclass(frozen=True)
class RemoteTask:
    """One item attempt, as the owner dispatches it."""

    url: str  # the store (PostgreSQL), without a password
    run_id: str
    epoch: int  # the owner's ownership epoch: every write of the worker carries it
    agent: str
    key_scheme: int
    chain_root: str
    step_id: Any  # uuid.UUID of the step attempt the owner began
    key: str
    ordinal: int
    name: str | None
    max_step_seconds: float | None
    fn_blob: bytes
    item_blob: bytes

    @property
    def fn_digest(self) -> str:
        return hashlib.sha256(self.fn_blob).hexdigest()


@dataclasses.dataclass(frozen=True)
class RemoteOutcome:
    """How an item attempt ended, as the worker answers."""

    kind: str
    value: Any = None  # done: the stored encoding; waiting: (reason, deadline, note)
    error: bytes | None = None  # raised / decision / lost / stopped: the exception
    elapsed: float = 0.0


def error_to_wire(exc: BaseException) -> bytes:
    """``exc`` pickled with the worker's traceback as a note; when it cannot travel, a
    ``RemoteItemError`` carrying its type name and text (both scrubbed)."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    note = "raised in another process:\n" + scrubbed_excerpt(scrub_text("".join(lines)), 4000)
    try:
        blob = dumps(exc)
        copy = loads(blob)
        if isinstance(copy, BaseException) and _noted(copy, note):
            return dumps(copy)
        return blob
    except Exception:
        text = f"{type(exc).__module__}.{type(exc).__qualname__}: {scrub_text(str(exc))}"
        fallback = RemoteItemError(text)
        _noted(fallback, note)
        return dumps(fallback)


def _noted(exc: BaseException, note: str) -> bool:
    add = getattr(exc, "add_note", None)  # Python 3.11+
    if callable(add):
        add(note)
        return True
    return False


def error_from_wire(blob: bytes | None) -> BaseException:
    if blob is None:
        return RemoteItemError("the item ended without saying why")
    try:
        exc = loads(blob)
    except Exception as fault:  # a class the owner cannot import
        return RemoteItemError(f"an exception that cannot be read here ({fault})")
    if isinstance(exc, BaseException):
        return exc
    return RemoteItemError(repr(exc))
