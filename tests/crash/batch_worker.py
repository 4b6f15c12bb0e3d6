"""Worker process for the batch crash test (tests/crash/test_crash_batch.py).

Defines the effect ``deliver_item`` (one POST to the test's DeliveryServer, with the
ledger's key as ``Idempotency-Key``) and the agent ``crash-batch``: one ``run.map`` over
``items`` items (``concurrency`` at once), each item one delivery; the list it returns
is then stored in ``run.state["results"]`` by a step of its own.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``, ``run_id``,
``attempt``, ``items``, ``concurrency``, ``url``, ``markers`` and ``pause_ms``. Each item
appends ``attempt begin item`` to the ``markers`` file when its body starts (so the test
can tell that no item completed before this attempt ran again), then dawdles a random
0..pause_ms milliseconds before and after its delivery, so that a kill finds items at
every point of their call.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash import append_line, delivered, serve_one_run, take_go_fields

CONFIG: dict[str, Any] = {"markers": "", "attempt": 0, "pause_ms": 0.0, "url": ""}


def dawdle() -> None:
    if CONFIG["pause_ms"]:
        time.sleep(random.uniform(0, CONFIG["pause_ms"]) / 1000)


@kx.effect
def deliver_item(run_id: str, item: int, *, idempotency_key: str | None = None) -> Any:
    assert idempotency_key is not None, "the ledger hands its key to tools that take one"
    return delivered(CONFIG["url"] + "/items", {"run": run_id, "item": item}, idempotency_key)


@kx.agent(name="crash-batch")
def crash_batch(run: kx.Run, items: int, concurrency: int) -> int:
    def one(item: int) -> dict[str, Any]:
        append_line(CONFIG["markers"], f"{CONFIG['attempt']} begin {item}", sync=False)
        dawdle()
        body = deliver_item(run.id, item)
        dawdle()
        return {"item": item, "delivery": body["delivery"], "key": body["idempotency_key"]}

    results = run.map(one, range(items), key=lambda i: f"item-{i}", concurrency=concurrency)
    with run.step("results"):
        run.state["results"] = results
    return len(results)


def main() -> int:
    return serve_one_run(
        lambda command, store: crash_batch.start(
            int(command["items"]),
            int(command["concurrency"]),
            run_id=command["run_id"],
            store=store,
        ),
        take_go_fields(CONFIG),
    )


if __name__ == "__main__":
    sys.exit(main())
