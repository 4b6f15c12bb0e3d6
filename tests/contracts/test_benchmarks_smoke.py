"""The benchmark suite runs end to end (kernelext parts only) and writes valid JSON.

No timing is asserted here: figures belong in BENCHMARKS.md, not in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
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
# The dask topic starts a LocalCluster of its own and has its own smoke test below, which
# checks every part of it; this one runs every other topic once.
KERNELEXT_TOPICS = tuple(topic for topic in TOPICS if topic != "dask")


def _benchmarks(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` from the repository root, as a user runs it: its
    scratch files under ``tmp_path`` and no ``KERNELEXT_STORE`` of the caller's."""
    env = {**os.environ, "KERNELEXT_BENCH_TMP": str(tmp_path)}
    env.pop("KERNELEXT_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_batch(batch: dict[str, Any]) -> None:
    """The batch topic (issue 21) measured every part, each item delivered once."""
    posts = batch["posts"]
    assert posts["items"] == batch["sizes"]["post_items"]
    assert set(posts["systems"]) == {"threads", "kernelext"}  # rivals not asked for
    for node in posts["systems"].values():
        assert isinstance(node["wall_s"]["median"], float)
    zero = batch["zero_latency"]
    for mode in ("c32", "c1"):
        assert zero[mode]["records_per_sync"]["median"] >= 1.0
        assert zero[mode]["items_per_s"]["median"] > 0
    stop = batch["stop"]
    assert stop["started_after_stop"]["median"] == 0  # a stop starts no new item
    assert stop["in_flight"]["median"] >= 1
    big = batch["big"]
    assert big["full"]["peak_rss_mb"] > 0
    assert 0 < big["resume"]["done_before"] < big["items"]
    assert isinstance(big["resume"]["resume_to_first_item_ms"]["median"], float)


@pytest.mark.slow
@pytest.mark.postgres
def test_quick_dask_benchmark_measures_each_part(tmp_path: Path) -> None:
    """``--quick --only dask,kernelext``: a LocalCluster of 2 worker processes and a real
    PostgreSQL server; every part measured (CPU items, POSTs 64 at a time, the per-item
    cost), each POST delivered once, and the target of issue 23 evaluated."""
    pytest.importorskip("distributed", reason="needs Dask: pip install -e '.[dask]'")
    from support.postgres import find_postgres_bin

    if find_postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (no initdb): apt-get install postgresql")
    out = tmp_path / "dask.json"
    args = ("--quick", "--only", "dask,kernelext", "--reps", "1", "--out", str(out))
    proc = _benchmarks(tmp_path, *args, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["errors"] == {} and results["meta"]["topics"] == ["anchors", "dask"]
    dask = results["dask"]
    assert "skipped" not in dask, dask
    cpu = dask["cpu"]
    assert cpu["items"] == dask["sizes"]["cpu_items"] and cpu["workers"] == 2
    assert set(cpu["systems"]) == {"cluster", "threads", "dask_bare"}
    assert all(isinstance(n["wall_s"]["median"], float) for n in cpu["systems"].values())
    io = dask["io"]
    assert io["concurrency"] == 64  # the POSTs were each checked delivered once
    assert set(io["systems"]) == {"cluster", "in_process", "plain_threads"}
    per_item = dask["overhead"]["ms_per_item"]
    assert set(per_item) == {
        "cluster_c1", "in_process_c1", "cluster_c8", "in_process_c8",
        "dask_task_c1", "dask_task_map",
    }  # fmt: skip
    assert all(node["median"] > 0 for node in per_item.values())
    targets = [t for t in results["targets"] if t["issue"] == 23]
    assert len(targets) == 1 and targets[0]["met"] in (True, False), targets
    assert "Issue 23: items on a Dask cluster" in (tmp_path / "dask.md").read_text("utf-8")


@pytest.mark.slow
def test_quick_kernelext_benchmarks_write_valid_results(tmp_path: Path) -> None:
    out = tmp_path / "results" / "bench.json"
    topics = ",".join([*KERNELEXT_TOPICS, "kernelext"])
    proc = _benchmarks(
        tmp_path, "--quick", "--only", topics, "--reps", "1", "--out", str(out), timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["errors"] == {}
    assert results["meta"]["quick"] is True
    assert results["meta"]["systems"] == ["kernelext"]
    assert results["meta"]["topics"] == list(KERNELEXT_TOPICS)
    for topic in KERNELEXT_TOPICS[1:]:
        assert topic in results, f"topic {topic} missing from the results"
    assert set(results["anchors"]) == {"duckdb_commit_ms", "sqlite_wal_full_commit_ms", "fsync_ms"}
    # Only kernelext was asked for: no rival figures, and every kernelext figure is a number.
    assert set(results["steps"]["systems"]) == {"kernelext"}
    assert set(results["effects"]["modes"]["back_to_back"]) == {"kernelext"}
    assert "langgraph" not in results["storage"]
    assert results["resume"]["effects"] >= 1000
    assert results["sql"]["rows"] > 0
    assert results["storage"]["kernelext"]["blob_rows"] > 0
    _check_batch(results["batch"])  # the batch topic (issue 21): its figures and targets
    batch_targets = [t for t in results["targets"] if t["issue"] == 21]
    assert len(batch_targets) == 4, batch_targets  # threads, 32 vs 1, the stop, the resume
    # End to end (issue 10): every part ran, for kernelext only, with numbers (not times
    # checked against anything).
    e2e = results["e2e"]
    for block in e2e["steps"].values():
        assert set(block["systems"]) == {"kernelext"}
        assert isinstance(block["systems"]["kernelext"]["e2e_ms"]["median"], float)
    assert set(e2e["effects"]["systems"]) == {"kernelext"}
    for kind in ("steps", "effects"):
        lag = e2e["fold_lag"][kind]
        assert lag["records"] > 0
        assert all(run["unseen"] == 0 for run in lag["runs"]), lag["runs"]
    two = e2e["two_processes"]
    assert isinstance(two["ratio_shared_to_own"], float)
    metrics = {t["metric"] for t in results["targets"] if t["issue"] == 10}
    assert any(m.startswith("per effect end to end") for m in metrics), metrics
    assert any(m.startswith("fold lag p99") for m in metrics), metrics
    assert results["targets"], "no target was evaluated"
    for target in results["targets"]:
        assert isinstance(target["value"], (int, float)), target
        assert target["met"] in (True, False), target
    # The table next to the JSON, and `table` re-renders it.
    assert (out.parent / "bench.md").read_text(encoding="utf-8").startswith("Command:")
    table = _benchmarks(tmp_path, "table", str(out), timeout=60)
    assert table.returncode == 0, table.stderr
    assert "| metric | kernelext |" in table.stdout
    assert "Issue 10: end to end" in table.stdout
    assert "Issue 21: batches" in table.stdout
    # `table --into DOC` replaces only the block between the run's markers.
    doc = tmp_path / "doc.md"
    doc.write_text(
        "before\n<!-- bench:bench:begin -->\nSTALE TABLE\n<!-- bench:bench:end -->\nafter\n",
        encoding="utf-8",
    )
    into = _benchmarks(tmp_path, "table", str(out), "--into", str(doc), timeout=60)
    assert into.returncode == 0, into.stderr
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("before\n<!-- bench:bench:begin -->\nCommand:")
    assert text.endswith("<!-- bench:bench:end -->\nafter\n")
    assert "STALE TABLE" not in text
