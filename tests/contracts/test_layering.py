"""Imports flow one way: store <- core <- widgets / ipython (see ARCHITECTURE.md).

Static half: every ``import`` in a layer's source (module level, in functions,
under ``TYPE_CHECKING`` alike, plus ``importlib.import_module("...")`` with a
literal name) is resolved to an absolute module name and checked against the
layer's forbidden prefixes. Dynamic half: importing ``kernelext._core`` or
``kernelext._store`` in a fresh interpreter loads no Jupyter module at all.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

JUPYTER = (
    "IPython",
    "ipykernel",
    "ipywidgets",
    "jupyter_client",
    "nbclient",
    "nbformat",
    "traitlets",
    "zmq",
    "comm",
    "jupyter_core",
    "jupyter_server",
    "jupyterlab",
    "nbconvert",
    "widgetsnbextension",
)

# The top-level folder widgets/ is installed as kernelext.widgets; nothing may
# rely on a top-level `widgets` import (it does not exist once installed).
EVERYWHERE = ("widgets",)

# layer name -> (source folder, package it is installed as, forbidden prefixes)
LAYERS: dict[str, tuple[Path, str, tuple[str, ...]]] = {
    "store": (
        REPO_ROOT / "kernelext" / "_store",
        "kernelext._store",
        (
            "kernelext._core",
            "kernelext._ipython",
            "kernelext._server",
            "kernelext.widgets",
            *JUPYTER,
        ),
    ),
    "core": (
        REPO_ROOT / "kernelext" / "_core",
        "kernelext._core",
        ("kernelext._ipython", "kernelext._server", "kernelext.widgets", *JUPYTER),
    ),
    # The Jupyter Server extension: the server's side of a click, never a kernel's.
    "server": (
        REPO_ROOT / "kernelext" / "_server",
        "kernelext._server",
        ("kernelext._ipython", "kernelext.widgets", "ipywidgets", "ipykernel", "IPython"),
    ),
    "ipython": (REPO_ROOT / "kernelext" / "_ipython", "kernelext._ipython", ()),
    "widgets": (
        REPO_ROOT / "widgets",
        "kernelext.widgets",
        ("kernelext._store", "kernelext._server"),
    ),
}


def module_name(path: Path, root: Path, package: str) -> str:
    """Dotted name ``path`` is imported as, given that ``root`` is ``package``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imported_modules(source: str, modname: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in ``source``."""
    tree = ast.parse(source)
    package = modname if is_package else modname.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level - 1 >= len(base_parts):
                    found.append((node.lineno, "<relative import beyond top-level package>"))
                    continue
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from kernelext import store` imports the submodule kernelext._store
            found.extend((node.lineno, f"{target}.{a.name}") for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if (
                name in {"import_module", "__import__"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append((node.lineno, node.args[0].value))
    return found


def is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(folder: Path, package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        modname = module_name(path, folder, package)
        source = path.read_text(encoding="utf-8")
        for line, target in imported_modules(source, modname, path.name == "__init__.py"):
            if target.startswith("<"):
                out.append(f"{path.relative_to(REPO_ROOT)}:{line}: {target}")
                continue
            for prefix in (*forbidden, *EVERYWHERE):
                if is_under(target, prefix):
                    out.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {target}")
    return out


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_flow_one_way(layer: str) -> None:
    folder, package, forbidden = LAYERS[layer]
    assert folder.is_dir(), f"layer folder {folder} is missing"
    files = [p for p in folder.rglob("*.py") if "__pycache__" not in p.parts]
    assert files, f"layer folder {folder} has no Python files: nothing would be checked"
    bad = violations(folder, package, forbidden)
    assert not bad, f"{layer} breaks the layering:\n" + "\n".join(bad)


def test_checker_catches_violations() -> None:
    """The static checker itself: relative, aliased and dynamic imports resolve."""
    src = "\n".join(
        [
            "from .. import _store",
            "from .._core.runs import Run",
            "from . import _panel",
            "import IPython.display as d",
            "import importlib",
            "def f():",
            "    from kernelext._store.schema import X",
            "    return importlib.import_module('ipywidgets')",
        ]
    )
    names = {name for _, name in imported_modules(src, "kernelext.widgets.control", False)}
    assert {
        "kernelext._store",
        "kernelext._core.runs",
        "kernelext.widgets._panel",
        "IPython.display",
        "kernelext._store.schema",
        "ipywidgets",
    } <= names
    assert module_name(
        REPO_ROOT / "widgets" / "a" / "__init__.py", REPO_ROOT / "widgets", "kx.w"
    ) == ("kx.w.a")


def _fresh_python(code: str, cwd: Path) -> dict[str, object]:
    """Run ``code`` isolated (-I: no cwd/PYTHONPATH on sys.path) away from the repo."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("module", ["kernelext._core", "kernelext._store"])
def test_import_loads_no_jupyter_module(module: str, tmp_path: Path) -> None:
    code = (
        "import importlib, json, sys\n"
        f"m = importlib.import_module({module!r})\n"
        "import kernelext\n"
        f"banned = {JUPYTER!r}\n"
        "loaded = sorted(n for n in sys.modules if n.split('.')[0] in banned)\n"
        "print(json.dumps({'file': kernelext.__file__, 'loaded': loaded}))\n"
    )
    result = _fresh_python(code, tmp_path)
    assert Path(str(result["file"])).resolve() == REPO_ROOT / "kernelext" / "__init__.py", (
        "the installed kernelext is not this checkout; run `make venv`"
    )
    assert result["loaded"] == [], f"import {module} pulled in Jupyter modules"


def test_widgets_installed_only_as_kernelext_widgets(tmp_path: Path) -> None:
    code = (
        "import importlib.util, json\n"
        "import kernelext.widgets as w\n"
        "print(json.dumps({'file': w.__file__,"
        " 'toplevel': importlib.util.find_spec('widgets') is not None}))\n"
    )
    result = _fresh_python(code, tmp_path)
    assert Path(str(result["file"])).resolve() == REPO_ROOT / "widgets" / "__init__.py"
    assert result["toplevel"] is False, "a top-level `widgets` package is importable"


def test_every_package_folder_is_declared_in_pyproject() -> None:
    """setuptools only ships the packages listed in pyproject; a forgotten one
    works in the editable install and is missing from the wheel."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        pytest.skip("tomllib needs Python 3.11")
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools_cfg = config["tool"]["setuptools"]
    declared = set(setuptools_cfg["packages"])
    package_dir: dict[str, str] = setuptools_cfg["package-dir"]
    on_disk = set()
    for package, folder in (("kernelext", "kernelext"), ("kernelext.widgets", "widgets")):
        assert package_dir[package] == folder
        root = REPO_ROOT / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                on_disk.add(module_name(init, root, package))
    assert on_disk <= declared, f"add to [tool.setuptools] packages: {sorted(on_disk - declared)}"


# The engine's packages (kernelext/_core/<package>/) and what each may import of the others,
# for every kind of import, TYPE_CHECKING and function-level ones included. The order is
# drawn in ARCHITECTURE.md; each package's __init__.py says it in a sentence.
CORE = REPO_ROOT / "kernelext" / "_core"
ENGINE_ORDER: dict[str, set[str]] = {
    "encoding": set(),
    "process": {"encoding"},
    "engine": {"encoding", "process"},
    "views": {"encoding", "process"},
    "people": {"encoding", "process", "engine"},
    "facts": {"encoding", "process", "engine"},
    "ledger": {"encoding", "process", "engine", "people"},
    "batch": {"encoding", "process", "engine"},
    "plan": {"encoding", "process", "views", "facts", "ledger", "batch"},
    "lifecycle": {
        "encoding",
        "process",
        "engine",
        "views",
        "people",
        "facts",
        "ledger",
        "batch",
        "plan",
    },
}


def _whole_engine(target: str, line: int, found: list[tuple[int, str]]) -> bool:
    """``import kernelext`` or ``from kernelext import Run``: the top level imports every
    engine package, so a name it re-exports hides a package from the order."""
    if target == "kernelext":  # bare, unless a ``from kernelext import x`` on this line
        return not any(n != target and is_under(n, "kernelext") and ln == line for ln, n in found)
    if target.count(".") != 1 or not target.startswith("kernelext."):
        return False
    name = target.split(".", 1)[1]
    top = REPO_ROOT / "kernelext"
    return not ((top / f"{name}.py").is_file() or (top / name / "__init__.py").is_file())


def engine_order_breaks(core: Path = CORE) -> list[str]:
    out = []
    shown_from = core.parent.parent
    for path in sorted(core.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(core).parts
        shown = path.relative_to(shown_from)
        modname = module_name(path, core, "kernelext._core")
        if len(parts) != 2:
            if path != core / "__init__.py":
                out.append(f"{shown}: outside the engine's packages")
            continue
        package = parts[0]
        if package not in ENGINE_ORDER:
            out.append(f"{shown}: {package}/ is not in ENGINE_ORDER")
            continue
        source = path.read_text(encoding="utf-8")
        found = imported_modules(source, modname, path.name == "__init__.py")
        for line, target in found:
            if _whole_engine(target, line, found):
                out.append(f"{shown}:{line}: {package} imports {target}, which loads every package")
                continue
            if not is_under(target, "kernelext._core") or target == "kernelext._core":
                continue
            other = target.split(".")[2]
            if other != package and other not in ENGINE_ORDER[package]:
                out.append(f"{shown}:{line}: {package} imports {target}")
    return out


def test_the_engine_packages_import_in_one_order() -> None:
    bad = engine_order_breaks()
    assert not bad, "kernelext/_core breaks its package order:\n" + "\n".join(bad)


def test_the_engine_order_has_no_circle() -> None:
    seen: dict[str, int] = {}

    def depth(package: str, path: tuple[str, ...] = ()) -> int:
        assert package not in path, f"circle in ENGINE_ORDER: {' -> '.join((*path, package))}"
        if package not in seen:
            below = ENGINE_ORDER[package]
            seen[package] = 1 + max((depth(p, (*path, package)) for p in below), default=0)
        return seen[package]

    assert all(depth(p) >= 1 for p in ENGINE_ORDER)


def test_an_engine_package_init_is_a_docstring_only() -> None:
    """A package's __init__ imports nothing: importing one never drags its siblings in."""
    inits = sorted(CORE.glob("*/__init__.py"))
    assert {p.parent.name for p in inits} == set(ENGINE_ORDER)
    for init in inits:
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), (
            f"{init.relative_to(REPO_ROOT)} must hold only its docstring"
        )
        doc = ast.get_docstring(tree) or ""
        assert "May import" in doc, f"{init.relative_to(REPO_ROOT)}: say what it may import"


def test_the_engine_order_check_sees_a_type_only_import(tmp_path: Path) -> None:
    core = tmp_path / "_core"
    for package in ("encoding", "lifecycle"):
        (core / package).mkdir(parents=True)
        (core / package / "__init__.py").write_text('"""."""\n')
    (core / "__init__.py").write_text('"""."""\n')
    (core / "encoding" / "keys.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..lifecycle.run import Run\n"
    )
    (core / "stray.py").write_text("")
    (core / "encoding" / "escape.py").write_text(
        "from ... import Run\nfrom ... import errors\ndef f():\n    import kernelext as kx\n"
    )
    bad = engine_order_breaks(core)
    assert any("escape.py:1: encoding imports kernelext.Run" in b for b in bad), bad
    assert any("escape.py:4: encoding imports kernelext," in b for b in bad), bad
    assert not any("kernelext.errors" in b for b in bad), bad
    assert any("encoding imports kernelext._core.lifecycle.run" in b for b in bad), bad
    assert any("stray.py: outside the engine's packages" in b for b in bad), bad
