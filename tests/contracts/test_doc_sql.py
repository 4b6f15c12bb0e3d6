"""Every SQL example of the README and docs/ runs on DuckDB and on PostgreSQL.

The examples are read from the pages themselves: ``%%ledger`` cells, ``kx.sql(...)`` calls
with literal arguments (in code blocks and inline code), and ``kernelext sql '...'`` command
lines with their ``--param``. Each runs through ``kx.sql`` on a real store of each backend
(a real PostgreSQL server for the second) holding one small run. An example written to show
a refusal (a ``kx.sql`` call inside ``try:`` whose ``except`` names ``ReadOnlyError``,
``QueryError`` or ``SurfaceBreach``) must be refused with that error on both.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kernelext as kx
from kernelext import errors

pytestmark = pytest.mark.both_backends

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REFUSALS = {"ReadOnlyError", "QueryError", "SurfaceBreach"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Example:
    where: str  # page:line
    query: str
    params: Any = None
    refused_with: str | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` (an opening parenthesis) to its closing one."""
    depth, quote, i = 0, "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    return None


def _call(source: str) -> ast.Call | None:
    """``kx.sql(...)`` parsed, as written or (inline code cut over lines) with its line
    breaks read as spaces."""
    for text in (source, re.sub(r"\s*\n\s*", " ", source)):
        try:
            node = ast.parse("kx.sql" + text, mode="eval").body
        except SyntaxError:
            continue
        return node if isinstance(node, ast.Call) else None
    return None


NAMES = {"run_id": "triage-nov"}  # the variables examples bind as parameters


def _value(node: ast.expr) -> Any:
    """A literal argument, with the variables of ``NAMES`` filled in."""
    if isinstance(node, ast.Name) and node.id in NAMES:
        return NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    return ast.literal_eval(node)


def _refusals(page: str) -> dict[str, str]:
    """Query text -> the refusal its ``try:`` block expects, for every code block."""
    found: dict[str, str] = {}
    for block in FENCE.findall(page):
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            names = {ast.unparse(h.type).split(".")[-1] for h in node.handlers if h.type}
            expected = sorted(names & REFUSALS)
            for inner in (n for stmt in node.body for n in ast.walk(stmt)):
                if not (isinstance(inner, ast.Call) and ast.unparse(inner.func) == "kx.sql"):
                    continue
                if expected and inner.args and isinstance(inner.args[0], ast.Constant):
                    found[str(inner.args[0].value)] = expected[0]
    return found


def _sql_calls(name: str, page: str) -> Iterator[Example]:
    refusals = _refusals(page)
    for match in re.finditer(r"kx\.sql(?=\()", page):
        source = _balanced(page, match.end())
        call = _call(source) if source else None
        if call is None or not call.args:
            continue
        try:
            args = [_value(a) for a in call.args]
            options = {k.arg: _value(k.value) for k in call.keywords if k.arg}
        except ValueError:
            continue  # a variable (kx.sql(query)): not an example to run
        query = args[0]
        if not isinstance(query, str):
            continue
        yield Example(
            f"{name}:{_line(page, match.start())}",
            query,
            args[1] if len(args) > 1 else None,
            refusals.get(query),
            options,
        )


def _ledger_cells(name: str, page: str) -> Iterator[Example]:
    for block in FENCE.finditer(page):
        lines = block.group(1).splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("%%ledger"):
                query = "\n".join(lines[i + 1 :]).strip()
                yield Example(f"{name}:{_line(page, block.start()) + i + 1}", query)


def _command_lines(name: str, page: str) -> Iterator[Example]:
    for match in re.finditer(r"kernelext sql ('[^']*'(?: --param [^\s`]+)*)", page):
        words = shlex.split(match.group(1))
        params = dict(w.split("=", 1) for w in words[2::2])
        yield Example(f"{name}:{_line(page, match.start())}", words[0], params or None)


def examples() -> list[Example]:
    found: list[Example] = []
    for path in PAGES:
        name, page = str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
        for finder in (_sql_calls, _ledger_cells, _command_lines):
            found.extend(finder(name, page))
    return found


EXAMPLES = examples()


def test_the_pages_hold_the_examples_this_test_runs() -> None:
    where = {e.where.split(":")[0] for e in EXAMPLES}
    assert {"README.md", "docs/store.md", "docs/security.md", "docs/api/errors.md"} <= where
    assert any("GROUP BY" in e.query for e in EXAMPLES)
    assert any(e.refused_with for e in EXAMPLES) and any(e.params for e in EXAMPLES)


@kx.effect
def send(to: str, *, idempotency_key: str | None = None) -> dict[str, str]:
    return {"sent": to}


@kx.effect(name="openai:chat.completions")  # a model call as kx.openai records one
def complete(prompt: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
    return {"choices": [{"message": {"content": prompt}}], "usage": {"total_tokens": 7}}


@kx.agent(name="triage")
def triage(run: kx.Run, tickets: list[str]) -> None:
    for ticket in run.steps(tickets):
        complete(f"triage {ticket}")
        send(f"{ticket}@example.com")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_each_sql_example_runs_on_both_backends(store: Any, example: Example) -> None:
    assert triage.start(["T1", "T2"], run_id="triage-nov").wait(60) == "completed"
    if example.refused_with is not None:  # shown to be refused: refused on both
        with pytest.raises(getattr(errors, example.refused_with)):
            kx.sql(example.query, example.params, **example.options)
        return
    answer = kx.sql(example.query, example.params, **example.options)  # raises if it fails
    if "total_tokens" in example.query:  # JSON read the same way on both: 2 calls x 7
        assert answer.iloc[0, 1] == 14, answer
