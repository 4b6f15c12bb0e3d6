"""SQL text as psycopg expects it: the store's statements (``?`` placeholders, DuckDB type
names) and a user's query (``?``, ``$1``, ``$name``), translated outside string literals,
quoted names and comments."""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["placeholders", "translate"]

# What a placeholder scan steps over: literals, quoted names and comments.
_SKIPPED = r"""
      (?P<str>'(?:[^']|'')*')              # 'string literal'
    | (?P<ident>"(?:[^"]|"")*")            # "quoted name"
    | (?P<dollar>\$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$)  # $tag$ body $tag$
    | (?P<line>--[^\n]*)                   # -- comment
    | (?P<block>/\*.*?\*/)                 # /* comment */
"""
_TOKEN = re.compile(
    _SKIPPED
    + r"""
    | (?P<q>\?)                            # placeholder
    | (?P<pct>%)                           # psycopg's escape character
    | (?P<semi>;)
    """,
    re.VERBOSE | re.DOTALL,
)
_DDL = re.compile(r"^\s*(CREATE|ALTER)\b", re.IGNORECASE)
_BLOB = re.compile(r"\bBLOB\b", re.IGNORECASE)


def _scan(sql: str) -> tuple[str, int]:
    """``?`` -> ``%s`` and ``%`` -> ``%%`` outside literals; also count top-level ``;``."""
    out: list[str] = []
    pos = 0
    statements_ended = 0
    for match in _TOKEN.finditer(sql):
        out.append(sql[pos : match.start()])
        kind = match.lastgroup
        if kind == "q":
            out.append("%s")
        elif kind == "pct":
            out.append("%%")
        elif kind == "semi":
            statements_ended += 1
            out.append(";")
        else:  # literals, quoted names and comments: only psycopg's escape matters
            out.append(match.group(0).replace("%", "%%"))
        pos = match.end()
    out.append(sql[pos:])
    return "".join(out), statements_ended


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The store's SQL (``?`` placeholders, DuckDB type names) as psycopg expects it."""
    if _DDL.match(sql):
        sql = _BLOB.sub("BYTEA", sql)
    return _scan(sql)[0]


_PLACEHOLDER = re.compile(
    _SKIPPED
    + r"""
    | (?P<q>\?)                            # ? placeholder
    | \$(?P<num>[0-9]+)                     # $1 placeholder
    | \$(?P<name>[A-Za-z_][A-Za-z0-9_]*)    # $name placeholder
    | (?P<pct>%)                           # psycopg's escape character
    """,
    re.VERBOSE | re.DOTALL,
)


def placeholders(
    sql: str, params: list[Any] | dict[str, Any] | None
) -> tuple[str, list[Any] | dict[str, Any]]:
    """User SQL with DuckDB's placeholders (``?``, ``$1``, ``$name``) as psycopg's.

    Only placeholders outside literals, quoted names and comments count; the values stay
    parameters, sent apart from the text. A mapping binds ``$name``, a sequence ``?``/``$1``.
    """
    out: list[str] = []
    positional: list[Any] = []
    questions = 0
    pos = 0
    for match in _PLACEHOLDER.finditer(sql):
        out.append(sql[pos : match.start()])
        pos = match.end()
        kind = match.lastgroup
        if kind == "pct":
            out.append("%%")
        elif kind == "name":
            out.append(f"%({match.group('name')})s")
        elif kind == "q":
            questions += 1
            out.append("%s")
            positional.append(_nth(params, questions, f"placeholder ? number {questions}"))
        elif kind == "num":
            out.append("%s")
            number = int(match.group("num"))
            positional.append(_nth(params, number, f"${number}"))
        else:
            out.append(match.group(0).replace("%", "%%"))
    out.append(sql[pos:])
    text = "".join(out).rstrip().rstrip(";")
    return text, (dict(params) if isinstance(params, dict) else positional)


def _nth(params: list[Any] | dict[str, Any] | None, number: int, label: str) -> Any:
    if not isinstance(params, list) or not 1 <= number <= len(params):
        raise ValueError(
            f"The query's {label} has no value: pass params as a list of at least {number}."
        )
    return params[number - 1]
