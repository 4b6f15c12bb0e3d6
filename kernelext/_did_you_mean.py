"""The one did-you-mean: which known name a mistyped one most likely meant.

Used for run ids (``kx.*``, ``%agent``, ``kernelext``), ``%agent`` sub-commands, command
line commands, option names and statuses, so that every message suggests the same way:
a unique known name that starts with what was typed wins; otherwise the closest by
:mod:`difflib` (similarity 0.6 or more), at most three.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]

CUTOFF = 0.6
MOST = 3


def closest(name: object, candidates: Iterable[object], most: int = MOST) -> list[str]:
    """The candidates ``name`` was most likely meant to be, best first (empty: none close)."""
    typed = str(name)
    pool = [c for c in dict.fromkeys(str(c) for c in candidates) if c != typed]
    starting = [c for c in pool if typed and c.startswith(typed)]
    if len(starting) == 1:
        return starting
    return difflib.get_close_matches(typed, pool, n=most, cutoff=CUTOFF)


def did_you_mean(name: object, candidates: Iterable[object]) -> str:
    """`` Did you mean 'x'?`` (with a leading space) for the closest candidates, or ``""``.

    Put it right after the sentence that names the mistake: ``f"No run {rid!r}.{hint}"``.
    """
    close = closest(name, candidates)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"
