"""Child process of the resume benchmark: ``python -m benchmarks.resume_child STORE RUN [PROF]``.

Prints one JSON line of ``time.perf_counter()`` readings (CLOCK_MONOTONIC, shared
with the parent) and exits the moment the first new effect body runs. The clock
starts right before ``kx.resume``; the store (configured, not yet open) is opened
inside that call, as it is in a fresh kernel.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import cProfile  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


def main() -> None:
    path, run_id = sys.argv[1], sys.argv[2]
    profile_out = sys.argv[3] if len(sys.argv) > 3 else None
    import duckdb  # noqa: F401 - kernelext imports it lazily; count it as import time

    import kernelext as kx
    from benchmarks import kx_agents

    marks: dict[str, Any] = {"start": T_START, "imported": time.perf_counter()}
    profiler = cProfile.Profile() if profile_out else None

    def on_action(step: int, call: int) -> None:
        marks["action"] = time.perf_counter()
        marks["action_at"] = [step, call]
        if profiler is not None and profile_out:
            profiler.dump_stats(profile_out)
        sys.stdout.write(json.dumps(marks) + "\n")
        sys.stdout.flush()
        os._exit(0)  # the store copy is thrown away; the intent row stays pending

    kx_agents.ON_ACTION.append(on_action)
    if profiler is not None:
        profiler.enable()
    kx.configure(store=path)  # what KERNELEXT_STORE does; the store opens inside kx.resume
    marks["t0"] = time.perf_counter()
    handle = kx.resume(run_id)
    marks["returned"] = time.perf_counter()
    status = handle.wait(120)
    sys.stdout.write(json.dumps({"error": f"no new action ran; run is {status}"}) + "\n")
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    main()
