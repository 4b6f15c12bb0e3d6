"""Worker process for the async batch crash test (tests/crash/test_crash_batch_async.py).

Defines the async effect ``adeliver`` (one POST to the test's DeliveryServer through an
asyncio client, with the ledger's key as ``Idempotency-Key``) and the async agent
``crash-amap``: ``await run.amap(...)`` over ``items`` items, ``concurrency`` at once,
each item one delivery; the agent keeps the list of delivery numbers in its state.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``, ``run_id``,
``attempt``, ``items``, ``concurrency``, ``url``, ``markers`` and ``pause_ms``. With
``markers`` set, the worker appends ``attempt kind key`` lines at two points of a call,
each followed by a random 0..pause_ms millisecond pause (an ``await``, so the other
items go on), so that kills land between intent and POST and between POST and outcome:

* ``intent``: inside the tool, the intent is durable and the POST not yet sent;
* ``delivered``: the server answered, the outcome is not recorded yet.
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from support.async_http import apost_json

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash import append_line, serve_one_run, take_go_fields

CONFIG: dict[str, Any] = {"markers": "", "attempt": 0, "pause_ms": 0.0, "url": ""}
RNG = random.Random(0)


async def mark(kind: str, key: str) -> None:
    """The crash hook: note where we are, then dawdle so a kill may land here."""
    if CONFIG["markers"]:
        append_line(CONFIG["markers"], f"{CONFIG['attempt']} {kind} {key}", sync=False)
    if CONFIG["pause_ms"]:
        await asyncio.sleep(RNG.uniform(0, CONFIG["pause_ms"]) / 1000)


@kx.effect
async def adeliver(run_id: str, item: int, *, idempotency_key: str | None = None) -> Any:
    assert idempotency_key is not None, "the ledger hands its key to tools that take one"
    await mark("intent", idempotency_key)
    response = await apost_json(
        CONFIG["url"] + "/deliver", {"run": run_id, "item": item}, idempotency_key, timeout=60
    )
    if response.status != 200:
        raise RuntimeError(f"delivery refused: HTTP {response.status}")
    await mark("delivered", idempotency_key)
    return response.body


@kx.agent(name="crash-amap")
async def crash_amap(run: kx.Run, items: int, concurrency: int) -> None:
    async def one(item: int) -> int:
        body = await adeliver(run.id, item)
        return int(body["delivery"])

    run.state["deliveries"] = await run.amap(
        one, range(items), key=lambda i: f"item-{i:03d}", concurrency=concurrency
    )


def main() -> int:
    return serve_one_run(
        lambda command, store: crash_amap.start(
            int(command["items"]),
            int(command["concurrency"]),
            run_id=command["run_id"],
            store=store,
        ),
        take_go_fields(CONFIG),
        RNG,
    )


if __name__ == "__main__":
    sys.exit(main())
