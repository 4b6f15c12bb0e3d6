"""Issue 3: resume time for a run with many recorded effects, in a new process.

Build: the real agent runs 100 steps with one effect each and suspends itself;
then the ledger is padded to the wanted size with ``applied`` rows for those
completed steps (keys and argument hashes computed as kernelext computes them),
bulk-inserted from a Parquet file inside one ``store.write`` job. Measure: a child
process configures the store (not yet open) and calls ``kx.resume``, which opens it;
the clock stops when the first new effect body runs (after its intent is durable).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from .common import Plan, settle, summarize, tempdir

__all__ = ["build_resume_store", "measure_resume"]

RUN_ID = "bench-resume"
DONE_STEPS = 100
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pad_ledger(store: Any, total: int) -> None:
    """Pad the ledger in one job: list parameters unnested in SQL (the store's DuckDB
    instance has external access off, so it cannot read a Parquet file)."""
    from kernelext._core.ledger.effect import args_hash, effect_key

    per_step = max(1, total // DONE_STEPS)
    cols: dict[str, list[Any]] = {k: [] for k in ("key", "step", "call", "hash", "args", "res")}
    for step in range(DONE_STEPS):
        for call in range(1, per_step):  # call 0 of each step was made for real
            cols["key"].append(str(effect_key(RUN_ID, str(step), "resume_ping", call)))
            cols["step"].append(step)
            cols["call"].append(call)
            cols["hash"].append(args_hash((step, call), {}))
            cols["args"].append(json.dumps({"i": step, "j": call}))
            cols["res"].append(json.dumps({"ok": True, "i": call}))
    now = store.now()

    def job(tx: Any) -> None:
        tx.execute(
            "INSERT INTO effects (key, run_id, step_key, step_ordinal, tool, call_ordinal,"
            " args_hash, args, status, resumable, result, intent_at, outcome_at)"
            " SELECT CAST(key AS UUID), ?, CAST(step AS VARCHAR), step, 'resume_ping', call,"
            " hash, args, 'applied', TRUE, res, ?, ? FROM (SELECT"
            " unnest(?::VARCHAR[]) AS key, unnest(?::INTEGER[]) AS step,"
            " unnest(?::INTEGER[]) AS call, unnest(?::VARCHAR[]) AS hash,"
            " unnest(?::VARCHAR[]) AS args, unnest(?::VARCHAR[]) AS res)",
            (RUN_ID, now, now, *(cols[k] for k in ("key", "step", "call", "hash", "args", "res"))),
        )

    store.write(job)


def build_resume_store(folder: str, total_effects: int) -> tuple[str, int]:
    """A store holding suspended run RUN_ID with ``total_effects`` ledger rows."""
    from kernelext._store import open_store

    from .kx_agents import resume_agent

    path = os.path.join(folder, "resume.duckdb")
    store = open_store(path)
    try:
        handle = resume_agent.start(DONE_STEPS + 1, 1, DONE_STEPS - 1, run_id=RUN_ID, store=store)
        if handle.wait() != "suspended":
            raise RuntimeError(f"resume build run ended {handle.status}: {handle.error}")
        _pad_ledger(store, total_effects)
        count = store.read("SELECT count(*) FROM effects WHERE run_id = ?", (RUN_ID,))[0][0]
    finally:
        store.close()
    return path, int(count)


def _copy_store(source: str, target_dir: str) -> str:
    target = os.path.join(target_dir, os.path.basename(source))
    for suffix in ("", ".wal"):
        if os.path.exists(source + suffix):
            shutil.copy(source + suffix, target + suffix)
    if os.path.isdir(source + ".blobs"):
        shutil.copytree(source + ".blobs", target + ".blobs")
    return target


def run_child(store_path: str, profile_out: str | None = None) -> dict[str, float]:
    """Resume RUN_ID in a new process; returns its timings (ms)."""
    cmd = [sys.executable, "-m", "benchmarks.resume_child", store_path, RUN_ID]
    if profile_out:
        cmd.append(profile_out)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("KERNELEXT_STORE", None)
    spawn = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    marks = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or "action" not in marks:
        raise RuntimeError(
            f"resume child failed ({proc.returncode}): {marks} {proc.stderr[-2000:]}"
        )

    def ms(a: float, b: float) -> float:
        return (b - a) * 1000.0

    return {
        "interpreter_start_ms": ms(spawn, marks["start"]),
        "import_ms": ms(marks["start"], marks["imported"]),
        "resume_call_returned_ms": ms(marks["t0"], marks.get("returned", marks["action"])),
        "resume_call_to_action_ms": ms(marks["t0"], marks["action"]),
        "process_start_to_action_ms": ms(spawn, marks["action"]),
    }


def measure_resume(plan: Plan) -> dict[str, Any]:
    with tempdir("resume-build") as build:
        started = time.perf_counter()
        source, count = build_resume_store(build, plan.resume_effects)
        build_s = time.perf_counter() - started
        per_rep: list[dict[str, float]] = []
        for _ in range(plan.resume_reps):
            settle()
            with tempdir("resume-rep") as rep:
                per_rep.append(run_child(_copy_store(source, rep)))
    keys = per_rep[0].keys()
    return {
        "effects": count,
        "completed_steps": DONE_STEPS,
        "build_seconds": build_s,
        "timings": {k: summarize([r[k] for r in per_rep]) for k in keys},
        "raw": {k: [round(r[k], 3) for r in per_rep] for k in keys},
        "median_ms": {k: statistics.median(r[k] for r in per_rep) for k in keys},
    }
