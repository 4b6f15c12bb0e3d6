"""Worker process for the approval crash tests (tests/people/test_approvals.py).

Defines the effect ``pay`` (``needs_approval=True``; one POST to the test's
DeliveryServer with the ledger's key as ``Idempotency-Key``) and the agent
``approval-crash``: one step that pays ``amount`` to ``to``.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``,
``run_id``, ``url``, ``amount`` and ``kill_at``. The worker kills itself with SIGKILL at
that point of the call, so the kill lands exactly in one window:

* ``consumed``: the approval was consumed (committed), the intent not yet recorded;
* ``intent``: inside the tool, the intent is durable and the POST not yet sent;
* ``delivered``: the server recorded the payment, the outcome is not recorded yet.
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


def die_at(point: str) -> None:
    if CONFIG["kill_at"] == point:
        os.kill(os.getpid(), signal.SIGKILL)


@kx.effect(needs_approval=True)
def pay(to: str, amount: int, *, idempotency_key: str | None = None) -> Any:
    die_at("intent")
    response = post_json(
        CONFIG["url"] + "/pay", {"to": to, "amount": amount}, idempotency_key=idempotency_key
    )
    die_at("delivered")
    return response.body


@kx.agent(name="approval-crash")
def approval_crash(run: kx.Run, to: str, amount: int) -> Any:
    with run.step("pay"):
        run.state["receipt"] = pay(to, amount)
    return run.state["receipt"]


def main() -> int:
    command = go_with_kill_point(CONFIG)
    if command is None:
        return 0
    store = open_store(command["store"])
    if CONFIG["kill_at"] == "consumed":  # the intent follows the committed consumption
        write_intent = store.write_intent

        def killed_before_intent(row: dict[str, Any]) -> Any:
            die_at("consumed")
            return write_intent(row)

        store.write_intent = killed_before_intent  # type: ignore[method-assign]
    run_id = command["run_id"]
    try:
        return drive_run(
            store,
            run_id,
            lambda: approval_crash.start(
                command.get("to", "bob"), int(command["amount"]), run_id=run_id, store=store
            ),
        )
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
