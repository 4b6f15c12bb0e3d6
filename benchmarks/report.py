"""Targets and tables from a results dict (the content of ``results/latest.json``)."""

from __future__ import annotations

import statistics
from typing import Any

from .common import ratio

__all__ = ["evaluate", "markdown"]


def _med(node: dict[str, Any] | None, *path: str) -> float | None:
    for key in path:
        if node is None:
            return None
        node = node.get(key)
    if isinstance(node, dict):
        value = node.get("median")
        return float(value) if value is not None else None
    return float(node) if isinstance(node, (int, float)) else None


def _target(
    issue: int,
    metric: str,
    value: float | None,
    unit: str,
    ref_name: str,
    ref: float | None,
    limit: float,
    kind: str = "ratio",
) -> dict[str, Any]:
    """``kind='ratio'``: value/ref <= limit. ``kind='absolute'``: value <= limit."""
    r = ratio(value, ref) if kind == "ratio" else None
    measured = r if kind == "ratio" else value
    return {
        "issue": issue,
        "metric": metric,
        "value": value,
        "unit": unit,
        "reference": ref_name,
        "reference_value": ref,
        "ratio": r,
        "target": f"<= {limit:g}x {ref_name}" if kind == "ratio" else f"<= {limit:g} {unit}",
        "limit": limit,
        "met": None if measured is None else bool(measured <= limit),
    }


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of issues 2 and 3 that this run measured."""
    out: list[dict[str, Any]] = []
    anchors = results.get("anchors", {})
    duck, fsync = _med(anchors, "duckdb_commit_ms"), _med(anchors, "fsync_ms")
    steps = results.get("steps", {}).get("systems", {})
    kx_step = _med(steps, "kernelext", "mean_per_step_ms")
    if kx_step is not None:
        for rival, name, limit in (
            ("langgraph_sync", "LangGraph (sync)", 0.8),
            ("dbos", "DBOS step", 0.3),
        ):
            if rival in steps:
                out.append(
                    _target(
                        2,
                        "per-step hot path (not durable-visible)",
                        kx_step,
                        "ms",
                        name,
                        _med(steps, rival, "mean_per_step_ms"),
                        limit,
                    )
                )
    for row in results.get("snapshots", {}).get("rows", []):
        out.append(
            _target(
                2,
                f"snapshot {row['label']} {row['shape']}",
                _med(row, "kernelext_step_ms"),
                "ms",
                "file write+fsync",
                _med(row, "file_write_fsync_ms"),
                2.0,
            )
        )
    storage = results.get("storage", {})
    if "kernelext" in storage and "langgraph" in storage:
        out.append(
            _target(
                2,
                f"storage after {storage['n_steps']} appends",
                storage["kernelext"]["file_bytes"],
                "bytes",
                "LangGraph SqliteSaver",
                storage["langgraph"]["file_bytes"],
                0.05,
            )
        )
    modes = results.get("effects", {}).get("modes", {})
    for mode, systems in modes.items():
        overhead = systems.get("kernelext", {}).get("overhead_ms")
        if overhead is None:
            continue
        out.append(
            _target(3, f"effect critical path ({mode})", overhead, "ms", "DuckDB commit", duck, 1.0)
        )
        out.append(
            _target(
                3, f"effect critical path ({mode}), stretch", overhead, "ms", "fsync", fsync, 3.0
            )
        )
    resume = results.get("resume", {}).get("median_ms")
    if resume:
        out.append(
            _target(
                3,
                f"resume, {results['resume']['effects']:,} effects",
                resume["resume_call_to_action_ms"],
                "ms",
                "",
                None,
                500.0,
                kind="absolute",
            )
        )
    sql = results.get("sql")
    if sql:
        out.append(
            _target(
                3,
                f"kx.sql GROUP BY status, {sql['rows']:,} effects",
                sql["kx_sql_median_ms"],
                "ms",
                "",
                None,
                50.0,
                kind="absolute",
            )
        )
    out.extend(_e2e_targets(results.get("e2e") or {}, duck))
    out.extend(_batch_targets(results.get("batch") or {}))
    if results.get("dask"):
        from .dask_report import dask_targets

        out.extend(dask_targets(results["dask"]))
    return out


def _batch_targets(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21, item 8 (see ``benchmarks.batch``)."""
    out: list[dict[str, Any]] = []
    posts = batch.get("posts")
    if posts and "kernelext" in posts["systems"]:
        systems, n = posts["systems"], posts["items"]
        kx = _med(systems, "kernelext", "wall_s")
        for rival, name, limit in (
            ("threads", "ThreadPoolExecutor(32), nothing recorded", 1.2),
            ("dbos", "DBOS (async steps, gather)", 1.0),
            ("langgraph_sync", "LangGraph (Send, sync)", 1.0),
        ):
            if rival in systems:
                out.append(
                    _target(
                        21,
                        f"{n:,} POSTs (20 ms), 32 at a time, start to visible",
                        kx,
                        "s",
                        name,
                        _med(systems, rival, "wall_s"),
                        limit,
                    )
                )
    zero = batch.get("zero_latency")
    if zero:
        c32, c1 = _med(zero, "c32", "items_per_s"), _med(zero, "c1", "items_per_s")
        out.append(
            _target(
                21,
                f"zero-latency items, time per item at 32 vs 1 (>= 5x items/s), {zero['items']:,}",
                1000.0 / c32 if c32 else None,
                "ms",
                "concurrency 1",
                1000.0 / c1 if c1 else None,
                0.2,
            )
        )
        out.append(
            _target(
                35,
                f"CPU per recorded item, every thread, 32 at a time, {zero['items']:,} items",
                _med(zero, "c32", "cpu_ms_per_item"),
                "ms",
                "",
                None,
                0.6,
                kind="absolute",
            )
        )
    stop = batch.get("stop")
    if stop:
        out.append(
            _target(
                21,
                "stop with 32 in flight: suspended after the longest item in flight ended",
                _med(stop, "overhead_ms"),
                "ms",
                "",
                None,
                100.0,
                kind="absolute",
            )
        )
    big = batch.get("big")
    if big:
        res = big["resume"]
        out.append(
            _target(
                21,
                f"kx.resume to the first new item, {res['done_before']:,} of {big['items']:,} done",
                _med(res, "resume_to_first_item_ms"),
                "ms",
                "",
                None,
                1000.0,
                kind="absolute",
            )
        )
    return out


STEP_RIVALS = (("langgraph_sync", "LangGraph (sync)", 0.5), ("dbos", "DBOS", 0.3))  # issue 10


def _e2e_targets(e2e: dict[str, Any], duck: float | None) -> list[dict[str, Any]]:
    """Issue 10. Per step: issue 2's ratios, applied to the end-to-end figure."""
    out: list[dict[str, Any]] = []
    for n, block in (e2e.get("steps") or {}).items():
        systems = block["systems"]
        kx = _med(systems, "kernelext", "e2e_ms")
        if kx is None:
            continue
        for rival, name, limit in STEP_RIVALS:
            if rival in systems:
                out.append(
                    _target(
                        10,
                        f"per step end to end, {int(n):,} steps",
                        kx,
                        "ms",
                        name,
                        _med(systems, rival, "e2e_ms"),
                        limit,
                    )
                )
    effects = e2e.get("effects") or {}
    kx_effect = _med(effects.get("systems"), "kernelext", "e2e_ms")
    if kx_effect is not None:
        out.append(
            _target(
                10,
                f"per effect end to end, {effects['calls']:,} effects",
                kx_effect,
                "ms",
                "DuckDB commit",
                duck,
                0.5,
            )
        )
    lag = e2e.get("fold_lag") or {}
    for kind, unit in (("steps", "steps"), ("effects", "effects")):
        case = lag.get(kind)
        if case:
            out.append(
                _target(
                    10,
                    f"fold lag p99, {case['target_per_s']:,.0f} {unit}/s",
                    _med(case, "p99_ms"),
                    "ms",
                    "",
                    None,
                    100.0,
                    kind="absolute",
                )
            )
    two = e2e.get("two_processes")
    if two:
        out.append(
            _target(
                10,
                f"2 processes, one store: per step end to end, {two['n_steps']:,} steps each",
                _med(two, "shared_store", "e2e_ms_mean_of_two"),
                "ms",
                "own stores",
                _med(two, "own_stores", "e2e_ms_mean_of_two"),
                1.5,
            )
        )
    return out


ISSUE_TITLES = {
    2: "Issue 2: run engine",
    3: "Issue 3: effect ledger",
    10: "Issue 10: end to end (what a user waits for)",
    21: "Issue 21: batches, the write path keeps up",
    23: "Issue 23: items on a Dask cluster, one PostgreSQL ledger",
    35: "Issue 35: durability nearly free",
}


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "bytes":
        return f"{value / 1024:,.0f} KiB" if value < 1024 * 1024 else f"{value / 1048576:,.2f} MiB"
    if abs(value) >= 100:
        return f"{value:,.0f}{(' ' + unit) if unit else ''}"
    return f"{value:.3g}{(' ' + unit) if unit else ''}"


def _verdict(met: bool | None) -> str:
    return "—" if met is None else ("met" if met else "**not met**")


def markdown(results: dict[str, Any]) -> str:
    """One table of targets per issue, plus the rivals' figures for context."""
    lines: list[str] = []
    meta = results.get("meta", {})
    anchors = results.get("anchors", {})
    lines.append(
        f"Command: `{meta.get('command', 'python -m benchmarks')}`"
        f"{' (QUICK: smoke run, not comparable)' if meta.get('quick') else ''}  "
    )
    lines.append(
        f"Run: {meta.get('started', '?')}, {meta.get('duration_s', 0):.0f} s, "
        f"{meta.get('cpus', '?')} CPUs, load before {meta.get('loadavg', '?')}"
        + (f", after {meta['loadavg_end']}" if meta.get("loadavg_end") else "")
        + ", "
        f"Python {meta.get('python', '?')}, DuckDB {meta.get('duckdb', '?')}  "
    )
    code = meta.get("code")
    if code and code.get("git_head"):
        lines.append(
            f"Code: git {code['git_head']} + {code['kernelext_uncommitted_files']} uncommitted "
            f"file(s) under kernelext/ (sources sha256 {code['kernelext_sources_sha256']})  "
        )
    if anchors:
        lines.append(
            "Anchors (median ms): "
            + ", ".join(
                f"{name.removesuffix('_ms')} {_fmt(_med(anchors, name))}" for name in anchors
            )
        )
    lines.append("")
    targets = evaluate(results)
    for issue in ISSUE_TITLES:
        rows = [t for t in targets if t["issue"] == issue]
        if not rows:
            continue
        lines.append(ISSUE_TITLES[issue])
        lines.append("")
        lines.append("| metric | kernelext | reference | ratio | target | verdict |")
        lines.append("|---|---|---|---|---|---|")
        for t in rows:
            ref = (
                f"{t['reference']} {_fmt(t['reference_value'], t['unit'])}"
                if t["reference_value"] is not None
                else "—"
            )
            lines.append(
                f"| {t['metric']} | {_fmt(t['value'], t['unit'])} | {ref} | "
                f"{_fmt(t['ratio']) + 'x' if t['ratio'] is not None else '—'} | "
                f"{t['target']} | {_verdict(t['met'])} |"
            )
        lines.append("")
    lines.extend(_context(results))
    return "\n".join(lines).rstrip() + "\n"


def _context(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    steps = results.get("steps", {}).get("systems", {})
    if steps:
        lines.append(
            "Per step, hot path (not durable-visible), ms (loop time / steps; median single"
            " step in brackets): "
            + ", ".join(
                f"{name} {_fmt(_med(v, 'mean_per_step_ms'))} ({_fmt(_med(v, 'per_step_ms'))})"
                for name, v in steps.items()
            )
        )
        lines.append("")
    snaps = results.get("snapshots", {}).get("rows", [])
    if snaps:
        lines.append(
            "Snapshot work outside the store, one pass (ms): "
            + "; ".join(
                f"{r['label']} {r['shape']} ({_fmt(r['encoded_bytes'], 'bytes')} encoded): encode "
                f"{_fmt(r['encode_ms'])}, sha256 {_fmt(r['sha256_ms'])}"
                for r in snaps
            )
        )
        lines.append("")
    effects = results.get("effects", {})
    for mode, systems in effects.get("modes", {}).items():
        lines.append(
            f"Effect call {mode} (overhead ms beyond a bare call of "
            f"{_fmt(_med(effects, 'bare_call_ms'))} ms): "
            + ", ".join(f"{name} {_fmt(v['overhead_ms'])}" for name, v in systems.items())
        )
    if effects:
        lines.append("")
    storage = results.get("storage", {})
    if storage.get("kernelext"):
        kx = storage["kernelext"]
        lines.append(
            f"Storage: kernelext file {_fmt(kx['file_bytes'], 'bytes')} (empty store "
            f"{_fmt(kx['empty_store_bytes'], 'bytes')}), blob payload "
            f"{_fmt(kx['blob_payload_bytes'], 'bytes')} in {kx['blob_rows']} blobs; "
            + (
                f"LangGraph file {_fmt(storage['langgraph']['file_bytes'], 'bytes')}, "
                f"logical {_fmt(storage['langgraph']['logical_bytes'], 'bytes')}; "
                if storage.get("langgraph")
                else ""
            )
            + f"a full JSON copy per step would be "
            f"{_fmt(storage['full_copy_json_bytes'], 'bytes')}."
        )
        lines.append("")
    resume = results.get("resume", {}).get("median_ms")
    if resume:
        lines.append(
            "Resume (median ms): "
            + ", ".join(f"{k.removesuffix('_ms')} {_fmt(v)}" for k, v in resume.items())
        )
        lines.append("")
    sql = results.get("sql")
    if sql:
        lines.append(
            f"kx.sql: {_fmt(_med(sql, 'kx_sql_ms'))} ms (returns {sql['returns']}); "
            f"store.read (tuples, no Arrow) {_fmt(_med(sql, 'store_read_ms'))} ms; "
            f"tool x status {_fmt(_med(sql, 'kx_sql_tool_status_ms'))} ms."
        )
        lines.append("")
    lines.extend(_e2e_context(results.get("e2e") or {}, results.get("anchors", {})))
    if results.get("features"):
        from .features import feature_lines

        lines.extend(feature_lines(results["features"]))
    if results.get("batch"):
        from .batch import batch_lines

        lines.extend(batch_lines(results["batch"]))
    if results.get("dask"):
        from .dask_report import dask_lines

        lines.extend(dask_lines(results["dask"]))
    return lines


def _cell(node: dict[str, Any] | None) -> str:
    """``e2e (hot path)`` for one system's block."""
    if not node:
        return "—"
    hot = _med(node, "hot_path_ms")
    return f"{_fmt(_med(node, 'e2e_ms'))}" + (f" ({_fmt(hot)})" if hot is not None else "")


def _e2e_context(e2e: dict[str, Any], anchors: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    steps = e2e.get("steps") or {}
    if steps:
        names = list(next(iter(steps.values()))["systems"])
        lines.append(
            "Per step, ms: end to end = start → `completed` and visible in SQL, divided by the"
            " steps; in brackets the hot path (time between step bodies) of the same runs."
        )
        lines.append("")
        lines.append("| steps | reps | " + " | ".join(names) + " |")
        lines.append("|---|---|" + "---|" * len(names))
        for n, block in steps.items():
            lines.append(
                f"| {int(n):,} | {block['reps']} | "
                + " | ".join(_cell(block["systems"].get(name)) for name in names)
                + " |"
            )
        lines.append("")
    effects = e2e.get("effects") or {}
    if effects.get("systems"):
        names = list(effects["systems"])
        lines.append(
            f"Per effect, ms: {effects['calls']:,} no-op effects, {effects['calls_per_step']} to a"
            " step (kernelext), end to end = start → `completed` and every effect row `applied`"
            " in SQL (rivals: final checkpoint / SUCCESS readable), divided by the calls; in"
            " brackets the hot path (time between calls) of the same runs. DuckDB single-row"
            f" commit in this run: {_fmt(_med(anchors, 'duckdb_commit_ms'))} ms."
        )
        lines.append("")
        lines.append("| " + " | ".join(names) + " |")
        lines.append("|" + "---|" * len(names))
        lines.append("| " + " | ".join(_cell(effects["systems"][name]) for name in names) + " |")
        lines.append("")
    lag = e2e.get("fold_lag") or {}
    if lag:
        lines.append(
            "Fold lag (kernelext, one process): a paced agent and a sampler thread reading"
            f" with `{lag.get('read_path', '?')}` every"
            f" {lag['steps']['sample_s'] * 1000:.0f} ms. Lag of a record = first sample that"
            " shows it − when it was journaled (upper bound; lower bound p99 in brackets)."
            " Medians over the repetitions."
        )
        lines.append("")
        lines.append(
            "| load | records | target /s | achieved /s | p50 ms | p99 ms | max ms"
            " | p50 first ¼ → last ¼ ms | last record ms | commits |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for kind in ("steps", "effects"):
            case = lag.get(kind)
            if not case:
                continue
            commits = statistics.median(r["commits"] for r in case["runs"])
            label = kind if kind == "steps" else f"effects ({case['calls_per_step']} a step)"
            lines.append(
                f"| {label} | {case['records']:,.0f} | {case['target_per_s']:,.0f} | "
                f"{_fmt(_med(case, 'achieved_per_s'))} | {_fmt(_med(case, 'p50_ms'))} | "
                f"{_fmt(_med(case, 'p99_ms'))} ({_fmt(_med(case, 'p99_low_ms'))}) | "
                f"{_fmt(_med(case, 'max_ms'))} | {_fmt(_med(case, 'p50_first_quarter_ms'))} → "
                f"{_fmt(_med(case, 'p50_last_quarter_ms'))} | "
                f"{_fmt(_med(case, 'last_record_lag_ms'))} | "
                f"{commits:,.0f} |"
            )
        lines.append("")
    two = e2e.get("two_processes")
    if two:
        lines.append(
            f"Two processes, {two['n_steps']:,} steps each, started together (median of"
            f" {two['reps']}): per step end to end, ms, mean of the two processes (slower one;"
            " hot path) — own stores "
            f"{_fmt(_med(two, 'own_stores', 'e2e_ms_mean_of_two'))} "
            f"({_fmt(_med(two, 'own_stores', 'e2e_ms_slower'))}; "
            f"{_fmt(_med(two, 'own_stores', 'hot_path_ms'))}), one shared store "
            f"{_fmt(_med(two, 'shared_store', 'e2e_ms_mean_of_two'))} "
            f"({_fmt(_med(two, 'shared_store', 'e2e_ms_slower'))}; "
            f"{_fmt(_med(two, 'shared_store', 'hot_path_ms'))}); store opens per process in the"
            f" shared runs: {two['shared_store']['store_opens']}."
        )
    return lines
