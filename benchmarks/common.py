"""Shared pieces: the run plan (full or quick), timing summaries, temp folders, files."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KB",
    "MARKS",
    "MB",
    "Plan",
    "deltas_ms",
    "dir_bytes",
    "file_write_fsync_ms",
    "ratio",
    "settle",
    "summarize",
    "tempdir",
    "timed_ms",
]

KB = 1024
MB = 1024 * 1024

# Timestamps appended by agent bodies, graph nodes and workflow steps while they run.
MARKS: list[float] = []


@dataclass
class Plan:
    """How much to measure. ``quick`` is a smoke run; its figures are not comparable."""

    quick: bool = False
    reps: int = 5
    anchor_ops: int = 200
    step_count: int = 200
    effect_calls: int = 200
    effect_spacing_s: float = 0.004
    snapshot_sizes: tuple[int, ...] = (KB, MB, 10 * MB)
    storage_steps: int = 500
    resume_effects: int = 100_000
    resume_reps: int = 5
    sql_rows: int = 1_000_000
    sql_reps: int = 30
    profile: bool = True
    # e2e: what a user waits for (start -> completed and visible in SQL)
    e2e_step_counts: tuple[int, ...] = (200, 10_000)
    e2e_big_reps: int = 3  # repetitions for step counts of 5,000 and more
    e2e_effect_calls: int = 1_000
    e2e_calls_per_step: int = 20
    lag_step_rate: float = 1_000.0
    lag_step_seconds: float = 3.0
    lag_effect_rate: float = 5_000.0
    lag_effect_seconds: float = 2.0
    lag_calls_per_step: int = 100
    lag_sample_s: float = 0.01
    lag_reps: int = 3
    two_proc_steps: int = 2_000
    two_proc_reps: int = 3
    batch_scale: float = 1.0  # the batch topic's sizes times this (``--batch-scale``)
    dask_scale: float = 1.0  # the dask topic's sizes times this (``--dask-scale``)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if not quick:
            return cls()
        return cls(
            quick=True,
            reps=2,
            anchor_ops=30,
            step_count=30,
            effect_calls=30,
            snapshot_sizes=(KB, MB),
            storage_steps=60,
            resume_effects=5_000,
            resume_reps=2,
            sql_rows=50_000,
            sql_reps=5,
            profile=False,
            e2e_step_counts=(30, 300),
            e2e_big_reps=1,
            e2e_effect_calls=60,
            e2e_calls_per_step=10,
            lag_step_seconds=0.3,
            lag_effect_seconds=0.2,
            lag_calls_per_step=50,
            lag_reps=1,
            two_proc_steps=50,
            two_proc_reps=1,
        )

    def e2e_reps(self, n: int) -> int:
        """Repetitions for an end-to-end run of ``n`` steps."""
        return min(self.reps, self.e2e_big_reps) if n >= 5_000 else self.reps

    def snapshot_steps(self, size: int) -> int:
        """Steps per repetition for a payload of ``size`` bytes."""
        if self.quick:
            return 4
        if size >= 10 * MB:
            return 5
        if size >= MB:
            return 12
        return 60


def summarize(rep_values: Sequence[float], samples: int | None = None) -> dict[str, Any]:
    """Median over repetitions (each repetition already reduced to its own median)."""
    values = [float(v) for v in rep_values]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "reps": len(values),
        "samples": samples if samples is not None else len(values),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def deltas_ms(marks: Sequence[float]) -> list[float]:
    """Differences between consecutive timestamps, in milliseconds."""
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(marks)]


def timed_ms(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


@contextlib.contextmanager
def tempdir(prefix: str) -> Iterator[str]:
    """A temporary folder on the same disk as the project (not a tmpfs)."""
    base = os.environ.get("KERNELEXT_BENCH_TMP") or None
    path = tempfile.mkdtemp(prefix=f"kxbench-{prefix}-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def settle() -> None:
    """Collect garbage left by the previous measurement (the collector stays on)."""
    gc.collect()
    time.sleep(0.05)


def file_write_fsync_ms(folder: str, payload: bytes, name: str = "anchor.bin") -> float:
    """Create a file, write ``payload``, fsync, close: the floor for storing bytes durably."""
    path = os.path.join(folder, name)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = (time.perf_counter() - start) * 1000.0
    os.unlink(path)
    return elapsed


def dir_bytes(path: str) -> int:
    """Total size of the regular files under ``path`` (0 if it does not exist)."""
    total = 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total
