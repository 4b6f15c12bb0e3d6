"""Run ids, step keys and tool names: checked at the API, before anything is recorded;
and the names kernelext itself records for ``%%agent`` cell runs (their agent name, the
step name that carries a cell's source hash).

A name is part of every key derived from it and is stored as text in both stores, so it
must be text that both keep exactly: not empty, at most ``MAX_NAME`` characters, no NUL
(PostgreSQL refuses it in text) and no lone surrogate (what ``os.listdir`` gives for a
file name that is not UTF-8, e.g. ``"caf\\udce9"``; UTF-8 cannot hold it).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..._formatting import OUTSIDE_STEPS  # the step key of effects called outside any step
from ..._validate import MAX_NAME, name_problem
from ...errors import InvalidName, NameNotText

__all__ = [
    "CELL_AGENT",
    "MAX_NAME",
    "OUTSIDE_STEPS",
    "SOURCE_PREFIX",
    "check_stored_name",
    "source_hash",
    "step_key_of",
]

CELL_AGENT = "%%agent"  # the agent name of runs made of notebook cells
SOURCE_PREFIX = "src:"  # a cell's step name: this, then the hash of its source


def source_hash(source: str) -> str:
    """A hash of a cell's source that ignores trailing whitespace."""
    text = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_stored_name(value: Any, what: str, *, hint: str = "") -> str:
    """``value`` if it is a valid ``what`` (e.g. "run id"); otherwise ``InvalidName``
    saying what is wrong and what to pass instead."""
    fix = hint or "Pass a short, printable text, e.g. 'orders-2026-11'."
    if not isinstance(value, str):
        raise NameNotText(
            f"A {what} must be text (str), not {type(value).__name__} {value!r}. {fix}"
        )
    problem = name_problem(value)
    if problem:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise InvalidName(f"The {what} {shown!r} {problem}; it cannot be stored faithfully. {fix}")
    return value


def step_key_of(value: Any, where: str = "run.steps") -> str:
    """What ``run.steps(key=...)`` (or ``run.map``) returned, as the step key: a ``str``
    or an ``int`` (exactly); anything else (an object's ``str``, a float) is no stable
    identity."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    raise NameNotText(
        f"{where}(key=...) must return a str or an int for each item, not a "
        f"{type(value).__name__}; give each item a stable identity, e.g. "
        f"{where}(items, key=lambda i: i.id)."
    )
