"""Worker process for the ledger crash test (tests/crash/test_crash_ledger.py).

Defines the effect ``deliver`` (one POST to the test's DeliveryServer, with the
ledger's key as ``Idempotency-Key``) and the agent ``crash-ledger``: ``steps`` steps
of ``per_step`` deliveries each.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``,
``run_id``, ``attempt``, ``steps``, ``per_step``, ``url``, ``markers`` and
``pause_ms``. The crash hook: with ``markers`` set, the worker appends
``attempt kind key`` lines to that file at three points, each followed by a random
0..pause_ms millisecond pause, so that kills land in every window of a call:

* ``intent``: inside the tool, the intent is committed and the POST not yet sent;
* ``delivered``: the server answered, the outcome is not recorded yet;
* ``returned``: the effect returned to the agent (outcome queued for commit),
  before the next effect.
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
RNG = random.Random(0)


def mark(kind: str, key: str) -> None:
    """The crash hook: note where we are, then dawdle so a kill may land here."""
    if CONFIG["markers"]:
        append_line(CONFIG["markers"], f"{CONFIG['attempt']} {kind} {key}", sync=False)
    if CONFIG["pause_ms"]:
        time.sleep(RNG.uniform(0, CONFIG["pause_ms"]) / 1000)


@kx.effect
def deliver(run_id: str, step: int, index: int, *, idempotency_key: str | None = None) -> Any:
    assert idempotency_key is not None, "the ledger hands its key to tools that take one"
    mark("intent", idempotency_key)
    body = {"run": run_id, "step": step, "index": index}
    answer = delivered(CONFIG["url"] + "/deliver", body, idempotency_key)
    mark("delivered", idempotency_key)
    return answer


@kx.agent(name="crash-ledger")
def crash_ledger(run: kx.Run, steps: int, per_step: int) -> None:
    for step in run.steps(range(steps), key=lambda s: f"step-{s}"):
        for index in range(per_step):
            body = deliver(run.id, step, index)
            mark("returned", body["idempotency_key"])
            run.state.setdefault("deliveries", {})[f"{step}.{index}"] = body["delivery"]
            run.state["sent"] = run.state.get("sent", 0) + 1


def main() -> int:
    return serve_one_run(
        lambda command, store: crash_ledger.start(
            int(command["steps"]), int(command["per_step"]), run_id=command["run_id"], store=store
        ),
        take_go_fields(CONFIG),
        RNG,
    )


if __name__ == "__main__":
    sys.exit(main())
