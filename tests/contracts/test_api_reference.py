"""Every public name has a section in the API reference (``docs/api/``), with an example.

The public namespaces are ``kernelext``, its modules without a leading underscore and
``kernelext.widgets``; their names are read from ``__all__`` here, at test time, so a name
or a namespace added later without its section fails. A section is a ``## `` heading of a
page (or the page's top, for a namespace itself) holding one ``::: path`` directive
(mkdocstrings renders the signature and docstring there) and a fenced example that uses
the name. A name re-exported elsewhere (``kx.RunNotFound`` is ``kernelext.errors.RunNotFound``)
is covered by the one section of its object. ``make docs`` builds the pages in strict mode.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kernelext

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (\S+)\s*$")
FENCE = re.compile(r"^```(python|pycon|ipython)\s*$")


def public_namespaces() -> list[str]:
    names = ["kernelext", "kernelext.widgets"]
    names += [
        f"kernelext.{m.name}"
        for m in pkgutil.iter_modules(kernelext.__path__)
        if not m.name.startswith("_")
    ]
    return sorted(set(names))


def page_of(namespace: str) -> Path:
    """``kernelext`` -> docs/api/kernelext.md, ``kernelext.errors`` -> docs/api/errors.md."""
    return PAGES / f"{namespace.rpartition('.')[2]}.md"


@dataclass
class Section:
    page: str
    heading: str
    directives: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)


def sections(text: str, page: str) -> list[Section]:
    """The page's top (up to its first ``## ``) and each ``## `` section, in order."""
    found = [Section(page, "(top of the page)")]
    fence: list[str] | None = None
    for line in text.splitlines():
        if fence is not None:
            if line.startswith("```"):
                found[-1].examples.append("\n".join(fence))
                fence = None
            else:
                fence.append(line)
        elif FENCE.match(line):
            fence = []
        elif line.startswith("## "):
            found.append(Section(page, line[3:].strip()))
        elif match := DIRECTIVE.match(line):
            found[-1].directives.append(match[1])
    return found


def all_sections() -> list[Section]:
    return [
        s
        for path in sorted(PAGES.glob("*.md"))
        for s in sections(path.read_text(encoding="utf-8"), path.name)
    ]


def resolve(path: str) -> Any:
    """The object a directive names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def uses(example: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", example) is not None


def undocumented(namespace: types.ModuleType, found: list[Section]) -> list[str]:
    """``namespace.__all__`` names with no section of their object that has an example."""
    objects = [(s, resolve(d)) for s in found for d in s.directives]
    missing = []
    for name in namespace.__all__:
        obj = getattr(namespace, name)
        covered = [s for s, documented in objects if documented is obj]
        if not any(uses(example, name) for s in covered for example in s.examples):
            missing.append(name)
    return missing


def test_the_public_namespaces_are_the_ones_the_reference_knows() -> None:
    assert {"kernelext", "kernelext.errors", "kernelext.status", "kernelext.widgets"} <= set(
        public_namespaces()
    )


@pytest.mark.parametrize("namespace", public_namespaces())
def test_every_public_namespace_has_its_page(namespace: str) -> None:
    page = page_of(namespace)
    assert page.is_file(), (
        f"{namespace} is public but has no page: add {page.relative_to(ROOT)} (one section "
        "per name in its __all__, see the other pages) and list it under nav in mkdocs.yml."
    )
    top = sections(page.read_text(encoding="utf-8"), page.name)[0]
    assert namespace in top.directives, (
        f"{page.relative_to(ROOT)} should show the module's docstring at its top: "
        f"'::: {namespace}' with members: false."
    )


@pytest.mark.parametrize("namespace", public_namespaces())
def test_every_public_name_has_a_section_with_an_example(namespace: str) -> None:
    module = importlib.import_module(namespace)
    assert module.__all__, f"{namespace} has an empty __all__"
    missing = undocumented(module, all_sections())
    assert not missing, (
        f"{namespace}: {missing} have no section in docs/api/ (a '## ' heading, then a "
        f"```python example that uses the name, then '::: {namespace}.<name>'); add one to "
        f"{page_of(namespace).relative_to(ROOT)}."
    )


def test_each_section_documents_one_object_that_exists() -> None:
    found = all_sections()
    for s in found[:]:
        if s.heading == "(top of the page)":
            assert len(s.directives) <= 1, f"{s.page}: the top holds {s.directives}"
            continue
        assert len(s.directives) == 1, (
            f"{s.page}, section {s.heading!r}: one '::: path' directive per section, "
            f"found {s.directives}"
        )
        try:
            resolve(s.directives[0])
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"{s.page}, section {s.heading!r}: {s.directives[0]} is not found ({exc})")
        assert s.examples, f"{s.page}, section {s.heading!r} has no ```python example"


def test_a_name_without_its_section_is_reported() -> None:
    fake = types.ModuleType("kernelext_fake")
    fake.agent = kernelext.agent  # type: ignore[attr-defined]
    fake.brand_new = object()  # type: ignore[attr-defined]
    fake.__all__ = ["agent", "brand_new"]
    assert undocumented(fake, all_sections()) == ["brand_new"]

    # A section without an example that uses the name does not count.
    bare = sections("## `kx.agent`\n\n```python\npass\n```\n\n::: kernelext.agent\n", "x.md")
    assert undocumented(fake, bare) == ["agent", "brand_new"]
