"""The targets and the markdown of the dask topic (``benchmarks.dask_batch``)."""

from __future__ import annotations

from typing import Any

from .dask_batch import TARGET_SPEEDUP

__all__ = ["dask_lines", "dask_targets"]


def dask_targets(dask: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 23: CPU-bound items on 2 worker processes, >= 1.7x threads in one process."""
    from .report import _target

    cpu = dask.get("cpu")
    if not cpu:
        return []
    return [
        _target(
            23,
            f"{cpu['items']:,} CPU items ({cpu['item_s'] * 1000:.0f} ms), LocalCluster of "
            f"{cpu['workers']} worker processes, time against threads (>= {TARGET_SPEEDUP}x)",
            cpu["systems"]["cluster"]["wall_s"]["median"],
            "s",
            "threads in one process",
            cpu["systems"]["threads"]["wall_s"]["median"],
            1.0 / TARGET_SPEEDUP,
        )
    ]


# -- the table ------------------------------------------------------------------------------
def _m(node: dict[str, Any] | None, key: str) -> float | None:
    value = (node or {}).get(key)
    if isinstance(value, dict):
        value = value.get("median")
    return float(value) if isinstance(value, (int, float)) else None


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def dask_lines(dask: dict[str, Any]) -> list[str]:
    """The markdown of the dask topic (``report.markdown`` appends it)."""
    lines = ["", "### Issue 23: items on a Dask cluster (`run.map(..., executor=client)`)", ""]
    if dask.get("skipped"):
        return [*lines, f"Skipped: {dask['skipped']}."]
    cpu = dask.get("cpu")
    if cpu:
        walls = cpu["systems"]
        lines += [
            f"{cpu['items']:,} CPU-bound items of {cpu['item_s'] * 1000:.0f} ms each (pure "
            f"Python, holds the GIL), {cpu['concurrency']} at a time, PostgreSQL store "
            f"(LocalCluster started in {_f(dask.get('cluster_start_s'), 1)} s):",
            "",
            "| where | wall (s) | ideal (s) |",
            "|---|---|---|",
            f"| LocalCluster, {cpu['workers']} worker processes × 1 thread | "
            f"{_f(_m(walls['cluster'], 'wall_s'), 1)} | {_f(cpu['ideal_cluster_s'], 1)} |",
            f"| threads in one process | {_f(_m(walls['threads'], 'wall_s'), 1)} | "
            f"{_f(cpu['ideal_threads_s'], 1)} |",
        ]
        if "dask_bare" in walls:
            lines.append(
                f"| the same cluster, plain `client.map`, nothing recorded | "
                f"{_f(_m(walls['dask_bare'], 'wall_s'), 1)} | {_f(cpu['ideal_cluster_s'], 1)} |"
            )
        lines += [
            "",
            f"Speed-up, cluster against threads: {_f(cpu['speedup'])}× "
            f"(target ≥ {TARGET_SPEEDUP}×; {cpu['workers']} workers allow {cpu['workers']}×)"
            + (
                f"; plain Dask on the same cluster: {_f(cpu['speedup_dask_bare'])}×"
                if cpu.get("speedup_dask_bare")
                else ""
            ),
        ]
    io = dask.get("io")
    if io:
        lines += [
            "",
            f"{io['items']:,} items, one recorded POST each to a local server answering in "
            f"{io['server_delay_ms']:.0f} ms, {io['concurrency']} at a time (ideal "
            f"{io['ideal_s']:.2f} s; the cluster: {io['workers']} worker processes × "
            f"{io['threads_per_worker']} threads):",
            "",
            "| where | wall (s) | × plain threads |",
            "|---|---|---|",
        ]
        for name, node in io["systems"].items():
            r = io["ratio_to_plain_threads"].get(name)
            lines.append(f"| {name.replace('_', ' ')} | {_f(_m(node, 'wall_s'), 3)} | {_f(r)} |")
    over = dask.get("overhead")
    if over:
        per = over["ms_per_item"]
        lines += [
            "",
            f"{over['items']:,} items of one no-op effect each, ms per item (one PostgreSQL "
            f"commit in this run: {_f(over['pg_commit_ms'], 3)} ms):",
            "",
            "| at a time | cluster | in process | × in process | bare Dask task |",
            "|---|---|---|---|---|",
            f"| 1 | {_f(_m(per, 'cluster_c1'))} | {_f(_m(per, 'in_process_c1'))} | "
            f"{_f(over['cluster_to_in_process']['c1'])} | {_f(_m(per, 'dask_task_c1'))} |",
            f"| 8 | {_f(_m(per, 'cluster_c8'))} | {_f(_m(per, 'in_process_c8'))} | "
            f"{_f(over['cluster_to_in_process']['c8'])} | {_f(_m(per, 'dask_task_map'))} "
            "(`client.map`) |",
        ]
    return lines
