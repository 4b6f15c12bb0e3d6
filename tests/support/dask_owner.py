"""A notebook process that owns a batch on an external Dask cluster
(tests/batch/test_dask_faults.py).

Started by the test (``crash.Worker``), it imports kernelext and the items' module, prints
``loaded`` and waits for one ``go`` line (JSON) with ``store`` (a PostgreSQL URL),
``scheduler`` (the cluster's address), ``run_id``, ``mode`` (``start`` or ``resume``) and,
to start, the agent's arguments ``args``. It connects a ``distributed.Client``, starts the
run ``dask-deliveries`` (or resumes it with ``kx.resume``), prints ``ready <epoch>`` once it
owns the run (the run's ownership epoch in the store), then ``done <json>`` (status, error)
when the run ended here. The test SIGKILLs it at any moment in between.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from crash import read_go
from distributed import Client

import kernelext as kx
from support import dask_items


def main() -> int:
    print("loaded", flush=True)
    command = read_go(sys.stdin)
    if command is None:
        return 0
    store = kx.open_store(command["store"])
    client = Client(command["scheduler"], set_as_default=False, timeout=120)
    try:
        dask_items.EXECUTOR["executor"] = client
        run_id = command["run_id"]
        if command["mode"] == "start":
            handle: Any = dask_items.deliveries.start(**command["args"], run_id=run_id, store=store)
        else:
            handle = kx.resume(run_id, store=store, source="dask-owner")
        print(f"ready {store.get_run(run_id)['owner_epoch']}", flush=True)
        status = handle.wait() if handle.thread is not None else handle.status
        error = None if handle.error is None else f"{type(handle.error).__name__}: {handle.error}"
        print("done " + json.dumps({"status": status, "error": error}), flush=True)
        return 0
    finally:
        client.close()
        store.close()


if __name__ == "__main__":
    sys.exit(main())
