"""Statuses are spelled once, in ``kernelext/status.py``.

Everywhere else in the package (and the widgets) a status is a member of ``Status``,
``StepStatus`` or ``EffectStatus``: no string constant equal to a status, and no SQL
text quoting one (``status = 'running'``). A new status, or a renamed one, is then
one edit, and the transition table sees every move.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kernelext.status import EffectStatus, Status, StepStatus

REPO_ROOT = Path(__file__).resolve().parents[2]
SCANNED = (REPO_ROOT / "kernelext", REPO_ROOT / "widgets")
HOME = REPO_ROOT / "kernelext" / "status.py"
NAMES = {m.value for e in (Status, StepStatus, EffectStatus) for m in e}
QUOTED = re.compile(r"'(" + "|".join(sorted(NAMES)) + r")'")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in skip:
            continue
        if node.value in NAMES or QUOTED.search(node.value):
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_status_literal_outside_the_status_module() -> None:
    files = [p for root in SCANNED for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 40
    found = [hit for p in files if p != HOME for hit in literals(p)]
    assert not found, f"{len(found)} status literal(s) outside kernelext/status.py:\n" + "\n".join(
        found
    )


def test_the_scan_sees_literals(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""running is fine in a docstring"""\nx = "running"\ny = "status = \'failed\'"\n'
    )
    assert [hit.rsplit(": ", 1)[1] for hit in literals_at(sample, tmp_path)] == [
        "'running'",
        "\"status = 'failed'\"",
    ]


def literals_at(path: Path, root: Path) -> list[str]:
    global REPO_ROOT
    saved, REPO_ROOT = REPO_ROOT, root
    try:
        return literals(path)
    finally:
        REPO_ROOT = saved
