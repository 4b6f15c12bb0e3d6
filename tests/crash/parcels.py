"""What the parcel-delivering agent workers share (``llm_agent_worker.py`` with the OpenAI
client, ``anthropic_agent_worker.py`` with the Anthropic one).

``FIRST_PARCELS``: the model's first two turns, parcel 1 then parcels 2 and 3 at once.
``post_parcel``: the ``deliver`` tool's POST to the test's DeliveryServer, under the ledger's
key. ``parcels_agent``: the worker's agent, its tool loop's answer kept in its state too.
``serve_parcels``: the worker's one run of its agent, started with the question
"deliver the parcels of RUN_ID".
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import kernelext as kx
from crash import delivered, serve_one_run

FIRST_PARCELS: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "deliver", "arguments": {"parcel": 1, "address": "1 Main St"}}]},
    {
        "tool_calls": [
            {"name": "deliver", "arguments": {"parcel": 2, "address": "2 Mill Rd"}},
            {"name": "deliver", "arguments": {"parcel": 3, "address": "3 Dock Ln"}},
        ]
    },
]


def post_parcel(
    config: Mapping[str, Any], parcel: int, address: str, idempotency_key: str | None
) -> Any:
    """POST one parcel of run ``config["run_id"]`` to ``config["delivery_url"]``; its answer."""
    body = {"run": config["run_id"], "parcel": parcel, "address": address}
    return delivered(config["delivery_url"] + "/deliver", body, idempotency_key)


def parcels_agent(
    name: str, converse: Callable[[Any, Any, str], str], config: Mapping[str, Any], tools: Any
) -> kx.Agent:
    """The agent ``name``: ``converse`` (the worker's tool loop) with ``config["client"]``
    and ``tools`` answers the question; the answer is kept in ``run.state`` too."""

    @kx.agent(name=name)
    def parcels(run: kx.Run, question: str) -> str:
        answer = converse(config["client"], tools, question)
        run.state["answer"] = answer
        return answer

    return parcels


def serve_parcels(
    agent: Any, take_command: Callable[[Mapping[str, Any]], None], rng: random.Random
) -> int:
    """One run of ``agent`` in this worker (``crash.serve_one_run``)."""
    return serve_one_run(
        lambda command, store: agent.start(
            f"deliver the parcels of {command['run_id']}", run_id=command["run_id"], store=store
        ),
        take_command,
        rng,
    )
