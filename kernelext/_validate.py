"""Argument checks shared by the public entry points: a bad value is refused up front,
before anything is read or written, with an error that names the parameter and says what
to pass. Each check returns the value as the caller uses it (a float, a str, ...).

``where`` is how the user wrote the call, e.g. ``"kx.configure(check_timeout=...)"``.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])
Check = Callable[[str, Any], Any]

__all__ = [
    "check_callable",
    "check_deadline",
    "check_duration",
    "check_flag",
    "check_name",
    "check_optional_str",
    "check_store",
    "check_store_location",
    "check_text",
    "register",
    "store_path_problem",
]


# The kernelext classes the checks here recognise. This module imports nothing of
# kernelext (the store and core layers both use it), so each is registered by the module
# that defines it, right below its class: no instance can exist before its kind is known.
KINDS = ("Effect", "ResumePlan", "StoreBase")
_kinds: dict[str, type] = {}


def register(**kinds: type) -> None:
    """Called at import by the module defining each kind: ``register(Effect=Effect)``."""
    for name, cls in kinds.items():
        if name not in KINDS or not isinstance(cls, type):
            raise TypeError(f"_validate.register: {name}={cls!r} is none of {KINDS}")
        _kinds[name] = cls


def _kind(name: str) -> type | None:
    """The registered class ``name`` (None: its module was never imported, so no value
    passed here can be one)."""
    return _kinds.get(name)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


LONGEST_DURATION = 1000 * 365.25 * 86400  # seconds: every duration's documented maximum
LONGEST_DURATION_TEXT = "1000 years"


def check_duration(
    where: str, value: object, *, allow_none: bool = False, allow_zero: bool = False
) -> float | None:
    """A positive, finite number of seconds (an int, a float, a numpy number, or a
    ``timedelta``) as a float, at most ``LONGEST_DURATION`` (1000 years: the same bound for
    every duration, so a deadline computed from it stays before year 9999).
    ``True``/``False`` are refused (they are ints by accident)."""
    if value is None and allow_none:
        return None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        if type(value).__name__ == "bool_":  # numpy.bool_ is not a Real, but be sure
            raise TypeError(f"{where} takes a number of seconds, not {_shown(value)}.")
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float (10**400)
            raise ValueError(
                f"{where} takes at most {LONGEST_DURATION_TEXT} of seconds "
                f"({LONGEST_DURATION:.0f}), not {_shown(value)}."
            ) from None
    else:
        none = " (or None for no bound)" if allow_none else ""
        raise TypeError(
            f"{where} takes a number of seconds (or a timedelta){none}, not "
            f"{type(value).__name__} {_shown(value)}."
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{where} takes a finite number of seconds, not {_shown(value)}.")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or a positive" if allow_zero else "a positive"
        raise ValueError(f"{where} takes {bound} number of seconds, not {_shown(value)}.")
    if seconds > LONGEST_DURATION:  # a deadline or timeout past year 9999 overflows
        raise ValueError(
            f"{where} takes at most {LONGEST_DURATION_TEXT} of seconds "
            f"({LONGEST_DURATION:.0f}), not {_shown(value)}."
        )
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


MAX_NAME = 1000


_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+")  # '<Invoice object at 0x7f...>'


def name_problem(value: str) -> str:
    """What keeps ``value`` from being stored faithfully as a name ("" when nothing): it is
    part of keys derived from it and stored as text in both stores, so not empty or blank,
    at most ``MAX_NAME`` characters, no NUL (PostgreSQL refuses it in text) and no lone
    surrogate (what ``os.listdir`` gives for a file name that is not UTF-8; UTF-8 cannot
    hold it)."""
    if not value.strip():
        return "is empty" if not value else "is only blanks"
    if len(value) > MAX_NAME:
        return f"has {len(value)} characters (at most {MAX_NAME})"
    if "\0" in value:
        return f"holds a NUL character at position {value.index(chr(0))}"
    if _ADDRESS.search(value):
        return (
            "holds an object's memory address (a default repr, '<... at 0x...>'), which "
            "changes from process to process, so a resume would not find it and would make "
            "its calls again; give each item a stable identity, e.g. "
            "run.steps(items, key=lambda i: i.id)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"holds a lone surrogate {value[exc.start]!r} at position {exc.start} (text "
            "decoded with errors='surrogateescape', e.g. a file name from os.listdir); "
            "decode it properly first, e.g. name.encode('utf-8', 'surrogateescape')"
            ".decode('latin-1')"
        )
    return ""


def check_name(where: str, value: object) -> str:
    """A name (of a tool, an agent, a run, a step): a ``str`` that can be stored
    faithfully (see :func:`name_problem`); otherwise ``InvalidName``."""
    from .errors import InvalidName, NameNotText  # a leaf module: no import circle

    if not isinstance(value, str):
        raise NameNotText(
            f"{where} takes a non-empty name (a str; a run id, step key or tool name), "
            f"not {type(value).__name__} {_shown(value)}."
        )
    problem = name_problem(value)
    if problem:
        raise InvalidName(
            f"{where}: the name {_shown(value)} {problem}; pass a short, printable text."
        )
    return value


def check_optional_str(where: str, value: object) -> str | None:
    """``None`` or a ``str`` (it may be empty: a note, a source)."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{where} takes a str (or None), not {type(value).__name__} {_shown(value)}.")


def check_callable(
    where: str, value: object, *, what: str = "a function (any callable)"
) -> Callable[..., Any]:
    if not callable(value):
        raise TypeError(f"{where} takes {what}, not {type(value).__name__} {_shown(value)}.")
    return value


def store_path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a DuckDB store file, or ``None``.

    A path ending in a separator names a folder (DuckDB would create a *file* of that
    name); on POSIX a backslash is refused because DuckDB reads it as ``/`` while
    kernelext's lock and journal files beside the store use the literal name, so the two
    would live in different places.
    """
    separators = (os.sep, os.altsep) if os.altsep else (os.sep,)
    if path.endswith(separators):
        return (
            f"{path!r} ends in a path separator, so it names a folder; the store is a file. "
            f"Pass a file path, e.g. {os.path.join(path, 'store.duckdb')!r}."
        )
    if os.sep == "/" and "\\" in path:
        return (
            f"{path!r} contains a backslash, which DuckDB reads as '/' while kernelext's "
            "lock and journal files use it literally. Use '/' between folders and no "
            "backslash in names."
        )
    return None


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
    problem = store_path_problem(location)
    if problem:
        raise ValueError(f"{where}: {problem}")
    if os.path.isdir(location):
        raise ValueError(
            f"{where}: {location!r} is a folder; the store is a file. Pass a file path, e.g. "
            f"{os.path.join(location, 'store.duckdb')!r}."
        )
    return location


def check_store(where: str, value: object) -> Any:
    """``None`` (the current store) or a store from ``kx.open_store``."""
    if value is None:
        return None
    StoreBase = _kind("StoreBase")
    if StoreBase is None or not isinstance(value, StoreBase):
        raise TypeError(
            f"{where} takes a store from kx.open_store(...) (or None for the current one), "
            f"not {type(value).__name__} {_shown(value)}. To use another file, pass "
            "store=kx.open_store(path)."
        )
    return value


# -- checks by parameter, for ``validated`` -------------------------------------------------
def optional(check: Check) -> Check:
    """``check``, or ``None``."""

    def checked(where: str, value: Any) -> Any:
        return None if value is None else check(where, value)

    return checked


def check_source(where: str, value: object) -> str:
    """Who asks (``api``, ``cli``, ``panel``...): a short non-empty str."""
    return check_text(where, value, what="a short str naming who asks (e.g. 'api')")


def check_datetime(where: str, value: object) -> Any:
    if not isinstance(value, dt.datetime):
        raise TypeError(
            f"{where} takes a datetime (UTC), not {type(value).__name__} {_shown(value)}."
        )
    return value


def check_args_tuple(where: str, value: object) -> Any:
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{where} takes a tuple of the agent's positional arguments, not "
            f"{type(value).__name__} {_shown(value)}."
        )
    return value


def check_mapping(where: str, value: object) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} takes a dict, not {type(value).__name__} {_shown(value)}.")
    return value


def check_step(where: str, value: object) -> Any:
    """A step: its ordinal (an int, not a bool) or its key (a str)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"{where} takes a step ordinal (int) or a step key (str), not "
            f"{type(value).__name__} {_shown(value)}."
        )
    return value


def check_amount(where: str, value: object) -> float:
    """A finite number (an amount, a tolerance); ``True``/``False`` are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} takes a number, not {type(value).__name__} {_shown(value)}.")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{where} takes a finite number, not {_shown(value)}.")
    return number


def check_iterable(where: str, value: object) -> Any:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{where} takes the items to go through (a list, a generator...), not "
            f"{type(value).__name__} {_shown(value)}."
        )
    return value


def check_count(where: str, value: object) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{where} takes a whole number >= 0, not {_shown(value)}.")
    return value


def check_plan(where: str, value: object) -> Any:
    ResumePlan = _kind("ResumePlan")
    if ResumePlan is None or not isinstance(value, ResumePlan):
        raise TypeError(
            f"{where} takes the plan kx.plan(run_id) returned, not {type(value).__name__} "
            f"{_shown(value)}."
        )
    return value


def check_key(where: str, value: object) -> Any:
    """A key or id: a ``uuid.UUID`` or a non-empty str (whole or a unique prefix)."""
    import uuid

    if isinstance(value, uuid.UUID):
        return value
    return check_text(where, value, what="a key (a uuid.UUID or a non-empty str)")


def check_run_id(where: str, value: object) -> str:
    """A run id: a name kernelext can store faithfully (see :func:`check_name`)."""
    return check_name(where, value)


RUN_ID = check_run_id
OPTIONAL_RUN_ID = optional(check_run_id)
STORE = check_store
SOURCE = check_source
NOTE = check_optional_str
FLAG = check_flag
FUNCTION = check_callable


def validated(label: str, **checks: Check) -> Callable[[F], F]:
    """Check the named parameters of every call before the function runs.

    ``label`` is how users write the call (``"kx.resume"``); an error names the parameter
    as ``kx.resume(store=...)``. A check returns the value the function then gets (a
    duration as a float seconds, a flag as a bool). Parameters left out keep their default.
    """

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        unknown = set(checks) - set(signature.parameters)
        if unknown:
            raise AssertionError(f"{fn.__qualname__} has no parameter(s) {sorted(unknown)}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{label}(): {exc}") from None
            for name, value in bound.arguments.items():
                check = checks.get(name)
                if check is not None:  # the value as the function uses it (a float, ...)
                    bound.arguments[name] = check(f"{label}({name}=...)", value)
            return fn(*bound.args, **bound.kwargs)

        return cast(F, wrapper)

    return decorate


def check_deadline(where: str, value: object) -> Any:
    """A suspension's deadline: ``None`` (the reason's expiry policy), a ``datetime``, or a
    duration from now (seconds or a ``timedelta``, positive, at most 1000 years).

    A naive ``datetime`` is read as UTC, as the store keeps every timestamp; an aware one is
    converted to UTC (both come back naive UTC). A deadline in the past is accepted: the run
    expires at the next sweep.
    """
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.replace(tzinfo=None)
        try:
            return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        except OverflowError:
            raise ValueError(
                f"{where} of {_shown(value)} is past the last time a deadline can hold "
                "(year 9999 in UTC); pass an earlier datetime or None."
            ) from None
    if isinstance(value, (dt.timedelta, numbers.Real)) and not isinstance(value, bool):
        return check_duration(where, value)
    raise TypeError(
        f"{where} takes a datetime (naive means UTC), a number of seconds or a timedelta "
        f"from now, or None; not {type(value).__name__} {_shown(value)}."
    )


def check_wait(where: str, value: object) -> Any:
    """How long to wait: zero or more seconds (``None``: as long as it takes)."""
    return check_duration(where, value, allow_zero=True)


def check_secret(where: str, value: object) -> Any:
    """A secret value: a str or bytes."""
    if not isinstance(value, (str, bytes)):
        raise TypeError(f"{where} takes the secret as a str or bytes, not {type(value).__name__}.")
    return value
