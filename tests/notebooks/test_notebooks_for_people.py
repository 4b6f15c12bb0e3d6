"""The demo notebooks are for people: none presses its own buttons, and each asks the person
for the clicks the headless tests make.

Under Run All a person sees the run's panel and clicks Stop, Resume, a decision or Restart
there. A cell that presses a panel's button or stops the run in code takes that from the
person (and a later cell that needs what such a cell defined fails for a person who skipped
it). The headless tests click from their own harness (``support.clicks``), right where a
markdown cell asks the person to; this checks that the two agree. Nothing is executed here:
tests/browser/test_browser_run_all.py runs every notebook with nobody clicking.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from support.clicks import CLICKS

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
# A widget button pressed from code, or the run stopped from a cell.
PRESSES = re.compile(r"\.click\(\)|\b\w+_button\b|\.(force_)?stop\(|^%agent stop\b", re.M)


def notebook(name: str) -> nbformat.NotebookNode:
    return nbformat.read(next(p for p in NOTEBOOKS if p.stem == name), as_version=4)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_cell_presses_a_button_or_stops_the_run(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    pressed = [
        f"{c.get('id')}: {line.strip()}"
        for c in nb.cells
        if c.cell_type == "code"
        for line in c.source.splitlines()
        if PRESSES.search(line)
    ]
    assert pressed == [], f"{path.name} presses for the person: {pressed}"


def test_the_scan_sees_a_cell_that_presses() -> None:
    for line in (
        "panel.stop_button.click()",
        "widget.accept_button.disabled",
        "h.stop()",
        "h.force_stop()",
        "%agent stop report",
    ):
        assert PRESSES.search(line), line
    assert not PRESSES.search("print(h.wait())  # suspended after your Stop")


@pytest.mark.parametrize("name", sorted(CLICKS))
def test_each_click_the_tests_make_is_asked_of_the_person_there(name: str) -> None:
    cells = notebook(name).cells
    ids = [c.get("id") for c in cells]
    for click in CLICKS[name]:
        assert click.after in ids, f"{name}.ipynb has no cell {click.after!r} to click after"
        at = ids.index(click.after)
        near = [c.source for c in cells[max(at - 1, 0) : at + 2] if c.cell_type == "markdown"]
        asked = re.compile(rf"\*\*[^*]*\b{re.escape(click.button)}\b[^*]*\*\*")
        assert any(asked.search(text) for text in near), (
            f"{name}.ipynb: the tests click {click.button!r} after cell {click.after!r}, but no "
            "markdown cell next to it asks the person to (in bold)"
        )
