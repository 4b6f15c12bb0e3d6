"""Issue 2: snapshot cost for 1 KB, 1 MB and 10 MB states, per state shape.

The agent assigns a new value of the given size to ``run.state`` in every step, so
every step boundary encodes and durably stores it. The cost of a step boundary is
compared with the floor for storing those bytes: create a file, write, fsync.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from .common import KB, MB, Plan, deltas_ms, file_write_fsync_ms, settle, summarize, tempdir

__all__ = ["SHAPES", "measure_snapshots", "payloads"]

ROW_TEXT = "order-line note: shipped, signed for at the front desk"  # ~52 chars per row


def _bytes_values(size: int, count: int) -> list[Any]:
    base = os.urandom(size)
    return [bytes([i % 256]) + base[1:] for i in range(count)]


def _arrow_values(size: int, count: int) -> list[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = max(1, size // (8 + 4 + len(ROW_TEXT)))
    base = pa.table({"id": pa.array(range(rows), pa.int64()), "note": [ROW_TEXT] * rows})
    return [base.set_column(0, "id", pc.add(base["id"], i)) for i in range(count)]


def _json_values(size: int, count: int) -> list[Any]:
    text = "item text " * 6  # 60 chars, ~63 bytes once quoted and comma-separated
    items = max(1, size // (len(text) + 3))
    base = [text] * items
    out = []
    for i in range(count):
        value = list(base)
        value[0] = f"variant {i}"  # not an append: the whole list is stored again
        out.append(value)
    return out


SHAPES: dict[str, Callable[[int, int], list[Any]]] = {
    "bytes": _bytes_values,
    "arrow_table": _arrow_values,
    "json_list_of_str": _json_values,
}


def payloads(shape: str, size: int, count: int) -> list[Any]:
    return SHAPES[shape](size, count)


def _components(value: Any) -> dict[str, float]:
    """Where a snapshot of ``value`` spends its time outside the store (one pass, ms)."""
    from kernelext._core.encoding.codec import encode

    start = time.perf_counter()
    _, payload = encode(value, where="bench")
    encoded = time.perf_counter()
    hashlib.sha256(payload).digest()
    hashed = time.perf_counter()
    return {
        "encode_ms": (encoded - start) * 1000.0,
        "sha256_ms": (hashed - encoded) * 1000.0,
        "encoded_bytes": float(len(payload)),
    }


def measure_snapshots(plan: Plan) -> dict[str, Any]:
    from . import kx_agents
    from .kx_runs import run_agent

    rows = []
    for size in plan.snapshot_sizes:
        steps = plan.snapshot_steps(size)
        for shape in SHAPES:
            values = payloads(shape, size, steps)
            parts = _components(values[0])
            encoded = os.urandom(int(parts["encoded_bytes"]))
            kx_reps: list[float] = []
            floor_reps: list[float] = []
            for _ in range(plan.reps):
                settle()
                kx_agents.PAYLOADS[:] = values
                with tempdir("snapshot") as folder:
                    marks = run_agent(folder, kx_agents.payload_agent, steps)
                    floor = [file_write_fsync_ms(folder, encoded) for _ in range(max(3, steps))]
                kx_reps.append(statistics.median(deltas_ms(marks)))
                floor_reps.append(statistics.median(floor))
            kx_agents.PAYLOADS.clear()
            rows.append(
                {
                    "shape": shape,
                    "size": size,
                    "label": _label(size),
                    "encoded_bytes": int(parts["encoded_bytes"]),
                    "steps_per_rep": steps,
                    "kernelext_step_ms": summarize(kx_reps, (steps - 1) * plan.reps),
                    "file_write_fsync_ms": summarize(floor_reps),
                    "encode_ms": parts["encode_ms"],
                    "sha256_ms": parts["sha256_ms"],
                }
            )
    return {"rows": rows}


def _label(size: int) -> str:
    return f"{size // MB} MB" if size >= MB else f"{size // KB} KB"
