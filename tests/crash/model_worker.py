"""Worker process for the write-path model test (tests/store/test_write_path_model.py).

Defines the effect ``deliver_item`` (one POST to the test's DeliveryServer, with the
ledger's key as ``Idempotency-Key``) and two agents: ``write-path-model``, one step per
item, one delivery per step; and ``write-path-batch``, one ``run.map`` over the items,
``concurrency`` at once (threads), each item one step with one delivery, its value the
server's delivery number. Every attempt (start or resume) is one such process.

Protocol: ``loaded`` / ``go`` as in ``tests/crash/__init__.py``. The ``go`` line carries
``store``, ``run_id``, ``items``, ``concurrency`` (0: the step-per-item agent), ``url``,
``store_wait`` (``KERNELEXT_STORE_WAIT``) and ``pauses``, a list of ``[item, point]``.
Every line goes to stdout in one ``write`` (item threads never interleave within one):

* ``ready`` (the run executes), ``needs_decision <status>`` (a resume found unknown
  effects: nothing executes) or ``completed`` (nothing left to do);
* ``step <i>``: the body of step ``i`` begins, so every step before it is stored as
  completed (``begin_step`` completes the previous step durably first); in a batch, only
  that item ``i`` began (its step is journaled);
* ``item_done <i>``: batch item ``i`` completed: its step and value are on disk;
* ``intent <i> <key>``: inside the tool, the intent is stored, the POST not yet sent;
* ``delivered <i> <key>``: the server answered, the outcome is not recorded yet;
* ``returned <i> <key>``: the effect returned to the agent (outcome queued, not synced);
* ``paused <i> <point>``: the worker waits at that point until the test sends
  ``release`` (or kills it, or forces a stop that lands in the wait);
* ``fold_failed``: the store logged that a fold of this process's journal failed;
* ``done <status> <error type or -> <result as compact JSON>`` once ``wait()`` returned.

Commands on stdin after ``go``, one a line: ``release``, ``stop`` (``handle.stop()``)
and ``force`` (``handle.force_stop(cut_calls=True)``: an open call is cut), issued from a
thread other than the run's, as the Stop button is.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import traceback
from typing import Any

import duckdb  # noqa: F401  (imported while the warm worker waits for `go`)

import kernelext as kx
from crash import delivered, read_go
from kernelext._core.lifecycle.run import engine_of
from kernelext._store import open_store

CONFIG: dict[str, Any] = {"url": "", "pauses": set()}
RELEASE = threading.Semaphore(0)


def say(line: str) -> None:
    """One line on stdout in a single write: threads never interleave within a line."""
    os.write(1, (line + "\n").encode())


def mark(point: str, item: int, key: str = "") -> None:
    """Tell the test where the run is; pause here if asked to."""
    say(f"{point} {item} {key}".rstrip())
    if (item, point) in CONFIG["pauses"]:
        CONFIG["pauses"].discard((item, point))
        say(f"paused {item} {point}")
        # Short waits in a Python loop: a forced stop (an exception raised into this
        # thread) lands between two of them.
        while not RELEASE.acquire(timeout=0.005):
            pass


@kx.effect
def deliver_item(run_id: str, item: int, *, idempotency_key: str | None = None) -> Any:
    assert idempotency_key is not None, "the ledger hands its key to tools that take one"
    mark("intent", item, idempotency_key)
    answer = delivered(CONFIG["url"] + "/items", {"run": run_id, "item": item}, idempotency_key)
    mark("delivered", item, idempotency_key)
    return answer


@kx.agent(name="write-path-model")
def write_path_model(run: kx.Run, items: int) -> int:
    for item in run.steps(range(items), key=str):
        mark("step", item)
        body = deliver_item(run.id, item)
        mark("returned", item, body["idempotency_key"])
        run.state.setdefault("deliveries", {})[str(item)] = body["delivery"]
    return len(run.state.get("deliveries", {}))


def _item_done(what: str, info: Any) -> None:
    """The engine's listener: a batch item's completion was just made durable."""
    if what == "completed" and getattr(info, "batch", None) is not None:
        say(f"item_done {info.key}")


@kx.agent(name="write-path-batch")
def write_path_batch(run: kx.Run, items: int, concurrency: int) -> list[int]:
    engine_of(run).listeners.append(_item_done)

    def one(item: int) -> int:
        mark("step", item)
        body = deliver_item(run.id, item)
        mark("returned", item, body["idempotency_key"])
        return int(body["delivery"])

    return run.map(one, range(items), key=str, concurrency=concurrency)


class _FoldFailures(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "folding the journal into the store failed" in record.getMessage():
            say("fold_failed")


def _commands(handle: kx.Handle) -> None:
    for line in sys.stdin:
        command = line.strip()
        if command == "release":
            RELEASE.release()
        elif command == "stop":
            handle.stop(source="model-test")
        elif command == "force":
            handle.force_stop(source="model-test", cut_calls=True)


def main() -> int:
    say("loaded")
    command = read_go(sys.stdin)
    if command is None:
        return 0
    os.environ["KERNELEXT_STORE_WAIT"] = str(command["store_wait"])
    CONFIG["url"] = command["url"]
    CONFIG["pauses"] = {(int(i), str(p)) for i, p in command["pauses"]}
    logging.getLogger("kernelext").addHandler(_FoldFailures())
    run_id = command["run_id"]
    store = open_store(command["store"])
    try:
        row = store.find_run(run_id)
        if row is not None and row["status"] == "completed":
            say("completed")
            return 0
        concurrency = int(command.get("concurrency") or 0)
        if row is None and concurrency:
            handle = write_path_batch.start(
                int(command["items"]), concurrency, run_id=run_id, store=store
            )
        elif row is None:
            handle = write_path_model.start(int(command["items"]), run_id=run_id, store=store)
        else:
            handle = kx.resume(run_id, store=store)
            if handle.thread is None:  # nothing launched: unknown effects wait for a decision
                say(f"needs_decision {handle.status}")
                return 0
        say("ready")
        threading.Thread(target=_commands, args=(handle,), daemon=True).start()
        status = handle.wait()
        error = "-"
        if handle.error is not None:  # the test shows the stderr file when it fails
            error = type(handle.error).__name__
            traceback.print_exception(type(handle.error), handle.error, handle.error.__traceback__)
        say(f"done {status} {error} {json.dumps(handle.result, separators=(',', ':'))}")
        return 0
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
