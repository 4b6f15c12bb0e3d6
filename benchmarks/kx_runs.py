"""Running a kernelext agent on a fresh store file and collecting what it marked."""

from __future__ import annotations

import os
from typing import Any

from .common import MARKS

__all__ = ["run_agent"]


def run_agent(folder: str, agent: Any, *args: Any, store_name: str = "kx.duckdb") -> list[float]:
    """Start ``agent`` on a new store in ``folder``, wait for it, return MARKS."""
    from kernelext._store import open_store

    store = open_store(os.path.join(folder, store_name))
    try:
        MARKS.clear()
        handle = agent.start(*args, store=store)
        status = handle.wait()
        if status != "completed":
            raise RuntimeError(
                f"benchmark agent {agent.name} ended {status}: {handle.error or handle.info()}"
            )
        return list(MARKS)
    finally:
        store.close()
