"""What ``help()`` shows of the public API names only public things: no docstring of a
public name, or of a public method or property of a public class, sends the reader to a
private module (``kernelext._core...``, ``kernelext/_store/...``), which may change in
any release (docs/public-api.md)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

PUBLIC_MODULES = [
    "kernelext",
    "kernelext.errors",
    "kernelext.langgraph",
    "kernelext.status",
    "kernelext.widgets",
]
PRIVATE = re.compile(r"kernelext[./]_|(?<![\w.])_(core|store|ipython|adapters|cli)[./]")


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties a class defines (not what ``object`` gives)."""
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            value = value.fget
        elif isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        yield name, value


def public_docstrings() -> Iterator[tuple[str, str]]:
    """(where, docstring) of each public module, public name, and member of a public class.
    The package's own docstring is left out: it names the private modules to say so."""
    for module_name in PUBLIC_MODULES:
        if module_name == "kernelext.widgets":
            pytest.importorskip("ipywidgets")
        module = importlib.import_module(module_name)
        if module_name != "kernelext":
            yield module_name, inspect.getdoc(module) or ""
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, (str, int, float, tuple)) or inspect.ismodule(value):
                continue  # constants, and public modules (seen above)
            where = f"{module_name}.{name}"
            yield where, inspect.getdoc(value) or ""
            if inspect.isclass(value) and value.__module__.startswith(("kernelext", "widgets")):
                for member, attr in members(value):
                    if callable(attr):
                        yield f"{where}.{member}", inspect.getdoc(attr) or ""


def test_there_are_public_docstrings_to_check() -> None:
    seen = dict(public_docstrings())
    assert {"kernelext.on_expire", "kernelext.effect", "kernelext.Run.map"} <= seen.keys()


def test_no_public_docstring_points_at_a_private_module() -> None:
    pointing = [
        f"{where}: {line.strip()}"
        for where, doc in public_docstrings()
        for line in doc.splitlines()
        if PRIVATE.search(line)
    ]
    assert pointing == [], "\n".join(pointing)
