"""Issue 2: storage after N steps that each append one message to a list.

kernelext bytes = the DuckDB file after CHECKPOINT (plus its WAL, if any) plus the
side files large blobs go to. The logical payload (sum of blob sizes) is reported
too, since a DuckDB file is allocated in 256 KB blocks and never shrinks to it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .common import Plan, dir_bytes, tempdir

__all__ = ["measure_storage"]


def _checkpointed_bytes(path: str) -> int:
    import duckdb

    con = duckdb.connect(path)
    con.execute("CHECKPOINT")
    con.close()
    return sum(dir_bytes(path + suffix) for suffix in ("", ".wal", ".blobs"))


def _kernelext(folder: str, n: int) -> dict[str, int]:
    from kernelext._store import open_store

    from .kx_agents import messages_agent

    path = os.path.join(folder, "kx-storage.duckdb")
    store = open_store(path)
    try:
        handle = messages_agent.start(n, store=store)
        if handle.wait() != "completed":
            raise RuntimeError(f"storage agent ended {handle.status}: {handle.error}")
        blob_bytes, blob_count = store.read("SELECT coalesce(sum(size), 0), count(*) FROM blobs")[0]
        manifest_bytes = store.read("SELECT coalesce(sum(length(manifest)), 0) FROM snapshots")[0][
            0
        ]
    finally:
        store.close()
    empty = os.path.join(folder, "kx-empty.duckdb")
    open_store(empty).close()
    return {
        "file_bytes": _checkpointed_bytes(path),
        "empty_store_bytes": _checkpointed_bytes(empty),
        "blob_payload_bytes": int(blob_bytes),
        "blob_rows": int(blob_count),
        "manifest_bytes": int(manifest_bytes),
    }


def _full_copies(n: int) -> int:
    """What storing the whole list at every step would take (JSON), for scale."""
    from .kx_agents import message

    total, running = 0, 2
    for i in range(n):
        running += len(json.dumps(message(i), separators=(",", ":")).encode()) + 1
        total += running
    return total


def measure_storage(plan: Plan, systems: set[str]) -> dict[str, Any]:
    n = plan.storage_steps
    from .kx_agents import message

    out: dict[str, Any] = {
        "n_steps": n,
        "message_json_bytes": len(json.dumps(message(1), separators=(",", ":"))),
        "full_copy_json_bytes": _full_copies(n),
    }
    if "kernelext" in systems:
        with tempdir("storage-kx") as folder:
            out["kernelext"] = _kernelext(folder, n)
    if "langgraph" in systems:
        from . import rivals_langgraph

        with tempdir("storage-lg") as folder:
            out["langgraph"] = rivals_langgraph.storage_bytes(folder, n)
    return out
