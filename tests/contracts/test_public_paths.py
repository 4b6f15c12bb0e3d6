"""README.md, the documentation, the notebooks and binder/ send users to public paths only.

A path into the engine (``kernelext._core...``, ``kernelext.widgets._panel``, ``kx._x``) or
to a name a public module does not list in ``__all__`` (``kx.core.approvals``) breaks the
day the engine moves. Scanned: the fenced blocks and inline code of README (not its
changelog, which names the paths that moved) and of every page of docs/ (not the overview,
which names the engine's packages to say they are not API), every cell of every notebook
(code, and the code in markdown), every file of binder/. A dotted path is followed from
``kernelext`` through the public modules; once it reaches a public object (``kx.secrets``,
a class), what follows is that object's own attributes. Names users meet in Jupyter's
configuration rather than import (the server extension) are public as they are.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = (
    "kernelext",
    "kernelext.errors",
    "kernelext.status",
    "kernelext.langgraph",
    "kernelext.otel",
    "kernelext.widgets",
)

# Not imported: the name of kernelext's Jupyter Server extension, as `jupyter server
# extension list` shows it and a `jpserver_extensions` setting enables or disables it.
CONFIGURATION_NAMES = {"kernelext._server"}
# Pages that name the engine's packages on purpose, to say they are not API.
NAMES_THE_ENGINE = {"docs/index.md"}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"`([^`\n]+)`")
_FROM = re.compile(r"\bfrom\s+(kernelext(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#;]+)")
_IMPORT = re.compile(r"\bimport\s+(kernelext(?:\.\w+)*)")
_ALIAS = re.compile(r"\bimport\s+kernelext\s+as\s+(\w+)")
_DOTTED = re.compile(r"(?<![\w./-])(\w+)((?:\.\w+)+)")


def _public(module: str) -> ModuleType:
    if module == "kernelext.widgets":
        pytest.importorskip("ipywidgets")
    return importlib.import_module(module)


def path_problem(path: str) -> str | None:
    """Why the dotted ``path`` (``kernelext.x.y``) is not a public path, or None."""
    if path in CONFIGURATION_NAMES:
        return None
    parts = path.split(".")
    module, obj = "kernelext", _public("kernelext")
    for i, part in enumerate(parts[1:], start=1):
        if not isinstance(obj, ModuleType):
            return None  # an attribute of a public object
        if part.startswith("__") and part.endswith("__"):
            return None  # __version__, __file__
        if f"{module}.{part}" in PUBLIC_MODULES:
            module = f"{module}.{part}"
            obj = _public(module)
            continue
        if part not in getattr(obj, "__all__", ()):
            where = ".".join(parts[: i + 1])
            return f"{where}: {module} does not list {part!r} in __all__"
        obj = getattr(obj, part)
    return None


def problems_in(code: str) -> list[str]:
    """Every non-public kernelext path that ``code`` imports or names."""
    found: list[str] = []
    aliases = {"kernelext", "kx", *_ALIAS.findall(code)}
    for module, names in _FROM.findall(code):
        for item in names.strip("()").split(","):
            name = item.split(" as ")[0].strip()
            problem = path_problem(f"{module}.{name}") if name and name != "*" else None
            if problem:
                found.append(problem)
    for module in _IMPORT.findall(code):
        problem = path_problem(module)
        if problem:
            found.append(problem)
    for head, rest in _DOTTED.findall(code):
        if head in aliases:
            problem = path_problem("kernelext" + rest)
            if problem:
                found.append(problem)
    return sorted(set(found))


def readme_code(text: str) -> list[str]:
    text = text.split("\n## Changelog\n", 1)[0]  # the changelog names old paths on purpose
    blocks = _FENCE.findall(text)
    prose = _FENCE.sub("", text)
    return blocks + _INLINE.findall(prose)


def notebook_code(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    code: list[str] = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            code.append(source)
        else:
            code.extend(readme_code(source))
    return code


SOURCES = {
    "README.md": lambda: readme_code((REPO_ROOT / "README.md").read_text()),
    **{
        f"docs/{p.name}": (lambda p=p: readme_code(p.read_text()))
        for p in sorted((REPO_ROOT / "docs").glob("*.md"))
        if f"docs/{p.name}" not in NAMES_THE_ENGINE
    },
    **{
        f"notebooks/{p.name}": (lambda p=p: notebook_code(p))
        for p in sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
    },
    **{
        f"binder/{p.name}": (lambda p=p: [p.read_text()])
        for p in sorted((REPO_ROOT / "binder").iterdir())
        if p.is_file()
    },
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_users_are_sent_to_public_paths_only(source: str) -> None:
    found = sorted({p for code in SOURCES[source]() for p in problems_in(code)})
    assert found == [], f"{source} names paths that are not public API"


def test_the_scan_sees_every_kind_of_private_path() -> None:
    readme = (
        "Give them `kernelext._core.encoding.secrets.ScrubFilter()`, "
        "or `kx.core.approvals.approve(k)`.\n"
        "```python\n"
        "import kernelext as kx\n"
        "from kernelext._store.duckdb import DUCKDB_CONFIG\n"
        "from kernelext.widgets import panel_for, _panel\n"
        "import kernelext.store.duckdb\n"
        "kx.secrets.scrub(text); kx.langgraph.start(g); kernelext.errors.OwnershipLost\n"
        "```\n"
    )
    found = [p for code in readme_code(readme) for p in problems_in(code)]
    assert [p.split(":")[0] for p in sorted(found)] == [
        "kernelext._core",
        "kernelext._store",
        "kernelext.core",
        "kernelext.store",
        "kernelext.widgets._panel",
    ]
    assert problems_in("kx.secrets.log_filter(); kx.__version__; panel.view.stop_text()") == []
    assert problems_in("import kernelext as k\nk._core.lifecycle.run") == [
        "kernelext._core: kernelext does not list '_core' in __all__"
    ]
    # the server extension's name is configuration, not a way into its modules
    assert problems_in("jupyter server extension disable kernelext._server") == []
    assert problems_in("from kernelext._server.handlers import install") == [
        "kernelext._server: kernelext does not list '_server' in __all__"
    ]
