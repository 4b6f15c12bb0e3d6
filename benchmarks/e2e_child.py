"""One process of the e2e "two processes" benchmark: ``python -m benchmarks.e2e_child STORE N``.

It opens STORE, warms up (a short run and one ``kx.sql``), prints ``ready``, waits for a
``go`` line on stdin, runs ``noop_agent`` for N steps until ``kx.sql`` shows it completed,
and prints one JSON line with its figures.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    path, n = argv[0], int(argv[1])
    from kernelext._store import open_store

    from .e2e import kx_steps_e2e

    store = open_store(path)
    try:
        kx_steps_e2e(store, 10)  # imports, first kx.sql (pandas), first run
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        result = kx_steps_e2e(store, n)
        marks = result["marks"]
        print(
            json.dumps(
                {
                    "e2e_ms": result["total_s"] / n * 1000.0,
                    "hot_path_ms": (marks[-1] - marks[0]) / (len(marks) - 1) * 1000.0,
                    "reads": result["reads"],
                    "opens": getattr(store.backend, "opens", None),
                }
            ),
            flush=True,
        )
        sys.stdin.readline()  # the parent closes stdin once it has every line
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
