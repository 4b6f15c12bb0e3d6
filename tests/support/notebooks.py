"""Executing notebooks through nbclient against a real kernel, and reading their outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from support.kernels import kernel_manager

__all__ = ["execute", "text_of"]


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
