"""Which column each ``?`` of a write statement lands in: our own SQL text, read once.

:func:`param_columns` maps an ``INSERT`` / ``UPDATE`` statement's parameters to their
``(table, column)`` (cached per SQL string) so that :mod:`kernelext._store.columns`
can scrub each as the column it is declared as. A statement it cannot read maps to
``None`` (every parameter is then scrubbed as text); one that writes nothing to ``()``.
"""

from __future__ import annotations

import functools
import re

__all__ = ["Plan", "param_columns"]

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\?|[(),=]|[A-Za-z_][\w.]*|\S")
_NO_WRITE: tuple[str, ...] = ()
# A plan: one (table, column) per ``?``; None for a ``?`` that is not written (WHERE ...);
# _ALL_TEXT when the statement could not be read.
Plan = tuple[tuple[str, str] | None, ...] | None
_ALL_TEXT = None


class _Unreadable(Exception):
    pass


def _groups(tokens: list[str], start: int) -> tuple[list[list[str]], int]:
    """The comma-separated items of the parenthesised list at ``tokens[start]`` (``(``)."""
    if tokens[start] != "(":
        raise _Unreadable
    items: list[list[str]] = [[]]
    depth = 0
    for i in range(start, len(tokens)):
        t = tokens[i]
        if t == "(":
            depth += 1
            if depth == 1:
                continue
        elif t == ")":
            depth -= 1
            if depth == 0:
                return items, i + 1
        if depth == 1 and t == ",":
            items.append([])
        else:
            items[-1].append(t)
    raise _Unreadable


def _tuples(tokens: list[str], i: int, columns: list[str | None]) -> tuple[list[str | None], int]:
    """``(?, ?), (?, ?)`` at ``i``: the column of each ``?`` in them."""
    out: list[str | None] = []
    while True:
        items, i = _groups(tokens, i)
        if len(items) != len(columns):
            raise _Unreadable
        for item, col in zip(items, columns, strict=True):
            out.extend(col for t in item if t == "?")
        if i < len(tokens) and tokens[i] == ",":
            i += 1
            continue
        return out, i


def _assignments(
    tokens: list[str], i: int, stop: set[str]
) -> tuple[list[tuple[str, list[str]]], int]:
    """``a = expr, b = expr`` from ``i`` up to a top-level keyword in ``stop``."""
    out: list[tuple[str, list[str]]] = []
    depth = 0
    current: list[str] = []
    while i < len(tokens):
        t = tokens[i]
        if depth == 0 and t.upper() in stop:
            break
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
        if depth == 0 and t == ",":
            out.append(_assignment(current))
            current = []
        else:
            current.append(t)
        i += 1
    if current:
        out.append(_assignment(current))
    return out, i


def _assignment(tokens: list[str]) -> tuple[str, list[str]]:
    if len(tokens) < 3 or tokens[1] != "=":
        raise _Unreadable
    return tokens[0].split(".")[-1].lower(), tokens[2:]


def _rest(tokens: list[str], i: int, columns: list[str | None]) -> list[str | None]:
    """``?`` after the written part (WHERE, RETURNING, ANTI JOIN …): not written."""
    return columns + [None for t in tokens[i:] if t == "?"]


def _unnested(tokens: list[str], i: int) -> tuple[list[str], int]:
    """``SELECT unnest(?) AS a, unnest(?) AS b )`` at ``i`` (a batch, one list per column,
    see ``duckdb.bulk``): the name each ``?`` is unnested as, and where the ``)`` that
    closes it ends."""
    names: list[str] = []
    item: list[str] = []
    depth = 0
    for j in range(i + 1, len(tokens)):
        t = tokens[j]
        if depth == 0 and t in (",", ")"):
            if item[:4] != ["unnest", "(", "?", ")"] or len(item) != 6 or item[4].upper() != "AS":
                raise _Unreadable
            names.append(item[5].lower())
            if t == ")":
                return names, j + 1
            item = []
            continue
        depth += {"(": 1, ")": -1}.get(t, 0)
        item.append(t)
    raise _Unreadable


def _plan_insert(tokens: list[str], table: str, i: int) -> list[tuple[str, str] | None]:
    items, i = _groups(tokens, i)
    cols: list[str | None] = [" ".join(item).lower() for item in items]
    head = tokens[i].upper()
    if head == "VALUES":
        mapped, i = _tuples(tokens, i + 1, cols)
    elif head == "SELECT" and tokens[i + 1 : i + 5] == ["*", "FROM", "(", "VALUES"]:
        mapped, i = _tuples(tokens, i + 5, cols)
        if tokens[i] != ")":
            raise _Unreadable
        i += 1
    elif head == "SELECT" and tokens[i + 1 : i + 5] == ["*", "FROM", "(", "SELECT"]:
        names, i = _unnested(tokens, i + 4)  # one list per column: scrubbed element-wise
        if names != cols:
            raise _Unreadable
        mapped = list(names)
    else:
        raise _Unreadable
    out: list[tuple[str, str] | None] = [(table, c) if c else None for c in mapped]
    while i < len(tokens):  # ON CONFLICT ... DO UPDATE SET a = ?, ...
        if tokens[i].upper() == "SET":
            sets, i = _assignments(tokens, i + 1, {"WHERE", "RETURNING"})
            for col, expr in sets:
                out.extend((table, col) for t in expr if t == "?")
            continue
        if tokens[i] == "?":
            out.append(None)  # WHERE / RETURNING: not written
        i += 1
    return out


def _plan_update(tokens: list[str], table: str, i: int) -> list[tuple[str, str] | None]:
    if tokens[i].upper() != "SET":
        raise _Unreadable
    sets, i = _assignments(tokens, i + 1, {"FROM", "WHERE", "RETURNING"})
    out: list[tuple[str, str] | None] = []
    from_values: dict[str, str] = {}
    for col, expr in sets:
        out.extend((table, col) for t in expr if t == "?")
        for t in expr:
            if "." in t:
                from_values[t.split(".")[-1].lower()] = col
    if i < len(tokens) and tokens[i].upper() == "FROM" and tokens[i + 1 : i + 3] == ["(", "SELECT"]:
        # FROM (SELECT unnest(?) AS a, ...) AS v: a list lands in the column set from v.a
        unnested, i = _unnested(tokens, i + 2)
        out.extend((table, from_values[n]) if n in from_values else None for n in unnested)
    elif i < len(tokens) and tokens[i].upper() == "FROM":
        # FROM (VALUES (?, ?), ...) AS v(a, b): a value lands in the column set from v.a
        if tokens[i + 1 : i + 3] != ["(", "VALUES"]:
            raise _Unreadable
        j = i + 3
        depth = 0
        while j < len(tokens) and not (tokens[j] == ")" and depth == 0):  # to the closing ")"
            depth += {"(": 1, ")": -1}.get(tokens[j], 0)
            j += 1
        k = j + 1
        if k < len(tokens) and tokens[k].upper() == "AS":
            k += 1
        names, _ = _groups(tokens, k + 1)
        vcols = [from_values.get(" ".join(n).lower()) for n in names]
        mapped, end = _tuples(tokens, i + 3, vcols)
        if end != j:
            raise _Unreadable
        out.extend((table, c) if c else None for c in mapped)
        i = k + 1
    out.extend(None for t in tokens[i:] if t == "?")
    return out


@functools.lru_cache(maxsize=2048)
def param_columns(sql: str) -> Plan | tuple[str, ...]:
    """The ``(table, column)`` each ``?`` of ``sql`` is written to (None: not written).

    ``()`` for a statement that writes nothing (SELECT, DELETE, DDL); ``None`` when the
    statement cannot be read (then every parameter is scrubbed as text)."""
    tokens = [t for t in _TOKEN.findall(sql) if not t.startswith("'")]
    if not tokens:
        return _NO_WRITE
    first = tokens[0].upper()
    words = {t.upper() for t in tokens}
    try:
        if first == "INSERT" and tokens[1].upper() == "INTO":
            plan = _plan_insert(tokens, tokens[2].lower(), 3)
        elif first == "UPDATE":
            plan = _plan_update(tokens, tokens[1].lower(), 2)
        elif first in ("SELECT", "DELETE", "CREATE", "ALTER", "DROP") and "INSERT" not in words:
            return _NO_WRITE  # (a SELECT's UPDATE is FOR UPDATE; a DELETE stores nothing)
        else:
            return _ALL_TEXT
    except (_Unreadable, IndexError):
        return _ALL_TEXT
    if len(plan) != sum(1 for t in tokens if t == "?"):
        return _ALL_TEXT
    return tuple(plan)
