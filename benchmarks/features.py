"""What a user waits for with the resume plan, the timeline, the OpenAI adapter, approvals and
a stop while another process holds the store.

- **plan**: ``kx.plan(run_id)`` on a suspended run of 1,000 completed steps with one applied
  effect each (the preview a person reads before Resume); anchor: ``kx.sql("SELECT count(*)
  FROM steps WHERE run_id = ?")`` on the same store, interleaved.
- **timeline**: ``kx.timeline(run_id).svg`` for the same run: reading the rows, drawing,
  and the SVG's size.
- **openai**: one model call through ``kx.openai(OpenAI(base_url=...))`` inside a run (one
  call per step) against the plain client outside a run, both on one ``OpenAI`` instance,
  against the scripted model server ``tests/support/llm_server.py`` started as a
  subprocess (with TCP_NODELAY, see ``LLM_SERVER``). ``create()`` alone covers the
  intent's fsync before the request and the outcome's journal record; the outcome is
  durable at the step's completion, which the per-step figure (time between step bodies)
  includes.
- **held_stop**: ``h.stop()`` to ``h.wait()`` returning ``suspended`` while another process
  holds the store file, against the same with the file free (``held_stop.py``).
- **approval**: from the call to ``approval.approve()`` (which resumes the run here) until
  the paid request is recorded by the local ``DeliveryServer`` and the effect reads
  ``applied`` in ``kx.sql``; anchor: the same one-step agent, suspended by a stop instead,
  resumed with ``kx.resume`` and timed the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kernelext as kx
from kernelext.status import EffectStatus, Status

from .common import KB, Plan, ratio, settle, summarize, tempdir
from .held_stop import measure_held_stop

__all__ = ["FeatureSizes", "feature_lines", "measure_features"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.join(REPO_ROOT, "tests")
WAIT_S = 120.0
MODEL = "scripted"
APPLIED = "SELECT count(*) FROM effects WHERE run_id = ? AND status = ?"
# The scripted model server, with TCP_NODELAY on its sockets: it writes a reply's headers
# and body in two sends, so with Nagle's algorithm on, the client's delayed ACK adds about
# 40 ms to every reply (measured: 48 ms a call, 1.5 ms with TCP_NODELAY), which would
# drown what is measured here. Model servers (uvicorn, vLLM) set TCP_NODELAY.
LLM_SERVER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from support import llm_server as m; "
    "m._Handler.disable_nagle_algorithm = True; sys.exit(m.main(sys.argv[1:]))"
)

# Set while the approval part runs: where ``feature_pay`` posts to.
PAY_URL: list[str] = []
# Runs whose one step stops itself once (the anchor of the approval round trip).
STOP_ONCE: set[str] = set()
# The recorded client and the per-step marks of the OpenAI part.
CLIENT: list[Any] = []
STEP_MARKS: list[float] = []
CALL_MS: list[float] = []


@dataclass
class FeatureSizes:
    """How much this topic measures; derived from the run's plan."""

    plan_steps: int
    plan_reps: int
    llm_calls: int
    llm_reps: int
    approval_reps: int

    @classmethod
    def of(cls, plan: Plan) -> FeatureSizes:
        if plan.quick:
            return cls(300, 3 * plan.reps, 30, plan.reps, 4 * plan.reps)
        return cls(1_000, 6 * plan.reps, 200, plan.reps, 4 * plan.reps)


# -- the agents ---------------------------------------------------------------------------
@kx.effect
def feature_ping(i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    return {"ok": True, "i": i}


@kx.agent(name="bench_features_long")
def long_agent(run: kx.Run, n: int) -> None:
    """``n`` steps of one effect each, then it stops itself: suspended before step ``n``."""
    for i in run.steps(range(n + 1)):
        feature_ping(i)
        if i == n - 1:
            kx.stop(run.id, source="bench")  # lands at the end of this step


@kx.effect(needs_approval=lambda to, amount, **kw: amount > 100)
def feature_pay(to: str, amount: int, *, idempotency_key: str | None = None) -> Any:
    from support.http_server import post_json

    return post_json(PAY_URL[0] + "/pay", {"to": to, "amount": amount}, idempotency_key).body


@kx.agent(name="bench_features_pay")
def pay_agent(run: kx.Run, to: str, amount: int) -> None:
    """One step, one payment; above 100 it waits for an approval. A run named in
    ``STOP_ONCE`` stops itself once at the start of its step (the step runs again)."""
    for _ in run.steps([to]):
        if run.id in STOP_ONCE:
            STOP_ONCE.discard(run.id)
            kx.stop(run.id, source="bench")
            run.checkpoint()
        run.state["paid"] = feature_pay(to, amount)


@kx.agent(name="bench_features_llm")
def llm_agent(run: kx.Run, n: int, tag: str) -> None:
    """One model call per step, timed around ``create()``; a mark at each step's start."""
    client = CLIENT[0]
    for i in run.steps(range(n)):
        STEP_MARKS.append(time.perf_counter())
        start = time.perf_counter()
        client.chat.completions.create(model=MODEL, messages=ask(f"{tag} {i}"))
        CALL_MS.append((time.perf_counter() - start) * 1000.0)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- helpers ------------------------------------------------------------------------------
def _support() -> None:
    """Make ``support.*`` (tests/support) importable, as pytest does for the tests."""
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)


def _count(store: Any, query: str, params: list[Any]) -> int:
    result = kx.sql(query, params, store=store)
    return int(result.iloc[0, 0]) if hasattr(result, "iloc") else int(result.column(0)[0].as_py())


def _wait_until(fn: Callable[[], bool], what: str) -> None:
    deadline = time.perf_counter() + WAIT_S
    while not fn():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"features: {what} not reached within {WAIT_S:.0f} s")
        time.sleep(0.001)


@contextlib.contextmanager
def _store(folder: str) -> Iterator[Any]:
    store = kx.open_store(os.path.join(folder, "kx.duckdb"))
    try:
        yield store
    finally:
        store.close()


# -- 1 and 2: the plan and the timeline of a long suspended run ---------------------------
def measure_plan_timeline(sizes: FeatureSizes) -> tuple[dict[str, Any], dict[str, Any]]:
    n = sizes.plan_steps
    count = "SELECT count(*) FROM steps WHERE run_id = ?"
    ms: dict[str, list[float]] = {k: [] for k in ("plan", "sql", "read", "draw", "svg")}
    with tempdir("features-plan") as folder, _store(folder) as store:
        run_id = f"features-long-{uuid.uuid4().hex[:8]}"
        handle = long_agent.start(n, run_id=run_id, store=store)
        if handle.wait(WAIT_S) != Status.SUSPENDED:
            raise RuntimeError(f"{run_id} ended {handle.final_status}: {handle.error}")
        applied = _count(store, APPLIED, [run_id, EffectStatus.APPLIED])
        if _count(store, count, [run_id]) != n or applied != n:
            raise RuntimeError(f"{run_id}: expected {n} steps and effects, got {applied}")
        preview = kx.plan(run_id, store)  # warm: imports, first reads
        svg = kx.timeline(run_id, store).render()
        for _ in range(sizes.plan_reps):
            settle()
            t0 = time.perf_counter()
            kx.plan(run_id, store)
            t1 = time.perf_counter()
            _count(store, count, [run_id])
            t2 = time.perf_counter()
            tl = kx.timeline(run_id, store)
            t3 = time.perf_counter()
            svg = tl.svg
            t4 = time.perf_counter()
            for key, a, b in (("plan", t0, t1), ("sql", t1, t2), ("read", t2, t3)):
                ms[key].append((b - a) * 1000.0)
            ms["draw"].append((t4 - t3) * 1000.0)
            ms["svg"].append((t4 - t2) * 1000.0)
    med = {key: statistics.median(values) for key, values in ms.items()}
    common = {"steps": n, "effects": applied, "reps": sizes.plan_reps}
    plan = {
        **common,
        "plan_ms": summarize(ms["plan"]),
        "count_steps_sql_ms": summarize(ms["sql"]),
        "ratio_plan_to_sql": ratio(med["plan"], med["sql"]),
        "plan_json_bytes": len(preview.to_json().encode("utf-8")),
    }
    timeline = {
        **common,
        "timeline_svg_ms": summarize(ms["svg"]),
        "read_ms": summarize(ms["read"]),
        "draw_ms": summarize(ms["draw"]),
        "svg_bytes": len(svg.encode("utf-8")),
        "ratio_to_count_sql": ratio(med["svg"], med["sql"]),
    }
    return plan, timeline


# -- 3: the OpenAI adapter ----------------------------------------------------------------
@contextlib.contextmanager
def _llm_server(folder: str) -> Iterator[str]:
    """``tests/support/llm_server.py`` in a subprocess of its own; yields its base URL."""
    script = os.path.join(folder, "script.json")
    with open(script, "w", encoding="utf-8") as out:
        json.dump([{"content": "ok"}], out)
    proc = subprocess.Popen(
        [sys.executable, "-c", LLM_SERVER, TESTS_DIR, "--script", script, "--until-stdin-closes"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"features: the model server did not start ({url!r})")
        yield url
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.terminate()
        proc.wait(10)


def _plain_calls(client: Any, n: int, tag: str) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        client.chat.completions.create(model=MODEL, messages=ask(f"{tag} {i}"))
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def _recorded_calls(store: Any, n: int, tag: str) -> tuple[list[float], list[float]]:
    STEP_MARKS.clear()
    CALL_MS.clear()
    handle = llm_agent.start(n, tag, run_id=f"features-llm-{tag}", store=store)
    if handle.wait(WAIT_S) != Status.COMPLETED:
        raise RuntimeError(f"llm run {tag} ended {handle.final_status}: {handle.error}")
    steps = [(b - a) * 1000.0 for a, b in itertools.pairwise(STEP_MARKS)]
    return list(CALL_MS), steps


def measure_openai(sizes: FeatureSizes) -> dict[str, Any]:
    from openai import OpenAI

    n = sizes.llm_calls
    plain_ms: list[float] = []
    call_ms: list[float] = []
    step_ms: list[float] = []
    with tempdir("features-llm") as folder, _llm_server(folder) as url, _store(folder) as store:
        client = OpenAI(base_url=url, api_key="bench", max_retries=0)
        CLIENT[:] = [kx.openai(client)]
        try:
            _plain_calls(client, 5, "warm")  # connection, first request, first run
            _recorded_calls(store, 5, "warm")
            for rep in range(sizes.llm_reps):
                settle()
                plain_ms.append(statistics.median(_plain_calls(client, n, f"plain{rep}")))
                settle()
                calls, steps = _recorded_calls(store, n, f"run{rep}")
                call_ms.append(statistics.median(calls))
                step_ms.append(statistics.median(steps))
            rows = _count(store, "SELECT count(*) FROM effects WHERE tool LIKE 'openai:%'", [])
        finally:
            CLIENT.clear()
            client.close()
    return {
        "calls": n,
        "reps": sizes.llm_reps,
        "server": "tests/support/llm_server.py in a subprocess, TCP_NODELAY",
        "plain_call_ms": summarize(plain_ms),
        "recorded_call_ms": summarize(call_ms),
        "recorded_step_ms": summarize(step_ms),
        "overhead_call_ms": statistics.median(call_ms) - statistics.median(plain_ms),
        "ratio_call": ratio(statistics.median(call_ms), statistics.median(plain_ms)),
        "ratio_step": ratio(statistics.median(step_ms), statistics.median(plain_ms)),
        "recorded_rows": rows,
    }


# -- 4: approval round trip ---------------------------------------------------------------
def _suspended_pay(store: Any, amount: int, stop_first: bool) -> str:
    run_id = f"features-pay-{uuid.uuid4().hex[:8]}"
    if stop_first:
        STOP_ONCE.add(run_id)
    handle = pay_agent.start("bob", amount, run_id=run_id, store=store)
    if handle.wait(WAIT_S) != Status.SUSPENDED:
        raise RuntimeError(f"{run_id} ended {handle.final_status}: {handle.error}")
    return run_id


def _round_trip(store: Any, server: Any, run_id: str, go: Callable[[], Any]) -> list[float]:
    """Clock from ``go()`` until the server has the payment and ``kx.sql`` reads it applied:
    [``go()`` returned, delivered, applied visible] in ms."""
    before = server.count()
    t0 = time.perf_counter()
    handle = go()
    t1 = time.perf_counter()
    server.wait_for(before + 1, timeout=WAIT_S)
    t2 = time.perf_counter()
    _wait_until(lambda: _count(store, APPLIED, [run_id, EffectStatus.APPLIED]) == 1, "applied")
    t3 = time.perf_counter()
    if handle is None or handle.wait(WAIT_S) != Status.COMPLETED:
        raise RuntimeError(f"{run_id} did not complete after its resume")
    return [(t - t0) * 1000.0 for t in (t1, t2, t3)]


def measure_approval(sizes: FeatureSizes) -> dict[str, Any]:
    _support()
    from support.http_server import DeliveryServer

    laps: dict[str, list[list[float]]] = {"approve": [], "resume": []}
    with tempdir("features-approval") as folder, _store(folder) as store, DeliveryServer() as srv:
        PAY_URL[:] = [srv.url]

        def approved(run_id: str) -> list[float]:
            [request] = kx.approvals(run_id, store=store)
            return _round_trip(store, srv, run_id, lambda: request.approve(note="bench"))

        def resumed(run_id: str) -> list[float]:
            return _round_trip(store, srv, run_id, lambda: kx.resume(run_id, store=store))

        try:
            approved(_suspended_pay(store, 500, False))  # warm
            resumed(_suspended_pay(store, 40, True))
            for _ in range(sizes.approval_reps):
                first, second = _suspended_pay(store, 500, False), _suspended_pay(store, 40, True)
                settle()
                laps["approve"].append(approved(first))
                settle()
                laps["resume"].append(resumed(second))
        finally:
            PAY_URL.clear()
            STOP_ONCE.clear()
    out: dict[str, Any] = {"reps": sizes.approval_reps}
    for name, runs in laps.items():
        for i, lap in enumerate(("returned", "to_delivered", "to_visible")):
            out[f"{name}_{lap}_ms"] = summarize([run[i] for run in runs])
    out["ratio_approve_to_resume"] = ratio(
        out["approve_to_visible_ms"]["median"], out["resume_to_visible_ms"]["median"]
    )
    return out


def measure_features(plan: Plan) -> dict[str, Any]:
    """Every part of the topic, one after the other (each on its own new store)."""
    sizes = FeatureSizes.of(plan)
    _support()
    plan_part, timeline_part = measure_plan_timeline(sizes)
    return {
        "plan": plan_part,
        "timeline": timeline_part,
        "openai": measure_openai(sizes),
        "approval": measure_approval(sizes),
        "held_stop": measure_held_stop(plan),
    }


# -- the table ----------------------------------------------------------------------------
def _f(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _med(block: dict[str, Any], key: str) -> float | None:
    node = block.get(key)
    return float(node["median"]) if isinstance(node, dict) else None


def _rows(features: dict[str, Any]) -> Iterator[tuple[str, float | None, str, float | None]]:
    """(what, median ms, anchor, anchor's median ms) for each row present."""
    plan, tl = features.get("plan"), features.get("timeline")
    count = "`kx.sql` count(*) of the run's steps"
    if plan:
        what = (
            f"`kx.plan`, suspended run of {plan['steps']:,} steps + {plan['effects']:,} effects"
            f" ({plan['reps']} reps)"
        )
        yield what, _med(plan, "plan_ms"), count, _med(plan, "count_steps_sql_ms")
    if plan and tl:
        what = (
            f"`kx.timeline(...).svg`, same run ({tl['svg_bytes'] / KB:,.0f} KiB of SVG; read"
            f" {_f(_med(tl, 'read_ms'))} + draw {_f(_med(tl, 'draw_ms'))} ms)"
        )
        yield what, _med(tl, "timeline_svg_ms"), count, _med(plan, "count_steps_sql_ms")
    llm = features.get("openai")
    if llm:
        plain = "plain client, outside a run"
        what = (
            f"model call, `kx.openai` in a run: `create()` ({llm['calls']} calls x"
            f" {llm['reps']}; overhead {_f(llm.get('overhead_call_ms'))} ms)"
        )
        yield what, _med(llm, "recorded_call_ms"), plain, _med(llm, "plain_call_ms")
        what = "model call + step completion (outcome durable): time between step bodies"
        yield what, _med(llm, "recorded_step_ms"), plain, _med(llm, "plain_call_ms")
    ask = features.get("approval")
    if ask:
        what = (
            f"`approve()` → delivered and `applied` in `kx.sql` ({ask['reps']} reps;"
            f" `approve()` returned {_f(_med(ask, 'approve_returned_ms'))} ms, delivered"
            f" {_f(_med(ask, 'approve_to_delivered_ms'))} ms)"
        )
        anchor = "`kx.resume` of the same agent, stopped"
        yield what, _med(ask, "approve_to_visible_ms"), anchor, _med(ask, "resume_to_visible_ms")
    held = features.get("held_stop")
    if held:
        what = (
            f"stop → `suspended` (`h.stop()` to `h.wait()`) while another process holds the"
            f" store file ({held['reps']} reps; in the tables"
            f" {_f(_med(held, 'to_tables_ms'))} ms after it is told to let go)"
        )
        anchor = "the same stop, the file free"
        yield what, _med(held, "held_stop_ms"), anchor, _med(held, "free_stop_ms")


def feature_lines(features: dict[str, Any] | None) -> list[str]:
    """The "Features (today's additions)" table of a results file."""
    if not features:
        return []
    lines = [
        "Features (today's additions), medians; anchors measured in the same run, interleaved.",
        "",
        "| what a user waits for | kernelext | anchor (same run) | ratio |",
        "|---|---|---|---|",
    ]
    for what, value, anchor, anchor_value in _rows(features):
        rate = ratio(value, anchor_value)
        lines.append(
            f"| {what} | {_f(value)} ms | {anchor} {_f(anchor_value)} ms | "
            f"{_f(rate) + 'x' if rate is not None else '—'} |"
        )
    return [*lines, ""]
