"""How long ``%load_ext kernelext`` takes in a fresh kernel (target: <= 300 ms).

Standalone: ``python benchmarks/load_time.py [--kernels N] [--json]``. Each sample is
a new ipykernel process (so nothing of kernelext is imported yet); the time is taken
inside the kernel around ``run_line_magic("load_ext", "kernelext")``, so the message
round trip is not counted. Also reported, for information: the first display of a run
handle (which imports ipywidgets and builds the panel) in the same kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from jupyter_client.manager import KernelManager

TARGET_MS = 300.0

MEASURE_LOAD = """
import sys, time
assert "kernelext" not in sys.modules
_t0 = time.perf_counter()
get_ipython().run_line_magic("load_ext", "kernelext")
print(round((time.perf_counter() - _t0) * 1000, 2))
"""

MEASURE_FIRST_PANEL = """
import time
import kernelext as kx
@kx.agent(name="bench")
def bench(run):
    with run.step("one"):
        pass
_h = bench.run(run_id="bench-%d" % time.time_ns())
_t0 = time.perf_counter()
get_ipython().display_formatter.format(_h)
print(round((time.perf_counter() - _t0) * 1000, 2))
"""


def _run(kc: Any, code: str) -> str:
    chunks: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            chunks.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"benchmark cell failed: {reply['content']}")
    return "".join(chunks).strip()


def sample(store: str) -> tuple[float, float]:
    """(load ms, first panel ms) in one fresh kernel."""
    env = {**os.environ, "KERNELEXT_STORE": store}
    with tempfile.TemporaryDirectory(prefix="kx-kernel-") as sockets:
        return _measure_in(
            KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "k")),
            env,
        )


def _measure_in(km: KernelManager, env: dict[str, str]) -> tuple[float, float]:
    """Start the kernel on Unix sockets of its own (a TCP port chosen free can be taken
    by another process before the kernel binds it), then time the two loads."""
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        load_ms = float(_run(kc, MEASURE_LOAD))
        panel_ms = float(_run(kc, MEASURE_FIRST_PANEL))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return load_ms, panel_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=5, help="fresh kernels to sample")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    loads: list[float] = []
    panels: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kernelext-load-") as folder:
        for i in range(args.kernels):
            load_ms, panel_ms = sample(os.path.join(folder, f"store-{i}.duckdb"))
            loads.append(load_ms)
            panels.append(panel_ms)
    result = {
        "benchmark": "load_ext",
        "kernels": args.kernels,
        "load_ext_ms": {
            "median": statistics.median(loads),
            "min": min(loads),
            "max": max(loads),
            "samples": loads,
        },
        "first_panel_ms": {
            "median": statistics.median(panels),
            "min": min(panels),
            "max": max(panels),
        },
        "target_ms": TARGET_MS,
        "meets_target": statistics.median(loads) <= TARGET_MS,
        "python": sys.version.split()[0],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lo = result["load_ext_ms"]
        fp = result["first_panel_ms"]
        print(
            f"%load_ext kernelext in a fresh kernel ({args.kernels} kernels): "
            f"median {lo['median']:.1f} ms (min {lo['min']:.1f}, max {lo['max']:.1f}); "
            f"target <= {TARGET_MS:.0f} ms: {'met' if result['meets_target'] else 'MISSED'}"
        )
        print(
            f"first display of a handle (ipywidgets import + panel): median "
            f"{fp['median']:.1f} ms (min {fp['min']:.1f}, max {fp['max']:.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
