"""Worker process for the ``kx.anthropic`` tests across processes
(tests/surfaces/test_adapter_anthropic_process.py).

The agent ``anthropic-parcels`` is a tool-using loop as people write it with the
Anthropic SDK, with no steps: ask the model (the real ``anthropic`` client, wrapped with
``kx.anthropic``, pointed at the test's scripted LLMServer), run the ``tool_use`` blocks
it answers with (``kx.tools``), send the ``tool_result`` blocks back, ask again, until it
answers in text. Every other turn is streamed through ``client.messages.stream``. The
one tool, ``deliver``, is an ``@kx.effect`` that POSTs to the test's DeliveryServer with
the ledger's key as ``Idempotency-Key``. ``SCRIPT`` is what the model server answers.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``, ``run_id``,
``attempt``, ``llm_url``, ``delivery_url`` and ``stop_after``: after that many deliveries
in this process the run asks itself to stop (``kx.stop``), which lands at the next model
call; 0 never stops. A stopped run prints ``ended suspended ...`` and exits with 3.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from typing import Any

from anthropic import Anthropic
from support.model_loops import anthropic_reply, anthropic_take

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash.parcels import FIRST_PARCELS, parcels_agent, post_parcel, serve_parcels
from kernelext._adapters.tools import Tools

MODEL = "scripted"
SCRIPT: list[dict[str, Any]] = [
    *FIRST_PARCELS,
    {"content": "All three parcels are delivered."},
]
MODEL_CALLS, DELIVERIES = 3, 3
CONFIG: dict[str, Any] = {"delivery_url": "", "stop_after": 0, "delivered": 0, "client": None}
RNG = random.Random(0)


@kx.effect
def deliver(parcel: int, address: str, *, idempotency_key: str | None = None) -> Any:
    """Deliver one parcel to an address."""
    answer = post_parcel(CONFIG, parcel, address, idempotency_key)
    CONFIG["delivered"] += 1
    if CONFIG["delivered"] == CONFIG["stop_after"]:
        kx.stop(CONFIG["run_id"])  # lands at the next model call
    return answer


TOOLS = Tools(deliver)


def converse(client: Any, tools: Tools, question: str) -> str:
    """Ask, run the tools the model asks for, send their results, until it answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for turn in range(20):
        reply = anthropic_reply(
            client, tools, turn, model=MODEL, max_tokens=1024, messages=messages
        )
        answer = anthropic_take(reply, tools, messages)
        if answer is not None:
            return answer
    raise RuntimeError("the model never answered")


parcels = parcels_agent("anthropic-parcels", converse, CONFIG, TOOLS)


def take_command(command: Mapping[str, Any]) -> None:
    CONFIG.update(run_id=command["run_id"], delivery_url=command["delivery_url"])
    CONFIG["stop_after"] = int(command.get("stop_after") or 0)
    CONFIG["client"] = kx.anthropic(
        Anthropic(base_url=command["llm_url"], api_key="sk-ant-worker-key-0123456789")
    )


def main() -> int:
    return serve_parcels(parcels, take_command, RNG)


if __name__ == "__main__":
    sys.exit(main())
