"""Panel add-ons register one way: the registry ``kernelext.widgets._addons``.

Importing ``kernelext.widgets`` installs every add-on (timeline, plan, approvals,
expired-run banner, decision widgets), with no other module to import; loading the
IPython extension installs every one and fills its four renderer slots; unloading takes
every add-on out and puts the four renderers back together.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.fresh_python import printed_by_fresh_python

from kernelext._core.process.runtime import runtime
from kernelext._ipython import extension
from kernelext.widgets import NEEDS_DECISION_WIDGETS, PANEL_ADDONS
from kernelext.widgets import _addons as addons

EVERY_ADDON = {
    "timeline_addon",
    "plan_addon",
    "approvals_addon",
    "expired_addon",
    "reconciliation_for_panel",
    "revalidation_for_panel",
}


def installed_names() -> set[str]:
    return {factory.__name__ for factory in (*PANEL_ADDONS, *NEEDS_DECISION_WIDGETS)}


@pytest.fixture
def shell(store_path: Path) -> Iterator[InteractiveShell]:
    ip = InteractiveShell.instance()
    runtime().settings.use_store(str(store_path))
    yield ip
    ip.run_line_magic("unload_ext", "kernelext")
    addons.install()  # as importing the widgets left them, for the next tests
    runtime().settings.close()
    runtime().settings.use_store(None)


def test_the_registry_lists_every_addon_once() -> None:
    assert {factory.__name__ for _slot, factory in addons.ADDONS} == EVERY_ADDON
    assert len(addons.ADDONS) == len(EVERY_ADDON)


def test_importing_the_widgets_installs_every_addon_with_no_other_import() -> None:
    code = (
        "import sys, kernelext.widgets as w\n"
        "print(sorted(f.__name__ for f in (*w.PANEL_ADDONS, *w.NEEDS_DECISION_WIDGETS)))\n"
    )
    # the expired banner included
    assert printed_by_fresh_python(code).strip() == str(sorted(EVERY_ADDON))


def test_loading_the_extension_installs_every_addon_and_unloading_removes_every_one(
    shell: InteractiveShell,
) -> None:
    addons.uninstall()
    settings = runtime().settings
    before = {slot: getattr(settings, slot) for slot in extension.RENDERERS}
    assert installed_names() == set()

    shell.run_line_magic("load_ext", "kernelext")
    assert installed_names() == EVERY_ADDON and addons.installed()
    assert {slot: getattr(settings, slot) for slot in extension.RENDERERS} == extension.RENDERERS

    shell.run_line_magic("unload_ext", "kernelext")
    assert installed_names() == set() and not addons.installed()
    assert {slot: getattr(settings, slot) for slot in extension.RENDERERS} == before

    shell.run_line_magic("load_ext", "kernelext")  # loaded again: every one again, once
    assert sorted(f.__name__ for f in (*PANEL_ADDONS, *NEEDS_DECISION_WIDGETS)) == sorted(
        EVERY_ADDON
    )
