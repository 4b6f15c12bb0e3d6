"""Where the CPU of a workload goes, per thread, with nothing profiled (Linux).

A sampler thread reads every thread's CPU time (user + system, ``/proc/self/task/*/stat``)
every 20 ms and keeps the last reading of each; threads are grouped by name (a pool's
``name_0``, ``name_1`` … together, the run id left out). What a thread spent in its last
20 ms before it ended is missed. ``python -m benchmarks profile batch`` prints it before
its profiled run, whose figures cProfile inflates.

The sampler costs CPU itself (tens of ms a second with some 40 threads to read), which
``time.process_time`` counts: its own CPU is kept under ``SAMPLER``, for the caller to take
off the process's figure.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator

__all__ = ["SAMPLER", "thread_cpu"]

TICK_S = 0.02
SAMPLER = "bench-cpu-sampler"


def _read(ticks: int, names: dict[int, str], seen: dict[int, tuple[str, float]]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        native = int(tid)
        name = names.get(native) or seen.get(native, ("(not Python)", 0.0))[0]
        seen[native] = (name, (int(fields[11]) + int(fields[12])) / ticks)


def _group(name: str) -> str:
    return re.sub(r"_\d+$", "_*", re.sub(r"\[.*?\]", "", name))


@contextlib.contextmanager
def thread_cpu() -> Iterator[Counter[str]]:
    """``with thread_cpu() as cpu: ...``: afterwards ``cpu`` holds CPU seconds per thread
    group spent inside the block (empty where ``/proc`` is not there)."""
    out: Counter[str] = Counter()
    if not os.path.isdir("/proc/self/task"):
        yield out
        return
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def snapshot() -> None:
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
        _read(ticks, names, seen)

    snapshot()
    base = {tid: cpu for tid, (_, cpu) in seen.items()}

    own = [0.0]

    def sample() -> None:
        while not done.wait(TICK_S):
            snapshot()
        own[0] = time.thread_time()

    sampler = threading.Thread(target=sample, name=SAMPLER, daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        done.set()
        sampler.join()
        snapshot()
        for tid, (name, cpu) in seen.items():
            if name != SAMPLER:
                out[_group(name)] += cpu - base.get(tid, 0.0)
        out[SAMPLER] = own[0]  # its own CPU, all of it inside the block
