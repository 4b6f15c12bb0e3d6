"""``python -m benchmarks [run|table|profile] ...`` — see ``--help`` and BENCHMARKS.md."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import RESULTS_SCHEMA
from .common import Plan, summarize

TOPICS = (
    "anchors",
    "steps",
    "effects",
    "snapshots",
    "storage",
    "resume",
    "sql",
    "e2e",
    "features",
    "batch",
    "dask",
)
SYSTEMS = ("kernelext", "langgraph", "dbos")
RIVAL_MODULES = {"langgraph": "langgraph.checkpoint.sqlite", "dbos": "dbos"}
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure kernelext against its anchors, LangGraph and DBOS in one run.",
    )
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="measure (the default command)")
    _run_options(run)
    _run_options(parser)
    table = sub.add_parser("table", help="print the tables of a results file")
    table.add_argument(
        "path",
        nargs="?",
        default=os.path.join(RESULTS_DIR, "latest.json"),
        help="a results file, or the name of one in benchmarks/results (e.g. 'e2e')",
    )
    table.add_argument(
        "--into",
        metavar="DOC",
        help="also replace the generated block of that run in DOC (e.g. BENCHMARKS.md), "
        "between '<!-- bench:NAME:begin -->' and '<!-- bench:NAME:end -->'",
    )
    prof = sub.add_parser("profile", help="cProfile a kernelext workload, every thread")
    from .profiling import TOPICS as PROFILE_TOPICS

    prof.add_argument("topic", choices=sorted(PROFILE_TOPICS))
    prof.add_argument("--quick", action="store_true")
    prof.add_argument("--limit", type=int, default=25, help="functions shown per thread")
    prof.add_argument(
        "--cpu",
        action="store_true",
        help="time each thread by its CPU clock (waits count for nothing), not the wall clock",
    )
    cpu = sub.add_parser(
        "cpu", help="CPU per recorded item, every thread counted (a 32-wide zero-latency map)"
    )
    cpu.add_argument("--items", type=int, default=3_000)
    cpu.add_argument("--concurrency", type=int, default=32)
    cpu.add_argument("--reps", type=int, default=5)
    cpu.add_argument("--out", default=None, help="also write the figures as JSON here")
    diag = sub.add_parser("diagnose", help="time each statement kernelext commits per step")
    diag.add_argument("--ops", type=int, default=200)
    return parser


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and 2 repetitions: a smoke run, not comparable figures",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated topics and/or systems, e.g. 'kernelext' or "
        f"'steps,langgraph'. Topics: {', '.join(TOPICS)}. "
        f"Systems: {', '.join(SYSTEMS)}.",
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5, quick 2)")
    parser.add_argument(
        "--batch-scale",
        type=float,
        default=1.0,
        help="the batch topic's sizes times this (0.1: 200 POSTs, a 10,000-item map); "
        "--quick makes them smaller still",
    )
    parser.add_argument(
        "--dask-scale",
        type=float,
        default=1.0,
        help="the dask topic's sizes times this (0.1: 40 CPU items of 200 ms, 128 POSTs); "
        "--quick makes them smaller still",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="where to write the JSON results (default: benchmarks/results/latest.json; "
        "with --only TOPIC..., benchmarks/results/TOPIC[-TOPIC...].json; --quick adds '-quick')",
    )


def _selection(only: str) -> tuple[list[str], set[str], list[str]]:
    words = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in words if w not in TOPICS and w not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--only: unknown name(s) {unknown}; choose from {TOPICS + SYSTEMS}")
    topics = [t for t in TOPICS if t in words] or list(TOPICS)
    if "anchors" not in topics:
        topics.insert(0, "anchors")  # every ratio needs them
    asked = {w for w in words if w in SYSTEMS}
    systems = set(asked or SYSTEMS)
    notes = []
    for system, module in RIVAL_MODULES.items():
        if system in systems and importlib.util.find_spec(module.split(".")[0]) is None:
            if system in asked:
                raise SystemExit(f"{system} is not installed: pip install -e '.[bench]'")
            systems.discard(system)
            notes.append(f"{system} not installed: skipped (pip install -e '.[bench]')")
    return topics, systems, notes


def _default_out(topics: list[str], quick: bool) -> str:
    """``latest.json`` for every topic; a subset gets its own file, so it clobbers nothing.

    A quick run gets a ``-quick`` suffix: a smoke run never replaces real figures.
    """
    chosen = [t for t in topics if t != "anchors"]
    every = set(chosen) == set(TOPICS) - {"anchors"}
    name = "latest" if every else "-".join(chosen or ["anchors"])
    return os.path.join(RESULTS_DIR, name + ("-quick" if quick else "") + ".json")


def _results_path(name: str) -> str:
    if os.path.exists(name) or os.sep in name or name.endswith(".json"):
        return name
    return os.path.join(RESULTS_DIR, f"{name}.json")


def _into_doc(doc: str, name: str, table: str) -> None:
    """Replace the lines between this run's marker lines in ``doc`` with ``table``."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    with open(doc, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit(f"{doc}: needs one line {begin} and, after it, one line {end}")
    lines[starts[0] + 1 : ends[0]] = table.rstrip("\n").split("\n")
    with open(doc, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    print(f"[bench] {doc}: block {name!r} replaced", file=sys.stderr)


def _code_state() -> dict[str, Any]:
    """Which kernelext code was measured: git HEAD, uncommitted files, a hash of the sources."""
    import hashlib
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(os.path.join(root, "kernelext"))):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(handle.read())
    out: dict[str, Any] = {"kernelext_sources_sha256": digest.hexdigest()[:16]}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "kernelext"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if head.returncode == 0:
            out["git_head"] = head.stdout.strip()
            out["kernelext_uncommitted_files"] = len(dirty.stdout.splitlines())
    except OSError:
        pass
    return out


def _versions(systems: set[str]) -> dict[str, str]:
    import duckdb

    import kernelext

    out = {"kernelext": kernelext.__version__, "duckdb": duckdb.__version__}
    if "langgraph" in systems:
        from .rivals_langgraph import version

        out["langgraph"] = version()
    if "dbos" in systems:
        from .rivals_dbos import version as dbos_version

        out["dbos"] = dbos_version()
    return out


def _merge_anchors(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    merged = {}
    for name, start in first.items():
        end = last.get(name, start)
        values = [start["median"], end["median"]]
        merged[name] = summarize(values, start["samples"] + end["samples"])
        merged[name]["median"] = statistics.median(values)
    return merged


def _topic_runner(topic: str, plan: Plan, systems: set[str]) -> Callable[[], Any] | None:
    kx = "kernelext" in systems
    if topic == "steps":
        from .steps import measure_steps

        return lambda: measure_steps(plan, systems)
    if topic == "effects":
        from .effects import measure_effects

        return lambda: measure_effects(plan, systems)
    if topic == "storage":
        from .storage import measure_storage

        return lambda: measure_storage(plan, systems)
    if topic == "snapshots" and kx:
        from .snapshots import measure_snapshots

        return lambda: measure_snapshots(plan)
    if topic == "resume" and kx:
        from .resume_run import measure_resume

        return lambda: measure_resume(plan)
    if topic == "sql" and kx:
        from .ledger_sql import measure_sql

        return lambda: measure_sql(plan)
    if topic == "e2e":
        from .e2e import measure_e2e

        return lambda: measure_e2e(plan, systems)
    if topic == "features" and kx:
        from .features import measure_features

        return lambda: measure_features(plan)
    if topic == "batch":
        from .batch import measure_batch

        return lambda: measure_batch(plan, systems)
    if topic == "dask" and kx:
        from .dask_batch import measure_dask

        return lambda: measure_dask(plan)
    return None


def run(args: argparse.Namespace) -> int:
    from .anchors import measure_anchors
    from .report import evaluate, markdown

    plan = Plan.make(args.quick)
    if args.reps:
        plan.reps = args.reps
    plan.batch_scale = args.batch_scale
    plan.dask_scale = args.dask_scale
    topics, systems, notes = _selection(args.only)
    if args.out is None:
        args.out = _default_out(topics, plan.quick)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "schema": RESULTS_SCHEMA,
            "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
            "quick": plan.quick,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "topics": topics,
            "systems": sorted(systems),
            "reps": plan.reps,
            "notes": notes,
            **_versions(systems),
            "code": _code_state(),
        },
        "errors": {},
    }
    for topic in topics:
        print(f"[bench] {topic} ...", flush=True)
        t0 = time.perf_counter()
        try:
            if topic == "anchors":
                results["anchors_start"] = measure_anchors(plan)
                continue
            runner = _topic_runner(topic, plan, systems)
            if runner is not None:
                results[topic] = runner()
                if isinstance(results[topic], dict) and results[topic].get("skipped"):
                    notes.append(f"{topic} skipped: {results[topic]['skipped']}")
        except Exception as exc:
            results["errors"][topic] = "".join(traceback.format_exception(exc))[-4000:]
            print(f"[bench] {topic} FAILED: {exc}", file=sys.stderr, flush=True)
        finally:
            print(f"[bench] {topic} done in {time.perf_counter() - t0:.1f} s", flush=True)
    print("[bench] anchors again ...", flush=True)
    results["anchors_end"] = measure_anchors(plan)
    results["anchors"] = _merge_anchors(results["anchors_start"], results["anchors_end"])
    results["meta"]["duration_s"] = time.perf_counter() - started
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = evaluate(results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, sort_keys=False, default=str)
        handle.write("\n")
    table = markdown(results)
    with open(os.path.splitext(args.out)[0] + ".md", "w", encoding="utf-8") as handle:
        handle.write(table)
    print()
    print(table)
    print(f"[bench] results: {args.out}")
    return 1 if results["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "table":
        from .report import markdown

        path = _results_path(args.path)
        with open(path, encoding="utf-8") as handle:
            table = markdown(json.load(handle))
        print(table)
        if args.into:
            _into_doc(args.into, os.path.splitext(os.path.basename(path))[0], table)
        return 0
    if args.command == "profile":
        from .profiling import profile_topic

        print(profile_topic(args.topic, Plan.make(args.quick), args.limit, args.cpu))
        return 0
    if args.command == "cpu":
        from .cpu_item import cpu_lines, cpu_per_item

        figures = cpu_per_item(args.items, args.concurrency, args.reps)
        print(cpu_lines(figures))
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                json.dump({"command": "python -m benchmarks " + " ".join(sys.argv[1:]),
                           "code": _code_state(), **figures}, handle, indent=1)  # fmt: skip
        return 0
    if args.command == "diagnose":
        from .diagnose import diagnose

        print(diagnose(args.ops))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
