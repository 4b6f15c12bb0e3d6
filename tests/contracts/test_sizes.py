"""Size budgets: a module under kernelext/ or widgets/ is at most 450 lines and a
function or method at most 80 lines (counted with ``ast``: end_lineno - lineno + 1,
decorators excluded), unless it is listed below with its reason.

An entry that is no longer over its budget fails too, so the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("kernelext", "widgets")

MODULE_LINES = 450
FUNCTION_LINES = 80

# path (relative to the repository) -> reason it may stay over MODULE_LINES
MODULES_OVER: dict[str, str] = {
    "kernelext/_unicode_data.py": "generated data (Unicode's tables, tools/unicode_data.py)",
    "kernelext/_core/encoding/secrets.py": (
        "the registry, its scrubbing and the doors it installs at import call one another"
    ),
}

# "path::Qualified.name" -> reason it may stay over FUNCTION_LINES
FUNCTIONS_OVER: dict[str, str] = {}


def _modules() -> list[Path]:
    found = [p for root in ROOTS for p in sorted((REPO_ROOT / root).rglob("*.py"))]
    assert found, f"no Python modules under {ROOTS} in {REPO_ROOT}"
    return found


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _functions(path: Path) -> list[tuple[str, int]]:
    """Every function and method in ``path`` as (qualified name, lines)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return found


def _modules_over() -> dict[str, int]:
    return {_relative(p): n for p in _modules() if (n := _line_count(p)) > MODULE_LINES}


def _functions_over() -> dict[str, int]:
    return {
        f"{_relative(p)}::{name}": n
        for p in _modules()
        for name, n in _functions(p)
        if n > FUNCTION_LINES
    }


def test_modules_stay_within_their_line_budget() -> None:
    over = {k: v for k, v in _modules_over().items() if k not in MODULES_OVER}
    assert not over, (
        f"modules over {MODULE_LINES} lines: {over}; split each into modules "
        "named for their concepts (one home per concept, see ARCHITECTURE.md)"
    )


def test_functions_stay_within_their_line_budget() -> None:
    over = {k: v for k, v in _functions_over().items() if k not in FUNCTIONS_OVER}
    assert not over, f"functions over {FUNCTION_LINES} lines: {over}; extract named steps"


@pytest.mark.parametrize(
    ("listed", "measure"),
    [(MODULES_OVER, _modules_over), (FUNCTIONS_OVER, _functions_over)],
    ids=["modules", "functions"],
)
def test_allow_list_names_only_what_is_still_over(
    listed: dict[str, str], measure: Callable[[], dict[str, int]]
) -> None:
    stale = sorted(set(listed) - set(measure()))
    assert not stale, f"within budget now (or gone), remove from the allow-list: {stale}"


def test_the_count_sees_nested_methods_and_async_functions(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    source = f"class Outer:\n    async def long(self):\n{body}\n"
    module = tmp_path / "m.py"
    module.write_text(source)
    assert _functions(module) == [("Outer.long", FUNCTION_LINES + 1)]
