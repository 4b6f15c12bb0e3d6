"""A process that executes an agent run, then keeps the store file busy with a long query.

``python tests/support/sql_owner.py STORE RUN_ID QUERY_SECONDS [STEP_SECONDS]`` starts run
``RUN_ID`` (steps of ``STEP_SECONDS``, default 0.02, until stopped), lets it run a few
steps and runs a ``kx.sql`` query that ends after ``QUERY_SECONDS`` (interrupted by its
timeout); ``querying`` is printed once the query has held the store's connection for half
a second. While it runs, a thread prints ``suspended <unix time>`` when the run's worker
ends; after it, ``query ended <unix time>``, then ``status <status> <stop source>``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import kernelext as kx

LONG_QUERY = "SELECT count(*) FROM range(0, 400000000000) t(x) WHERE x % 7 = 3"


def announce() -> None:
    """Print ``querying`` once the main thread has been inside the query for half a second
    (it holds the store's connection there; before, a fold may still hand the file over)."""
    main = threading.main_thread().ident
    inside = 0
    while inside < 10:
        time.sleep(0.05)
        frame = sys._current_frames().get(main or 0)
        while frame is not None and frame.f_code.co_name != "_query_rolled_back":
            frame = frame.f_back
        inside = inside + 1 if frame is not None else 0
    print("querying", flush=True)


def main() -> int:
    store, run_id, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    step = float(sys.argv[4]) if len(sys.argv) > 4 else 0.02
    kx.configure(store=store)

    @kx.agent(name="ticker")
    def ticker(run: kx.Run) -> None:
        for _ in run.steps(range(1_000_000), key=str):
            for _ in range(max(1, round(step / 0.02))):  # Python code a force can cut
                time.sleep(0.02)

    handle = ticker.start(run_id=run_id)
    time.sleep(1.0)
    thread = handle.thread
    assert thread is not None

    def watch() -> None:
        thread.join()
        print(f"suspended {time.time()}", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    threading.Thread(target=announce, daemon=True).start()
    with contextlib.suppress(kx.QueryTimeout):  # interrupted by its timeout, as meant
        kx.sql(LONG_QUERY, timeout=seconds)
    print(f"query ended {time.time()}", flush=True)
    status = handle.wait(120)
    print(f"status {status} {handle.info().get('stop_source')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
