"""An agent run owned by one process and stopped while another process holds the store file.

The agent ``journaled-end`` delivers one POST per step to a ``DeliveryServer`` (an effect,
so a resume never delivers an item twice); step 3, once it delivered, waits for ``GATE``,
so a stop asked meanwhile lands after it, however slow the machine. Tests import it (to
resume the run) and start :func:`main` in a process of its own with
:class:`support.store_holder.Child`::

    Child("-c", OWNER, store, url, run_id, items)

Protocol: prints ``running`` once the run executes; on a ``stop`` line it stops the run,
prints ``stopping``, opens the gate and, once ``h.wait()`` returned, ``waited <status>`` and
``journal <path of this process's journal>``; on an ``exit`` line it closes the store and
exits 0. A test may SIGKILL (or SIGSTOP) it at any point.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import kernelext as kx
from support.http_server import post_json

__all__ = ["GATE", "GATE_STEP", "OWNER", "deliver", "journaled_end", "main"]

OWNER = "import sys; from support.journaled_end import main; sys.exit(main())"
STEP_PAUSE = 0.02
GATE_STEP = 3
GATE = threading.Event()


@kx.effect
def deliver(url: str, run_id: str, item: int, *, idempotency_key: str | None = None) -> int:
    body = {"run": run_id, "item": item}
    return post_json(url + "/deliver", body, idempotency_key=idempotency_key).status


@kx.agent(name="journaled-end")
def journaled_end(run: kx.Run, url: str, items: int) -> Any:
    for i in run.steps(range(items)):
        deliver(url, run.id, i)
        run.state["done"] = run.state.get("done", 0) + 1
        if i == GATE_STEP:
            GATE.wait(60)  # bounded
        time.sleep(STEP_PAUSE)
    return run.state["done"]


def main() -> int:
    store_path, url, run_id, items = sys.argv[1:5]
    store = kx.open_store(store_path)
    handle = journaled_end.start(url, int(items), run_id=run_id, store=store)
    print("running", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stop":
            print(handle.stop(source="test"), flush=True)
            GATE.set()
            print(f"waited {handle.wait(60)}", flush=True)
            assert store.hot_path is not None
            print(f"journal {store.hot_path.path}", flush=True)
        elif command == "exit":
            break
    store.close()
    return 0
