"""Issue 10: end to end, what a user waits for.

The hot-path figures (``steps``, ``effects``) time the agent's side only: kernelext makes a
step or an effect durable in its journal and goes on, while a writer thread folds the
journal into the DuckDB tables later. Here the clock runs until a reader sees the result
in SQL:

- **steps**: ``agent.start(...)`` → ``handle.wait()`` → ``kx.sql("SELECT status,
  completed_steps FROM runs WHERE id = …")`` shows ``completed`` and every step, divided by
  the number of steps. LangGraph: ``invoke`` with ``durability="sync"`` until ``get_state``
  reads the final checkpoint. DBOS: the workflow until ``get_workflow_status`` reads SUCCESS.
  The hot path (time between step bodies) of the same runs is kept beside it.
- **effects**: the same for N ``@kx.effect`` calls with a no-op body, ``calls_per_step`` to
  a step, until every effect row reads ``applied`` as well; against the DuckDB single-row
  commit anchor (and LangGraph tasks / DBOS steps).
- **fold lag**: an agent paces itself (steps/s, effects/s) while a sampler thread in the same
  process counts, every ``lag_sample_s``, the step (effect) rows that read ``completed``
  (``applied``). The sampler reads with ``store.backend.read``, the backend's own read path,
  which does *not* first fold this process's journal (``store.read`` and ``kx.sql`` do, see
  ``StoreBase._catch_up``): it sees what the writer thread has committed, nothing more.
  Record k's lag is the end of the first sample that counts it minus the moment the agent
  had journaled it (an upper bound; the resolution is one sample interval plus one read).
- **two processes**: two processes run an agent of N steps at the same moment, each on its
  own store file, then both on one store file (they take turns with it, see
  ARCHITECTURE.md); per-step end to end in each, and the ratio shared / own.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .common import MARKS, Plan, deltas_ms, settle, summarize, tempdir

__all__ = ["kx_steps_e2e", "measure_e2e"]

Runner = Callable[[str, int], dict[str, Any]]
VISIBLE_TIMEOUT_S = 120.0
WARMUP_STEPS = 20
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _literal(text: str) -> str:
    """A SQL string literal (``kx.sql`` takes no parameters yet)."""
    return "'" + text.replace("'", "''") + "'"


def _first_row(result: Any) -> tuple[Any, ...]:
    """The first row of what ``kx.sql`` returns (a DataFrame, else a pyarrow Table)."""
    if hasattr(result, "itertuples"):
        rows = list(result.itertuples(index=False, name=None))
    else:
        rows = [tuple(r.values()) for r in result.to_pylist()]
    return tuple(rows[0]) if rows else ()


def _kx_e2e(
    store: Any,
    agent: Any,
    args: Sequence[Any],
    query: Callable[[str], str],
    done: Callable[[tuple[Any, ...]], bool],
) -> dict[str, Any]:
    """Start → wait → ``kx.sql`` until ``done(row)``; the clock covers all of it."""
    import kernelext as kx

    MARKS.clear()
    start = time.perf_counter()
    handle = agent.start(*args, store=store)
    status = handle.wait()
    if status != "completed":
        raise RuntimeError(f"{agent.name} ended {status}: {handle.error or handle.info()}")
    sql = query(handle.run_id)
    reads = 0
    while True:
        reads += 1
        row = _first_row(kx.sql(sql, store=store))
        if row and done(row):
            break
        if time.perf_counter() - start > VISIBLE_TIMEOUT_S:
            raise RuntimeError(f"{agent.name}: never visible in kx.sql (last row {row})")
        time.sleep(0.001)
    total = time.perf_counter() - start
    return {"total_s": total, "marks": list(MARKS), "reads": reads}


def kx_steps_e2e(store: Any, n: int) -> dict[str, Any]:
    """``noop_agent`` for ``n`` steps until ``kx.sql`` shows it completed with ``n`` steps."""
    from .kx_agents import noop_agent

    return _kx_e2e(
        store,
        noop_agent,
        (n,),
        lambda run_id: "SELECT status, completed_steps FROM runs WHERE id = " + _literal(run_id),
        lambda row: row[0] == "completed" and int(row[1]) == n,
    )


def kx_effects_e2e(store: Any, calls: int, per_step: int) -> dict[str, Any]:
    """``calls`` effects until the run reads completed and every effect row ``applied``."""
    from .kx_agents import effect_steps_agent

    def query(run_id: str) -> str:
        rid = _literal(run_id)
        return (
            "SELECT r.status, r.completed_steps, (SELECT count(*) FROM effects e"
            f" WHERE e.run_id = r.id AND e.status = 'applied') AS applied FROM runs r"
            f" WHERE r.id = {rid}"
        )

    steps = calls // per_step
    return _kx_e2e(
        store,
        effect_steps_agent,
        (calls, per_step),
        query,
        lambda row: row[0] == "completed" and int(row[1]) == steps and int(row[2]) == calls,
    )


def _on_fresh_store(folder: str, fn: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    from kernelext._store import open_store

    store = open_store(os.path.join(folder, "kx.duckdb"))  # opened outside the clock
    try:
        return fn(store)
    finally:
        store.close()


# -- per step and per effect, end to end ---------------------------------------------------
def _step_runners(systems: set[str]) -> dict[str, Runner]:
    runners: dict[str, Runner] = {}
    if "kernelext" in systems:
        runners["kernelext"] = lambda folder, n: _on_fresh_store(
            folder, lambda store: kx_steps_e2e(store, n)
        )
    if "langgraph" in systems:
        from . import rivals_langgraph

        runners["langgraph_sync"] = rivals_langgraph.steps_e2e
    if "dbos" in systems:
        from . import rivals_dbos

        runners["dbos"] = rivals_dbos.steps_e2e
    return runners


def _effect_runners(systems: set[str], per_step: int) -> dict[str, Runner]:
    runners: dict[str, Runner] = {}
    if "kernelext" in systems:
        runners["kernelext"] = lambda folder, n: _on_fresh_store(
            folder, lambda store: kx_effects_e2e(store, n, per_step)
        )
    if "langgraph" in systems:
        from . import rivals_langgraph

        runners["langgraph_task_sync"] = rivals_langgraph.effects_e2e
    if "dbos" in systems:
        from . import rivals_dbos

        runners["dbos_step"] = rivals_dbos.effects_e2e
    return runners


def _hot_path_ms(marks: Sequence[float]) -> float | None:
    """Mean time between consecutive bodies (steps) or calls (effects), in ms."""
    if len(marks) < 2:
        return None
    return (marks[-1] - marks[0]) / (len(marks) - 1) * 1000.0


def _interleaved(
    runners: dict[str, Runner], n: int, reps: int, label: str, warmup: int
) -> dict[str, Any]:
    """Each runner ``reps`` times on ``n`` (systems interleaved), per-unit medians in ms."""
    for name, runner in runners.items():  # imports, first kx.sql (pandas), DBOS launch
        with tempdir(f"e2e-warm-{name}") as folder:
            runner(folder, warmup)
    e2e: dict[str, list[float]] = {name: [] for name in runners}
    hot: dict[str, list[float]] = {name: [] for name in runners}
    hot_median: dict[str, list[float]] = {name: [] for name in runners}
    reads: dict[str, list[int]] = {name: [] for name in runners}
    for _ in range(reps):
        for name, runner in runners.items():
            settle()
            with tempdir(f"e2e-{label}-{name}") as folder:
                result = runner(folder, n)
            e2e[name].append(result["total_s"] / n * 1000.0)
            hot_ms = _hot_path_ms(result["marks"])
            if hot_ms is not None:
                hot[name].append(hot_ms)
                hot_median[name].append(statistics.median(deltas_ms(result["marks"])))
            reads[name].append(int(result["reads"]))
    return {
        name: {
            "e2e_ms": summarize(e2e[name], reps),
            "hot_path_ms": summarize(hot[name], reps) if hot[name] else None,
            "hot_path_median_single_ms": summarize(hot_median[name]) if hot[name] else None,
            "visible_after_reads": max(reads[name]),
        }
        for name in runners
    }


def measure_steps_e2e(plan: Plan, systems: set[str]) -> dict[str, Any]:
    runners = _step_runners(systems)
    out: dict[str, Any] = {}
    for n in plan.e2e_step_counts:
        reps = plan.e2e_reps(n)
        out[str(n)] = {
            "n_steps": n,
            "reps": reps,
            "systems": _interleaved(runners, n, reps, f"steps{n}", WARMUP_STEPS),
        }
    return out


def measure_effects_e2e(plan: Plan, systems: set[str]) -> dict[str, Any]:
    per_step = plan.e2e_calls_per_step
    calls = plan.e2e_effect_calls - plan.e2e_effect_calls % per_step
    runners = _effect_runners(systems, per_step)
    return {
        "calls": calls,
        "calls_per_step": per_step,
        "reps": plan.reps,
        "systems": _interleaved(runners, calls, plan.reps, "effects", 2 * per_step),
    }


# -- fold lag ---------------------------------------------------------------------------------
def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _lags(journaled: Sequence[float], samples: Sequence[tuple[float, float, int]]) -> dict:
    """Per record: first sample counting it (end) − journaled; and a lower bound."""
    high: list[float] = []
    low: list[float] = []
    k = 0
    previous_start: float | None = None
    for began, ended, count in samples:
        while k < min(count, len(journaled)):
            high.append(max(0.0, ended - journaled[k]) * 1000.0)
            floor = previous_start if previous_start is not None else began
            low.append(max(0.0, floor - journaled[k]) * 1000.0)
            k += 1
        previous_start = began
    return {"high": high, "low": low, "unseen": len(journaled) - k}


def _lag_run(
    store: Any, agent: Any, args: Sequence[Any], table_query: str, sample_s: float
) -> dict[str, Any]:
    """Run a paced agent while a sampler counts its visible records; lag per record."""
    from .kx_agents import JOURNALED

    run_id = f"{agent.name}-{uuid.uuid4().hex[:8]}"
    query = table_query.format(run_id=_literal(run_id))
    samples: list[tuple[float, float, int]] = []
    expected: list[int] = []  # set once the run has ended: how many records it journaled
    read = store.backend.read  # no catch-up: only what the writer thread committed

    def sampler() -> None:
        due = time.perf_counter()
        deadline = due + VISIBLE_TIMEOUT_S
        while True:
            began = time.perf_counter()
            rows = read(query)
            ended = time.perf_counter()
            count = int(rows[0][0] or 0) if rows else 0
            samples.append((began, ended, count))
            if (expected and count >= expected[0]) or ended > deadline:
                return
            due = max(due + sample_s, ended)
            time.sleep(max(0.0, due - time.perf_counter()))

    JOURNALED.clear()
    commits = store.commits
    thread = threading.Thread(target=sampler, name="kxbench-lag-sampler", daemon=True)
    thread.start()
    handle = agent.start(*args, run_id=run_id, store=store)
    handle.thread.join()  # not handle.wait(): its status read would fold the journal first
    run_end = time.perf_counter()
    journaled = list(JOURNALED)
    expected.append(len(journaled))
    thread.join(VISIBLE_TIMEOUT_S + 5)
    if handle.final_status != "completed":
        raise RuntimeError(f"{agent.name} ended {handle.final_status}: {handle.error}")
    lags = _lags(journaled, samples)
    span = journaled[-1] - journaled[0] if len(journaled) > 1 else 0.0
    reads_ms = [(b - a) * 1000.0 for a, b, _ in samples]
    high = lags["high"] or [float("nan")]
    return {
        "records": len(journaled),
        "seconds": span,
        "achieved_per_s": (len(journaled) - 1) / span if span else None,
        "p50_ms": _percentile(high, 0.5),
        "p99_ms": _percentile(high, 0.99),
        "max_ms": max(high),
        "p99_low_ms": _percentile(lags["low"] or [float("nan")], 0.99),
        "last_record_lag_ms": high[-1],
        # Does the fold keep up? A bounded lag is the same early and late in the run.
        "p50_first_quarter_ms": _percentile(high[: max(1, len(high) // 4)], 0.5),
        "p50_last_quarter_ms": _percentile(high[-max(1, len(high) // 4) :], 0.5),
        "run_thread_end_after_last_record_ms": (run_end - journaled[-1]) * 1000.0,
        "unseen": lags["unseen"],
        "samples": len(samples),
        "sample_read_ms_median": statistics.median(reads_ms) if reads_ms else None,
        "sample_read_ms_max": max(reads_ms) if reads_ms else None,
        "commits": store.commits - commits,
    }


def _lag_case(
    plan: Plan, label: str, make: Callable[[Any], dict[str, Any]], target_per_s: float
) -> dict[str, Any]:
    runs = []
    for _ in range(plan.lag_reps):
        settle()
        with tempdir(f"e2e-lag-{label}") as folder:
            runs.append(_on_fresh_store(folder, make))
    keys = (
        "p50_ms",
        "p99_ms",
        "max_ms",
        "p99_low_ms",
        "achieved_per_s",
        "last_record_lag_ms",
        "p50_first_quarter_ms",
        "p50_last_quarter_ms",
        "seconds",
    )
    return {
        "target_per_s": target_per_s,
        "records": statistics.median(r["records"] for r in runs),
        "sample_s": plan.lag_sample_s,
        **{key: summarize([r[key] for r in runs if r[key] is not None]) for key in keys},
        "runs": runs,
    }


def measure_fold_lag(plan: Plan) -> dict[str, Any]:
    from .kx_agents import paced_effects_agent, paced_steps_agent

    n_steps = max(2, int(plan.lag_step_rate * plan.lag_step_seconds))
    per_step = plan.lag_calls_per_step
    calls = max(per_step, int(plan.lag_effect_rate * plan.lag_effect_seconds))
    calls -= calls % per_step
    # Steps run to the end unless they fall far behind (then at most twice the time);
    # effects stop at the first step end after lag_effect_seconds, whatever rate they reach.
    step_args = (n_steps, plan.lag_step_rate, 2 * plan.lag_step_seconds)
    effect_args = (calls, plan.lag_effect_rate, per_step, plan.lag_effect_seconds)
    sample_s = plan.lag_sample_s
    with tempdir("e2e-lag-warm") as folder:  # first-run costs (imports, fingerprints)
        _on_fresh_store(
            folder,
            lambda store: _lag_run(
                store, paced_steps_agent, (10, plan.lag_step_rate, 1.0), STEPS_DONE, sample_s
            ),
        )
    steps = _lag_case(
        plan,
        "steps",
        lambda store: _lag_run(store, paced_steps_agent, step_args, STEPS_DONE, sample_s),
        plan.lag_step_rate,
    )
    effects = _lag_case(
        plan,
        "effects",
        lambda store: _lag_run(store, paced_effects_agent, effect_args, EFFECTS_APPLIED, sample_s),
        plan.lag_effect_rate,
    )
    effects["calls_per_step"] = per_step
    return {"read_path": "store.backend.read (no catch-up)", "steps": steps, "effects": effects}


STEPS_DONE = "SELECT count(*) FROM steps WHERE run_id = {run_id} AND status = 'completed'"
EFFECTS_APPLIED = "SELECT count(*) FROM effects WHERE run_id = {run_id} AND status = 'applied'"


# -- two processes on one store ------------------------------------------------------------
def _children(paths: Sequence[str], n: int, folder: str) -> list[dict[str, Any]]:
    """Start one child per path, release them together, collect their JSON lines."""
    env = {k: v for k, v in os.environ.items() if k != "KERNELEXT_STORE"}
    procs: list[tuple[subprocess.Popen[str], Any]] = []
    with contextlib.ExitStack() as stack:
        try:
            for i, path in enumerate(paths):
                err = stack.enter_context(
                    tempfile.TemporaryFile(mode="w+", dir=folder, prefix=f"child{i}-")
                )
                proc = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.e2e_child", path, str(n)],
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
                procs.append((proc, err))
            for proc, err in procs:
                _expect(proc, err, "ready")
            for proc, _ in procs:  # both go at (nearly) the same instant
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = [json.loads(_expect(proc, err, "{")) for proc, err in procs]
            for proc, _ in procs:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
            return results
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _expect(proc: subprocess.Popen[str], err: Any, prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        proc.kill()
        proc.wait()
        err.seek(0)
        raise RuntimeError(f"e2e child said {line!r}, expected {prefix!r}: {err.read()[-3000:]}")
    return line


def measure_two_processes(plan: Plan) -> dict[str, Any]:
    n = plan.two_proc_steps
    per_mode: dict[str, list[list[dict[str, Any]]]] = {"own_stores": [], "shared_store": []}
    for _ in range(plan.two_proc_reps):
        for mode in per_mode:  # interleaved
            settle()
            with tempdir(f"e2e-2proc-{mode}") as folder:
                if mode == "shared_store":
                    paths = [os.path.join(folder, "shared.duckdb")] * 2
                else:
                    paths = [os.path.join(folder, f"own{i}.duckdb") for i in range(2)]
                per_mode[mode].append(_children(paths, n, folder))
    out: dict[str, Any] = {"n_steps": n, "processes": 2, "reps": plan.two_proc_reps}
    for mode, reps in per_mode.items():
        out[mode] = {
            "e2e_ms_mean_of_two": summarize(
                [statistics.mean(c["e2e_ms"] for c in rep) for rep in reps]
            ),
            "e2e_ms_slower": summarize([max(c["e2e_ms"] for c in rep) for rep in reps]),
            "hot_path_ms": summarize(
                [statistics.mean(c["hot_path_ms"] for c in rep) for rep in reps]
            ),
            "store_opens": [[c["opens"] for c in rep] for rep in reps],
        }
    shared = out["shared_store"]["e2e_ms_mean_of_two"]["median"]
    own = out["own_stores"]["e2e_ms_mean_of_two"]["median"]
    out["ratio_shared_to_own"] = shared / own if own else None
    return out


# -- the topic ------------------------------------------------------------------------------
def measure_e2e(plan: Plan, systems: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("steps", lambda: measure_steps_e2e(plan, systems)),
        ("effects", lambda: measure_effects_e2e(plan, systems)),
    ]
    if "kernelext" in systems:
        parts.append(("fold_lag", lambda: measure_fold_lag(plan)))
        parts.append(("two_processes", lambda: measure_two_processes(plan)))
    for name, part in parts:
        t0 = time.perf_counter()
        out[name] = part()
        print(f"[bench]   e2e {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out
