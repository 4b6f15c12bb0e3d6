"""Run ids, step keys and tool names: checked at the API, before anything is recorded.

A name is part of every key derived from it and is stored as text in both stores, so it
must be text that both keep exactly: not empty, at most ``MAX_NAME`` characters, no NUL
(PostgreSQL refuses it in text) and no lone surrogate (what ``os.listdir`` gives for a
file name that is not UTF-8, e.g. ``"caf\\udce9"``; UTF-8 cannot hold it).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidName

__all__ = ["MAX_NAME", "check_name"]

MAX_NAME = 1000


def check_name(value: Any, what: str, *, hint: str = "") -> str:
    """``value`` if it is a valid ``what`` (e.g. "run id"); otherwise ``InvalidName``
    saying what is wrong and what to pass instead."""
    fix = hint or "Pass a short, printable text, e.g. 'orders-2026-11'."
    if not isinstance(value, str):
        raise InvalidName(
            f"A {what} must be text (str), not {type(value).__name__} {value!r}. {fix}"
        )
    problem = ""
    if not value.strip():
        problem = "is empty" if not value else "is only blanks"
    elif len(value) > MAX_NAME:
        problem = f"has {len(value)} characters (at most {MAX_NAME})"
    elif "\0" in value:
        problem = f"holds a NUL character at position {value.index(chr(0))}"
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            problem = (
                f"holds a lone surrogate {value[exc.start]!r} at position {exc.start} (text "
                "decoded with errors='surrogateescape', e.g. a file name from os.listdir); "
                "decode it properly first, e.g. name.encode('utf-8', 'surrogateescape')"
                ".decode('latin-1')"
            )
    if problem:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise InvalidName(f"The {what} {shown!r} {problem}; it cannot be stored faithfully. {fix}")
    return value
