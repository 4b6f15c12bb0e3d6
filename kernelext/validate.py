"""Argument checks shared by the public entry points: a bad value is refused up front,
before anything is read or written, with an error that names the parameter and says what
to pass. Each check returns the value as the caller uses it (a float, a str, ...).

``where`` is how the user wrote the call, e.g. ``"kx.configure(check_timeout=...)"``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
import numbers
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "check_agent_function",
    "check_callable",
    "check_duration",
    "check_effect_function",
    "check_flag",
    "check_name",
    "check_optional_str",
    "check_store",
    "check_store_location",
    "check_text",
    "refuse_unrun_result",
]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_duration(
    where: str, value: object, *, allow_none: bool = False, allow_zero: bool = False
) -> float | None:
    """A positive, finite number of seconds (an int, a float, a numpy number, or a
    ``timedelta``) as a float. ``True``/``False`` are refused (they are ints by accident)."""
    if value is None and allow_none:
        return None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        if type(value).__name__ == "bool_":  # numpy.bool_ is not a Real, but be sure
            raise TypeError(f"{where} takes a number of seconds, not {_shown(value)}.")
        seconds = float(value)
    else:
        none = " (or None for no bound)" if allow_none else ""
        raise TypeError(
            f"{where} takes a number of seconds (or a timedelta){none}, not "
            f"{type(value).__name__} {_shown(value)}."
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{where} takes a finite number of seconds, not {_shown(value)}.")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise ValueError(f"{where} takes a duration of {bound} seconds, not {_shown(value)}.")
    return seconds


def check_flag(where: str, value: object) -> bool:
    """``True`` or ``False`` (``0``/``1`` too, like a ``%config`` Bool)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{where} takes True or False, not {_shown(value)}.")


def check_text(where: str, value: object, *, what: str = "a non-empty string") -> str:
    """A ``str`` that is not empty or blank."""
    if not isinstance(value, str):
        raise TypeError(f"{where} takes {what}, not {type(value).__name__} {_shown(value)}.")
    if not value.strip():
        raise ValueError(f"{where} takes {what}, not an empty or blank string.")
    return value


def check_name(where: str, value: object) -> str:
    """A name (of a tool, an agent, a run): a non-empty ``str``."""
    return check_text(where, value, what="a non-empty name (a str)")


def check_optional_str(where: str, value: object) -> str | None:
    """``None`` or a ``str`` (it may be empty: a note, a source)."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{where} takes a str (or None), not {type(value).__name__} {_shown(value)}.")


def check_callable(where: str, value: object, *, what: str = "a function") -> Callable[..., Any]:
    if not callable(value):
        raise TypeError(f"{where} takes {what}, not {type(value).__name__} {_shown(value)}.")
    return value


def check_store_location(where: str, value: object) -> str:
    """A DuckDB file path (``str`` or ``os.PathLike``) or a ``postgresql://`` URL; a path
    that is a folder is refused (the store is a file inside it)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{where} takes a DuckDB file path or a postgresql:// URL, not "
            f"{type(value).__name__} {_shown(value)}."
        )
    location = os.fspath(value)
    if not isinstance(location, str):  # a bytes path
        raise TypeError(f"{where} takes a path as str (or pathlib.Path), not {_shown(value)}.")
    if not location.strip():
        raise ValueError(f"{where} takes a DuckDB file path or a postgresql:// URL, not ''.")
    if "\0" in location:
        raise ValueError(f"{where}: a path cannot contain a NUL character ({_shown(value)}).")
    if location.startswith(("postgresql://", "postgres://")):
        return location
    if os.path.isdir(location):
        raise ValueError(
            f"{where}: {location!r} is a folder; the store is a file. Pass a file path, e.g. "
            f"{os.path.join(location, 'store.duckdb')!r}."
        )
    return location


def check_store(where: str, value: object) -> None:
    """``None`` (the current store) or a store from ``kx.open_store``."""
    if value is None:
        return
    from .store.base import StoreBase

    if not isinstance(value, StoreBase):
        raise TypeError(
            f"{where} takes a store from kx.open_store(...) (or None for the current one), "
            f"not {type(value).__name__} {_shown(value)}. To use another file, pass "
            "store=kx.open_store(path)."
        )


def _async_call(fn: object) -> bool:
    """A callable object whose ``__call__`` is ``async def``."""
    if inspect.isroutine(fn) or isinstance(fn, type):
        return False
    call = type(fn).__dict__.get("__call__") or getattr(type(fn), "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(call)


def check_effect_function(fn: object) -> None:
    """What ``@kx.effect`` may wrap: a plain (sync) function or callable.

    A generator function or an ``async def`` returns without running its body, so the
    ledger would record ``applied`` for work that never happened: both are refused here.
    """
    from .core.ledger import Effect

    if isinstance(fn, Effect):
        raise TypeError(
            f"{fn!r} is already an effect: wrapping it again would record each call twice. "
            "To give it another name, wrap its function: kx.effect(name=...)(effect.fn)."
        )
    if not callable(fn):
        raise TypeError(
            "kx.effect takes the function to record (use it as @kx.effect above a def, or "
            f"kx.effect(fn)), not {type(fn).__name__} {_shown(fn)}. Options are keywords: "
            "@kx.effect(name='send', resumable=False)."
        )
    name = getattr(fn, "__name__", type(fn).__name__)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"@kx.effect cannot wrap {name}: it is a generator function, whose body runs only "
            "when the generator is iterated, after the ledger would have recorded it as "
            "applied. Make the effect a plain function that does the work and returns its "
            "result (e.g. return list(...)), and iterate in the agent."
        )
    if inspect.iscoroutinefunction(fn) or _async_call(fn):
        raise TypeError(
            f"@kx.effect cannot wrap {name}: async def effects are not supported yet. Wrap the "
            "awaited call in a sync function (e.g. def f(...): return asyncio.run(coro(...)), "
            "or a sync client) and decorate that; the ledger records it when it returns."
        )


def refuse_unrun_result(tool: str, result: object) -> None:
    """An effect's function returned a coroutine or a generator: its work did not run.

    The object is closed (so nothing of it runs later) and ``TypeError`` raised; the ledger
    records the call ``failed`` with this error: nothing external happened.
    """
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()
    elif not inspect.isasyncgen(result):
        return
    kind = type(result).__name__
    raise TypeError(
        f"Effect {tool} returned a {kind} instead of doing its work: the {kind} was never "
        "run (it is closed now), so nothing was sent, and the call is recorded as failed. "
        "An effect must do the work before it returns: await the coroutine inside a sync "
        "function (asyncio.run) or return list(generator)."
    )


def check_agent_function(fn: object) -> None:
    """What ``@kx.agent`` may wrap: a function that takes the run first."""
    if not callable(fn) or isinstance(fn, type):
        raise TypeError(
            "kx.agent takes the agent function, def f(run, ...) (use it as @kx.agent above a "
            f"def), not {type(fn).__name__} {_shown(fn)}. Options are keywords: "
            "@kx.agent(name='triage', max_step_seconds=60)."
        )
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"@kx.agent cannot run {getattr(fn, '__name__', fn)!r}: it is a generator function, "
            "whose body would never run. Make it a plain def that loops over run.steps(...)."
        )
    if inspect.iscoroutinefunction(fn) or _async_call(fn):
        raise TypeError(
            f"@kx.agent cannot run {getattr(fn, '__name__', fn)!r}: async def agents are not "
            "supported yet. Make it a plain def; inside a step, run the coroutine with "
            "asyncio.run(...)."
        )
