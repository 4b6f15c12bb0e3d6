"""Worker process for the expiry delivery test (tests/lifecycle/test_expiry_delivery.py).

Registers a ``kx.on_expire`` callback that appends the run id to ``side_log`` (fsync'ed)
and then SIGKILLs its own process: the sweep dies right after the expiry committed and
the callbacks ran, before the delivery is recorded (``runs.expiry_notified_at``).

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``,
``side_log`` and ``now`` (ISO, UTC: the sweep's time).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash import append_line, read_go
from kernelext._core.lifecycle.expiry import ExpiredRun
from kernelext._store import open_store


def main() -> int:
    print("loaded", flush=True)
    command = read_go(sys.stdin)
    if command is None:
        return 0
    store = open_store(command["store"])

    @kx.on_expire
    def page_then_die(info: ExpiredRun) -> None:
        append_line(command["side_log"], info.run_id)
        os.kill(os.getpid(), signal.SIGKILL)

    result = kx.sweep(dt.datetime.fromisoformat(command["now"]), store=store)
    print(f"swept {result.expired_ids}", flush=True)  # never printed when a run expired
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
