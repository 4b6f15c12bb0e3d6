"""Notebooks that keep their runs: ``kx.panel(run_id)`` reattaches a run in a new kernel.
Real kernels (nbclient) on a real DuckDB file: one notebook runs an agent, a second one,
in a fresh kernel, shows the run again. Time: about 20 s (two kernels).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from support.notebooks import execute, text_of

RUN = """
%load_ext kernelext
import kernelext as kx

@kx.agent
def count(run, n):
    for i in run.steps(range(n)):
        run.state["done"] = i + 1
    return run.state["done"]

h = count.start(3, run_id="saved-count")
print(h.wait(60))
"""

REATTACH = """
%load_ext kernelext
import kernelext as kx
p = kx.panel("saved-count")
print(p.run_id, p.status)
p
"""

TYPO = """
import kernelext as kx
kx.panel("saved-cuont")
"""


def notebook(*cells: tuple[str, str]) -> object:
    nb = nbformat.v4.new_notebook()
    for cell_id, source in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = cell_id
        nb.cells.append(cell)
    return nb


def test_kx_panel_reattaches_a_run_in_a_new_kernel_and_names_a_typo(tmp_path: Path) -> None:
    env = {"KERNELEXT_STORE": str(tmp_path / "saved.duckdb")}
    first = execute(notebook(("run", RUN)), env, tmp_path)
    assert "completed" in text_of(first, "run")

    second = notebook(("reattach", REATTACH))
    second.cells.append(nbformat.v4.new_code_cell(TYPO))
    second.cells[-1]["id"] = "typo"
    second.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    try:
        execute(second, env, tmp_path)
    except Exception as error:  # the typo cell raises: the outputs stay in the notebook
        assert "RunNotFound" in str(error) or "saved-cuont" in str(error)
    shown = text_of(second, "reattach")
    assert "saved-count completed" in shown
    outputs = next(c for c in second.cells if c["id"] == "reattach").outputs
    bundles = [o.get("data", {}) for o in outputs if o.get("output_type") == "execute_result"]
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles), bundles
    assert "saved-count" in text_of(second, "typo")
