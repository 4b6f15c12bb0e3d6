"""The benchmark suite runs end to end (kernelext parts only) and writes valid JSON.

No timing is asserted here: figures belong in BENCHMARKS.md, not in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPICS = ("anchors", "steps", "effects", "snapshots", "storage", "resume", "sql")


@pytest.mark.slow
def test_quick_kernelext_benchmarks_write_valid_results(tmp_path: Path) -> None:
    out = tmp_path / "results" / "bench.json"
    env = {**os.environ, "KERNELEXT_BENCH_TMP": str(tmp_path)}
    env.pop("KERNELEXT_STORE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "kernelext",
            "--reps",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["errors"] == {}
    assert results["meta"]["quick"] is True
    assert results["meta"]["systems"] == ["kernelext"]
    for topic in TOPICS[1:]:
        assert topic in results, f"topic {topic} missing from the results"
    assert set(results["anchors"]) == {"duckdb_commit_ms", "sqlite_wal_full_commit_ms", "fsync_ms"}
    # Only kernelext was asked for: no rival figures, and every kernelext figure is a number.
    assert set(results["steps"]["systems"]) == {"kernelext"}
    assert set(results["effects"]["modes"]["back_to_back"]) == {"kernelext"}
    assert "langgraph" not in results["storage"]
    assert results["resume"]["effects"] >= 1000
    assert results["sql"]["rows"] > 0
    assert results["storage"]["kernelext"]["blob_rows"] > 0
    assert results["targets"], "no target was evaluated"
    for target in results["targets"]:
        assert isinstance(target["value"], (int, float)), target
        assert target["met"] in (True, False), target
    # The table next to the JSON, and `table` re-renders it.
    assert (out.parent / "bench.md").read_text(encoding="utf-8").startswith("Command:")
    table = subprocess.run(
        [sys.executable, "-m", "benchmarks", "table", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    assert "| metric | kernelext |" in table.stdout
