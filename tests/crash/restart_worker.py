"""Worker process for the restart crash test (tests/lifecycle/test_restart_carry.py).

Defines the effects ``notify`` and ``deliver`` (one POST each to the test's
DeliveryServer, the ledger's key as ``Idempotency-Key``) and the agent
``restart-crash``: step ``work`` notifies, then delivers; step ``after`` notifies again.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``,
``run_id``, ``url``, ``kill_at`` and ``restart``. With ``kill_at="delivered"`` the worker
SIGKILLs itself inside ``deliver`` once the server recorded the POST (the outcome is
not recorded). With ``restart`` set it calls ``kx.restart(run_id)`` and prints
``restarted <new id> <status>``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from support.http_server import post_json

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash import drive_run, go_with_kill_point
from kernelext._store import open_store

CONFIG: dict[str, Any] = {"url": "", "kill_at": ""}


@kx.effect
def notify(what: str, *, idempotency_key: str | None = None) -> Any:
    body = {"item": what}
    return post_json(CONFIG["url"] + "/notify", body, idempotency_key=idempotency_key).body


@kx.effect
def deliver(what: str, *, idempotency_key: str | None = None) -> Any:
    body = {"item": what}
    response = post_json(CONFIG["url"] + "/deliver", body, idempotency_key=idempotency_key)
    if CONFIG["kill_at"] == "delivered":
        os.kill(os.getpid(), signal.SIGKILL)
    return response.body


@kx.agent(name="restart-crash")
def restart_crash(run: kx.Run) -> Any:
    with run.step("work"):
        run.state["n"] = notify("work")
        run.state["d"] = deliver("parcel")
    with run.step("after"):
        notify("after")
    return sorted(run.state)


def main() -> int:
    command = go_with_kill_point(CONFIG)
    if command is None:
        return 0
    store = open_store(command["store"])
    run_id = command["run_id"]
    try:
        if command.get("restart"):
            try:
                handle = kx.restart(run_id, store=store)
            except kx.RunStateError as exc:
                print("refused " + str(exc).replace("\n", " "), flush=True)
                return 0
            status = handle.wait()
            print(f"restarted {handle.run_id} {status}", flush=True)
            return 0
        return drive_run(store, run_id, lambda: restart_crash.start(run_id=run_id, store=store))
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
