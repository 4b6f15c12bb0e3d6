"""A process that executes an agent run, then keeps the store file busy with a long query.

``python tests/support/sql_owner.py STORE RUN_ID QUERY_SECONDS`` starts run ``RUN_ID``
(short steps, until stopped), lets it run a few steps, prints ``querying`` and runs a
``kx.sql`` query that ends after ``QUERY_SECONDS`` (interrupted by its timeout). While it
runs, a thread prints ``suspended <unix time>`` when the run's worker ends; after it,
``query ended <unix time>``, then ``status <status> <stop source>`` once the run ended.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import kernelext as kx

LONG_QUERY = "SELECT count(*) FROM range(0, 400000000000) t(x) WHERE x % 7 = 3"


def main() -> int:
    store, run_id, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    kx.configure(store=store)

    @kx.agent(name="ticker")
    def ticker(run: kx.Run) -> None:
        for _ in run.steps(range(1_000_000), key=str):
            time.sleep(0.02)

    handle = ticker.start(run_id=run_id)
    time.sleep(1.0)
    thread = handle.thread
    assert thread is not None

    def watch() -> None:
        thread.join()
        print(f"suspended {time.time()}", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    print("querying", flush=True)
    with contextlib.suppress(kx.QueryTimeout):  # interrupted by its timeout, as meant
        kx.sql(LONG_QUERY, timeout=seconds)
    print(f"query ended {time.time()}", flush=True)
    status = handle.wait(120)
    print(f"status {status} {handle.info().get('stop_source')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
