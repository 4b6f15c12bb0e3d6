"""No kernelext module is looked up by name at run time inside kernelext/ or widgets/.

``importlib.import_module("kernelext...")``, ``__import__``, ``sys.modules[...]``,
``sys.modules.get(...)`` and ``... in sys.modules`` hide a dependency from the import
scans (``test_layering.py``, ``test_import_cycles.py``), and once the module moves they
find nothing, silently: a check that looked a class up that way stopped refusing a second
``@kx.effect`` wrap. Such a module is imported, or its class registered by its own module
(``_validate.register``). The lookups that remain are listed below with their reason;
each listed name must still be a module of the checkout, so a move fails here instead.
"""

from __future__ import annotations

import ast

from test_layering import REPO_ROOT, is_under, module_name

ROOTS = ((REPO_ROOT / "kernelext", "kernelext"), (REPO_ROOT / "widgets", "kernelext.widgets"))

# (file, kernelext module looked up) -> why it is looked up rather than imported
NAMED_LOOKUPS_ALLOWED = {
    ("kernelext/_ipython/extension.py", "kernelext.widgets._panel"): (
        "open panels are refreshed or closed only if panels were ever shown: the lookup "
        "never loads ipywidgets into a kernel that did not use them"
    ),
    ("kernelext/_ipython/extension.py", "kernelext.widgets._runs"): (
        "open run overviews are closed on unload only if one was ever shown (as above)"
    ),
    ("kernelext/_ipython/extension.py", "kernelext.widgets._addons"): (
        "the panels' add-ons are uninstalled on unload only if they were installed (as above)"
    ),
}

# (file, function) looking up a name computed at run time -> why it is never kernelext's
COMPUTED_LOOKUPS_ALLOWED = {
    ("kernelext/_core/process/checks.py", "_by_attribute"): (
        "the module of a user's check function, by the name recorded with its fact"
    ),
    ("kernelext/_adapters/langgraph_tools.py", "require"): (
        "the optional LangGraph / LangChain packages its callers name, to say which extra "
        "to install when one is missing"
    ),
}


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


class _Lookups(ast.NodeVisitor):
    """Every run-time lookup of a module by name: (line, function, argument)."""

    def __init__(self) -> None:
        self.function = "<module>"
        self.found: list[tuple[int, str, ast.expr]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def _add(self, node: ast.AST, argument: ast.expr) -> None:
        self.found.append((getattr(node, "lineno", 0), self.function, argument))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in {"import_module", "__import__"} and node.args:
            self._add(node, node.args[0])
        elif isinstance(func, ast.Attribute) and _is_sys_modules(func.value) and node.args:
            self._add(node, node.args[0])  # sys.modules.get / pop / setdefault
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_sys_modules(node.value):
            self._add(node, node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)) and _is_sys_modules(right):
                self._add(node, node.left)
        self.generic_visit(node)


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments: the names a lookup may use."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def dynamic_lookups() -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """(file, line, kernelext module) named, and (file, line, function) computed."""
    named, computed = [], []
    for folder, package in ROOTS:
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            where = str(path.relative_to(REPO_ROOT))
            this = module_name(path, folder, package)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            constants = _constants(tree)
            visitor = _Lookups()
            visitor.visit(tree)
            for line, function, argument in visitor.found:
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    target = argument.value
                elif isinstance(argument, ast.Name) and argument.id in constants:
                    target = constants[argument.id]
                else:
                    computed.append((where, line, function))
                    continue
                if target.startswith("."):  # relative: to the package it is given
                    here = this if path.name == "__init__.py" else this.rpartition(".")[0]
                    target = f"{here}{target}"
                if is_under(target, "kernelext"):
                    named.append((where, line, target))
    return named, computed


def _is_module(name: str) -> bool:
    for folder, package in sorted(ROOTS, key=lambda root: -len(root[1])):  # widgets first
        if is_under(name, package):
            rest = name[len(package) :].lstrip(".").replace(".", "/")
            base = folder / rest if rest else folder
            return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    return False


def test_no_kernelext_module_is_looked_up_by_name() -> None:
    named, computed = dynamic_lookups()
    bad = [f"{f}:{n}: looks up {t}" for f, n, t in named if (f, t) not in NAMED_LOOKUPS_ALLOWED]
    bad += [
        f"{f}:{n}: looks up a module by a computed name in {fn}()"
        for f, n, fn in computed
        if (f, fn) not in COMPUTED_LOOKUPS_ALLOWED
    ]
    assert not bad, "import the module (or register its class) instead:\n" + "\n".join(bad)
    stale = set(NAMED_LOOKUPS_ALLOWED) - {(f, t) for f, _n, t in named}
    stale |= set(COMPUTED_LOOKUPS_ALLOWED) - {(f, fn) for f, _n, fn in computed}
    assert not stale, f"allowed lookups no longer made: remove them from the lists: {stale}"
    missing = [t for _f, t in NAMED_LOOKUPS_ALLOWED if not _is_module(t)]
    assert not missing, f"allowed lookups of modules that are not there (moved?): {missing}"


def test_the_scan_sees_every_kind_of_lookup() -> None:
    source = "\n".join(
        [
            "import importlib, sys",
            'ENTRY = "kernelext._core.batch.remote_item"',
            "class WorkerCall:",
            "    def __call__(self):",
            "        importlib.import_module(self.entry)",
            "def a():",
            '    return sys.modules.get("kernelext._core.ledger.effect"), '
            "importlib.import_module(ENTRY)",
            "def b():",
            '    return sys.modules["kernelext.errors"], "kernelext.status" in sys.modules',
            "def c():",
            '    return __import__("pandas"), importlib.import_module(".plan", __package__)',
        ]
    )
    tree = ast.parse(source)
    visitor = _Lookups()
    visitor.visit(tree)
    constants = _constants(tree)
    seen = [
        (fn, a.value if isinstance(a, ast.Constant) else constants.get(getattr(a, "id", ""), "?"))
        for _line, fn, a in visitor.found
    ]
    assert seen == [
        ("__call__", "?"),
        ("a", "kernelext._core.ledger.effect"),
        ("a", "kernelext._core.batch.remote_item"),
        ("b", "kernelext.errors"),
        ("b", "kernelext.status"),
        ("c", "pandas"),
        ("c", ".plan"),
    ]
    assert _is_module("kernelext._core.ledger.effect") and _is_module("kernelext.widgets")
    assert not _is_module("kernelext._core.no_such_module")
