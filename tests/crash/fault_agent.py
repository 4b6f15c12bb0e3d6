"""An agent shared by a worker process and the test that resumes its run (same code,
so the same fingerprint): one delivery to a DeliveryServer per item."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.http_server import post_json

import kernelext as kx

AGENT_STATE: dict[str, Any] = {"url": "", "last": -1, "on_last": None, "first": None}


@kx.effect
def deliver_item(item: int, *, idempotency_key: str | None = None) -> int:
    response = post_json(AGENT_STATE["url"] + "/items", {"item": item}, idempotency_key)
    if item == 0 and AGENT_STATE["first"] is not None:
        AGENT_STATE["first"]()
    if item == AGENT_STATE["last"]:
        hook: Callable[[], None] | None = AGENT_STATE["on_last"]
        if hook is not None:
            hook()
    return response.status


@kx.agent(name="damage")
def damage(run: kx.Run, items: list[int]) -> None:
    for item in run.steps(items, key=str):
        deliver_item(item)
        run.state["done"] = run.state.get("done", 0) + 1
