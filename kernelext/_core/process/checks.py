"""Checks for recorded facts: naming them so that a fresh process can find them again.

A fact's check is stored by its qualified name, ``module:qualname``. On resume the
name is resolved, in order, through:

1. the explicit registry, ``kx.checks.register(name_or_prefix, fn)``;
2. the module attribute (importing the module if needed; for a notebook the module
   is ``__main__``, so the function is found once its cell has been re-run);
3. the globals of ``__main__`` by bare qualified name (a module that cannot be
   imported any more, e.g. a script run with ``%run``);
4. the function itself, kept in memory by the runtime that recorded the fact (the
   only way a lambda or closure can be found; a fresh process cannot).

A check that resolves nowhere is a contradiction ("cannot re-check"), never a pass.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..._formatting import duration_text
from ...errors import CheckWarning
from .registries import CheckRegistry
from .runtime import runtime

__all__ = [
    "CheckRegistry",
    "CheckWarning",
    "Outcome",
    "call_bounded",
    "local_callable",
    "qualified_name",
    "remember_local",
    "resolve",
]


# -- naming a callable ------------------------------------------------------------------
def qualified_name(fn: Callable[..., Any]) -> tuple[str, bool]:
    """``(module:qualname, portable)``: portable when a fresh process can find it by name."""
    registered = runtime().checks.name_of(fn)
    if registered is not None:
        return registered, True
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qual, str):
        return f"<{type(fn).__name__} object>", False
    name = f"{module}:{qual}"
    if "<lambda>" in qual or "<locals>" in qual:
        return name, False
    if inspect.ismethod(fn) and not isinstance(fn.__self__, type):
        return name, False  # bound to an instance: the name alone loses the instance
    found = _by_attribute(module, qual)
    if found is None:
        return name, False
    return name, _same(found, fn)


def _same(found: Any, fn: Any) -> bool:
    return bool(
        found is fn
        or getattr(found, "__func__", found) is getattr(fn, "__func__", fn)
        or found == fn
    )


def _walk(obj: Any, qual: str) -> Any:
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _by_attribute(module: str, qual: str) -> Any:
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except Exception:  # the module is gone or broken: not resolvable this way
            return None
    return _walk(mod, qual)


def remember_local(run_id: str, fact: str, role: str, fn: Callable[..., Any]) -> None:
    """Keep a lambda or closure of a fact, so that a resume in this runtime can call it."""
    rt = runtime()
    with rt.lock:
        rt.local_checks[(run_id, fact, role)] = fn


def local_callable(run_id: str, fact: str, role: str) -> Callable[..., Any] | None:
    rt = runtime()
    with rt.lock:
        return rt.local_checks.get((run_id, fact, role))


def warn_not_portable(what: str, fact: str, name: str, stacklevel: int = 5) -> None:
    warnings.warn(
        CheckWarning(
            f"The {what} of fact {fact!r} ({name}) is a lambda, closure or bound method: only "
            "a resume in this same process can call it again. A resume in a fresh kernel will "
            "stop on this fact as 'cannot re-check'. Use a module-level (or notebook-level) "
            "function, or register it with kx.checks.register(name, fn)."
        ),
        stacklevel=stacklevel,
    )


def resolve(
    check_name: str | None,
    *,
    run_id: str,
    fact: str,
    role: str = "check",
    use_registry: bool = True,
) -> tuple[Callable[..., Any] | None, str]:
    """Find the callable stored as ``check_name``. Returns ``(fn, '')`` or ``(None, why)``."""
    if use_registry:
        checks = runtime().checks
        found = checks.lookup(check_name, fact) if role == "check" else checks.lookup(check_name)
        if found is not None:
            return found, ""
    if check_name and ":" in check_name and not check_name.startswith("<"):
        module, _, qual = check_name.partition(":")
        if "<" not in qual:
            attr = _by_attribute(module, qual)
            if callable(attr):
                return attr, ""
            main = sys.modules.get("__main__")
            attr = _walk(main, qual) if main is not None else None
            if callable(attr):
                return attr, ""
    local = local_callable(run_id, fact, role)
    if local is not None:
        return local, ""
    if not check_name:
        return None, (
            f"cannot re-check: fact {fact!r} has no {role} and none is registered; "
            f"register one with kx.checks.register({fact!r}, fn)"
        )
    return None, (
        f"cannot re-check: the {role} {check_name} cannot be found in this process. Run the "
        "code (or notebook cell) that defines it, or register it with "
        f"kx.checks.register({check_name!r}, fn), then resume again"
    )


# -- calling checks with a time bound -------------------------------------------------------
class Outcome(NamedTuple):
    status: str  # "ok" | "error" | "timeout"
    value: Any
    detail: str


def call_bounded(
    calls: Sequence[Callable[[], Any]], timeout: float, parallel: int = 8
) -> list[Outcome]:
    """Call each function in a daemon thread; one that runs past ``timeout`` is abandoned.

    At most ``parallel`` calls run at once, each bounded by ``timeout`` seconds from
    its own start. A call that raises gives ``error`` with the exception; one that
    does not return in time gives ``timeout`` (its thread is left to finish alone).
    """
    slots = [_Slot() for _ in calls]
    width = max(1, parallel)
    for start in range(0, len(calls), width):
        began = time.monotonic()
        threads = []
        for index in range(start, min(start + width, len(calls))):
            thread = threading.Thread(
                target=slots[index].fill,
                args=(calls[index],),
                name=f"kernelext-check[{index}]",
                daemon=True,
            )
            thread.start()
            threads.append(index)
        for index in threads:
            slots[index].wait(max(0.0, began + timeout - time.monotonic()), timeout)
    return [slot.outcome for slot in slots]


class _Slot:
    """The result of one bounded call; once abandoned, a late answer is ignored."""

    def __init__(self) -> None:
        self.outcome = Outcome("timeout", None, "")
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._closed = False

    def fill(self, fn: Callable[[], Any]) -> None:
        try:
            outcome = Outcome("ok", fn(), "")
        except BaseException as exc:  # every failure of a check is reported
            outcome = Outcome("error", None, f"{type(exc).__name__}: {exc}"[:1000])
        with self._lock:
            if not self._closed:
                self.outcome = outcome
                self._closed = True
        self._done.set()

    def wait(self, remaining: float, timeout: float) -> None:
        self._done.wait(remaining)
        with self._lock:
            if not self._closed:
                self._closed = True
                self.outcome = Outcome(
                    "timeout", None, f"no answer within {duration_text(timeout)}"
                )
