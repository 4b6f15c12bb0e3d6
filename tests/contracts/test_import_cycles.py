"""No import circles in kernelext/: the module graph is a DAG.

Every import counts (module level and inside functions alike, as in
``test_layering.py``). Those under ``if TYPE_CHECKING:`` never run, so at run time
there is no circle at all; counted too, they may close only the few knots listed in
``TYPE_ONLY_KNOTS``: modules of one concept that name each other's types. A type-only
import that runs back up (the engine naming the façade, the runtime naming the agents)
is a dependency all the same: it decides which modules can move apart.
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


# Circles closed only by type-only imports, each inside one concept: every other one is
# refused, and a knot that is untied must leave this list (it then holds only what is).
TYPE_ONLY_KNOTS = {
    # the options are a part of the runtime, which holds their values
    frozenset({"kernelext._core.process.options", "kernelext._core.process.runtime"}),
    # run.map's core and the iterator it reads its items from
    frozenset({"kernelext._core.batch.core", "kernelext._core.batch.source"}),
    # @kx.agent and the start of its runs
    frozenset({"kernelext._core.lifecycle.agent", "kernelext._core.lifecycle.starting"}),
    # @kx.effect, its awaited calls, its outcomes and its retries
    frozenset(
        {
            "kernelext._core.ledger.effect",
            "kernelext._core.ledger.effect_async",
            "kernelext._core.ledger.effect_outcomes",
            "kernelext._core.ledger.retries",
        }
    ),
    # the embedded store's file and the stop requests posted beside it while it is busy
    frozenset({"kernelext._store.duckdb.backend", "kernelext._store.duckdb.mailbox"}),
    # kx.timeline: the records folded, and the picture drawn of them
    frozenset(
        {
            "kernelext._core.views.timeline",
            "kernelext._core.views.timeline_draw",
            "kernelext._core.views.timeline_fold",
            "kernelext._core.views.timeline_svg",
        }
    ),
}


def module_graph(*, type_only_too: bool = False) -> dict[str, set[str]]:
    """Module -> the kernelext modules it imports (with ``type_only_too``, those under
    ``if TYPE_CHECKING:`` as well)."""
    files: dict[str, Path] = {}
    for folder, package in ROOTS:
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts or (package == "kernelext" and "widgets" in path.parts):
                continue
            files[module_name(path, folder, package)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        source = path.read_text(encoding="utf-8")
        if not type_only_too:
            source = _runtime_source(source)
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


def test_type_only_imports_close_only_the_known_knots() -> None:
    graph = module_graph(type_only_too=True)
    found = {frozenset(c) for c in cycles(graph)}
    unknown = [sorted(c) for c in found - TYPE_ONLY_KNOTS]
    assert not unknown, "import circles through TYPE_CHECKING imports:\n" + "\n".join(
        " <-> ".join(c)
        + "\n    "
        + "; ".join(f"{a} -> {', '.join(sorted(graph[a] & set(c)))}" for a in c)
        for c in unknown
    )
    untied = [sorted(k) for k in TYPE_ONLY_KNOTS - found]
    assert not untied, f"knots no longer there: remove them from TYPE_ONLY_KNOTS: {untied}"


def test_the_type_only_scan_sees_a_type_checking_import() -> None:
    graph = module_graph(type_only_too=True)
    runtime_graph = module_graph()
    # run_engine names nothing of batch at all now; step_info names ForceGate for typing only
    assert "kernelext._core.engine.forced_stop" in graph["kernelext._core.engine.step_info"]
    assert (
        "kernelext._core.engine.forced_stop"
        not in runtime_graph["kernelext._core.engine.step_info"]
    )


def test_checker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "X" not in _runtime_source(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import X\n"
    )
