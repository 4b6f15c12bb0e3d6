"""kernelext and DBOS on the same PostgreSQL server, in the same run.

``python -m benchmarks.postgres_bench [--quick] [--url postgresql://...] [--json FILE]``

Without ``--url`` a throw-away server is started from Debian's package
(tests/support/postgres.py) with PostgreSQL's default durability (fsync on,
synchronous commit). Each system gets a fresh database on it.

Measured, per system:

- per-effect overhead: one run (workflow) making ``calls`` recorded calls of a
  trivial function, one after another; the wall time of each call minus the bare
  call. kernelext commits the intent before the call and queues the outcome (group
  commit); a DBOS step checkpoints its output after the call.
- effects per second with 1, 4 and 8 concurrent runs (threads of one process, as in
  one kernel; DBOS workflows started with ``DBOS.start_workflow``), each run
  making ``calls`` calls: total calls / wall time until every run finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
CONCURRENCY = (1, 4, 8)


def bare_call(i: int) -> dict[str, Any]:
    return {"ok": True, "i": i}


def summary_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered),
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "n": len(ordered),
    }


def bare_ms(calls: int) -> float:
    samples = []
    for i in range(calls):
        start = time.perf_counter()
        bare_call(i)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


# -- kernelext ---------------------------------------------------------------------------------
def kernelext_bench(url: str, calls: int, reps: int) -> dict[str, Any]:
    import kernelext as kx
    from kernelext._store import open_store

    @kx.effect
    def ping(i: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
        return bare_call(i)

    timings: list[float] = []

    @kx.agent(name="pg-bench-effects")
    def effects(run: kx.Run, n: int, record: bool) -> None:
        for _ in run.steps(range(1)):
            for i in range(n):
                start = time.perf_counter()
                ping(i)
                if record:
                    timings.append((time.perf_counter() - start) * 1000)

    store = open_store(url)
    try:
        counter = iter(range(10**9))
        for _ in range(reps):
            handle = effects.start(calls, True, run_id=f"solo-{next(counter)}", store=store)
            handle.wait()
        result: dict[str, Any] = {"per_effect": summary_ms(timings), "throughput": {}}
        for runs in CONCURRENCY:
            rates = []
            for _ in range(reps):
                start = time.perf_counter()
                handles = [
                    effects.start(calls, False, run_id=f"c{runs}-{next(counter)}", store=store)
                    for _ in range(runs)
                ]
                for handle in handles:
                    assert handle.wait() == "completed", handle.status
                rates.append(runs * calls / (time.perf_counter() - start))
            result["throughput"][str(runs)] = statistics.median(rates)
        result["commits"] = store.commits
        return result
    finally:
        store.close()


# -- DBOS ----------------------------------------------------------------------------------------
def dbos_bench(url: str, calls: int, reps: int) -> dict[str, Any]:
    from dbos import DBOS

    timings: list[float] = []

    @DBOS.step()
    def ping_step(i: int) -> dict[str, Any]:
        return bare_call(i)

    @DBOS.workflow()
    def effects_workflow(n: int, record: bool) -> int:
        for i in range(n):
            start = time.perf_counter()
            ping_step(i)
            if record:
                timings.append((time.perf_counter() - start) * 1000)
        return n

    DBOS(config={"name": "kxpgbench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        for _ in range(reps):
            effects_workflow(calls, True)
        result: dict[str, Any] = {"per_effect": summary_ms(timings), "throughput": {}}
        for runs in CONCURRENCY:
            rates = []
            for _ in range(reps):
                start = time.perf_counter()
                handles = [DBOS.start_workflow(effects_workflow, calls, False) for _ in range(runs)]
                for handle in handles:
                    handle.get_result()
                rates.append(runs * calls / (time.perf_counter() - start))
            result["throughput"][str(runs)] = statistics.median(rates)
        return result
    finally:
        DBOS.destroy()
        logging.getLogger("dbos").setLevel(logging.WARNING)


# -- driver ------------------------------------------------------------------------------------
def with_server(url: str | None, work: Callable[[Callable[[str], str]], Any]) -> Any:
    if url:
        return work(lambda name: url.rsplit("/", 1)[0] + "/" + name)
    sys.path.insert(0, TESTS_DIR)
    from support.postgres import PostgresServer

    with PostgresServer(fsync=True) as server:

        def fresh(prefix: str) -> str:
            return server.create_database(prefix)

        return work(fresh)


def commit_anchor_ms(url: str, ops: int) -> float:
    """One single-row INSERT + COMMIT on a long-lived psycopg connection."""
    import psycopg

    with psycopg.connect(url) as con:
        con.execute("CREATE TABLE anchor (i INTEGER)")
        con.commit()
        samples = []
        for i in range(ops):
            start = time.perf_counter()
            con.execute("INSERT INTO anchor VALUES (%s)", [i])
            con.commit()
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres_bench")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--url", help="an existing server (a database per system is used)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--skip-dbos", action="store_true")
    args = parser.parse_args(argv)
    calls, reps = (50, 1) if args.quick else (200, 3)

    def work(fresh: Callable[[str], str]) -> dict[str, Any]:
        results: dict[str, Any] = {"calls_per_run": calls, "reps": reps}
        results["bare_call_ms"] = bare_ms(calls)
        results["pg_commit_ms"] = commit_anchor_ms(
            fresh("kx_anchor"), 200 if not args.quick else 50
        )
        results["kernelext"] = kernelext_bench(fresh("kx_bench"), calls, reps)
        if not args.skip_dbos:
            try:
                results["dbos"] = dbos_bench(fresh("dbos_bench"), calls, reps)
            except ImportError:
                results["dbos"] = "not installed (pip install -e '.[bench]')"
        return results

    results = with_server(args.url, work)
    results["threads"] = threading.active_count()
    text = json.dumps(results, indent=2, sort_keys=True)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
