"""Notebooks that keep their runs: ``kx.panel(run_id)`` reattaches a run in a new kernel.
Real kernels (nbclient) on a real DuckDB file: one notebook runs an agent, a second one,
in a fresh kernel, shows the run again. Time: about 20 s (two kernels).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from support.notebooks import FINISH, execute, gated_count, notebook, text_of

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


def test_kx_panel_reattaches_a_run_in_a_new_kernel_and_names_a_typo(tmp_path: Path) -> None:
    env = {"KERNELEXT_STORE": str(tmp_path / "saved.duckdb")}
    first = execute(notebook(("run", RUN)), env, tmp_path)
    assert "completed" in text_of(first, "run")

    second = notebook(("reattach", REATTACH), ("typo", TYPO))
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


SHOWN = gated_count("saved-count")
TIMELINE = 'kx.timeline("saved-count")\n'


def saved_copies(nb: object, cell_id: str) -> list[str]:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)  # type: ignore[attr-defined]
    return [
        str(o["data"]["text/html"])
        for o in cell.outputs
        if "text/html" in o.get("data", {}) and "kernelext-saved" in o["data"]["text/html"]
    ]


def test_a_saved_and_exported_notebook_shows_the_panel_s_last_state_and_the_timeline(
    tmp_path: Path,
) -> None:
    from nbconvert import HTMLExporter

    env = {"KERNELEXT_STORE": str(tmp_path / "saved.duckdb")}
    nb = execute(
        notebook(("run", SHOWN), ("finish", FINISH), ("timeline", TIMELINE)), env, tmp_path
    )
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    copies = saved_copies(nbformat.read(path, as_version=4), "run")
    assert len(copies) == 1, copies
    assert "completed" in text_of(nb, "finish")
    assert "saved-count" in copies[0] and "completed" in copies[0]  # the last state
    assert "running" not in copies[0]
    assert (
        "kx.panel(&#x27;saved-count&#x27;)" in copies[0] or "kx.panel('saved-count')" in copies[0]
    )

    body, _ = HTMLExporter().from_filename(str(path))
    assert "kernelext-saved" in body and "saved-count" in body and "completed" in body
    assert "<svg" in body
