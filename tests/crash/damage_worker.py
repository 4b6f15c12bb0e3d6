"""Worker for the damaged-journal test (tests/crash/test_write_faults.py).

``python damage_worker.py STORE URL ITEMS``: runs agent ``damage`` over ``range(ITEMS)``
(one delivery to the server per item). After the first delivery it prints ``started``
and waits for a line on stdin (meanwhile the test lets another process take the store
file); it SIGKILLs itself right after the last delivery, so its journal is left behind
for the next process to fold.
"""

from __future__ import annotations

import os
import signal
import sys

from fault_agent import AGENT_STATE, damage

from kernelext._store import open_store


def main() -> None:
    store_path, url, items = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(store_path)
    AGENT_STATE["url"] = url
    AGENT_STATE["first"] = lambda: (print("started", flush=True), sys.stdin.readline())
    AGENT_STATE["last"] = items - 1
    AGENT_STATE["on_last"] = lambda: os.kill(os.getpid(), signal.SIGKILL)
    damage.start(list(range(items)), run_id="damaged", store=store).wait()
    print("not killed", flush=True)


if __name__ == "__main__":
    main()
