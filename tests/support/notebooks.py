"""Executing notebooks through nbclient against a real kernel, and reading their outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from support.kernels import kernel_manager

__all__ = ["FINISH", "execute", "gated_count", "notebook", "text_of"]

FINISH = "gate.set()\nprint(h.wait(60))"  # lets ``gated_count``'s run end, and waits


def gated_count(run_id: str) -> str:
    """A cell that starts the run ``run_id`` of three steps, each waiting for ``gate``
    (``FINISH`` sets it), and shows its handle ``h``."""
    return f"""%load_ext kernelext
import threading
import kernelext as kx

gate = threading.Event()

@kx.agent
def count(run, n):
    for i in run.steps(range(n)):
        gate.wait(60)
        run.state["done"] = i + 1
    return run.state["done"]

h = count.start(3, run_id="{run_id}")
h"""


def notebook(*cells: tuple[str, str]) -> Any:
    """A python3 notebook of code cells, each given as (its id, its source)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    for cell_id, source in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = cell_id
        nb.cells.append(cell)
    return nb


class _Client(NotebookClient):
    """nbclient's, its kernel on Unix sockets of its own (see ``kernel_manager``)."""

    def create_kernel_manager(self) -> AsyncKernelManager:
        self.km = kernel_manager(AsyncKernelManager)
        return self.km


def execute(nb: Any, env: dict[str, str], cwd: Path) -> Any:
    """Run every cell of ``nb`` in a fresh python3 kernel (``env`` added), widget state kept."""
    client = _Client(
        nb,
        timeout=120,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute(env={**os.environ, **env})
    return nb


def text_of(nb: Any, cell_id: str) -> str:
    """Everything the cell with id ``cell_id`` showed: streams, text/plain, tracebacks."""
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    parts: list[str] = []
    for out in cell.outputs:
        if out.get("output_type") == "stream":  # one stream in pieces (flushed when it was)
            parts.append(out.get("text", ""))
            continue
        parts.append("\n" + str(out.get("data", {}).get("text/plain", "")) + "\n")
        parts.extend(line + "\n" for line in out.get("traceback", []))
    return "".join(parts)
