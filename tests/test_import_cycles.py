"""No import circles in kernelext/: the module graph is a DAG.

Every import counts (module level and inside functions alike, as in
``test_layering.py``), except those under ``if TYPE_CHECKING:``, which never run.
A package's ``__init__`` importing its own submodules is not a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layering import REPO_ROOT, imported_modules, module_name

ROOTS = ((REPO_ROOT / "kernelext", "kernelext"), (REPO_ROOT / "widgets", "kernelext.widgets"))


def _runtime_source(source: str) -> str:
    """``source`` with ``if TYPE_CHECKING:`` blocks emptied (they never execute)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                decorators = getattr(child, "decorator_list", [])
                first = min([child.lineno, *(d.lineno for d in decorators)])
                for n in range(first - 1, (child.end_lineno or child.lineno)):
                    lines[n] = ""
            indent = " " * node.col_offset  # a block inside a class keeps its indentation
            lines[node.lineno - 1] = f"{indent}if False:"
            lines[node.lineno] = f"{indent}    pass"
    return "\n".join(lines)


def module_graph() -> dict[str, set[str]]:
    files: dict[str, Path] = {}
    for folder, package in ROOTS:
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts or (package == "kernelext" and "widgets" in path.parts):
                continue
            files[module_name(path, folder, package)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        source = _runtime_source(path.read_text(encoding="utf-8"))
        for _line, target in imported_modules(source, name, path.name == "__init__.py"):
            # `from .x import y` lists both x and x.y: keep the longest that is a module
            while target and target not in files:
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            if path.name == "__init__.py" and target.startswith(name + "."):
                continue  # a package importing its own parts
            if target in files and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    graph = module_graph()
    assert len(graph) > 40, "too few modules found: the scan is broken"
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_checker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "X" not in _runtime_source(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import X\n"
    )
