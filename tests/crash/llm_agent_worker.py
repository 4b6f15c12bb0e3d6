"""Worker process for the LLM agent crash test (tests/surfaces/test_adapter_openai.py).

The agent ``llm-crash`` is a tool-calling loop as people write it, with no steps: ask the
model (the real ``openai`` client, wrapped with ``kx.openai``, pointed at the test's
scripted LLMServer), run the tool calls it asks for, append the results, ask again,
until it answers. Every other turn is streamed. The one tool, ``deliver``, is an
``@kx.effect`` that POSTs to the test's DeliveryServer with the ledger's key as
``Idempotency-Key``. ``CRASH_SCRIPT`` is what the model server answers: four turns, one
of them with two tool calls at once, then the final answer.

Protocol: see ``tests/crash/__init__.py``. The ``go`` line carries ``store``, ``run_id``,
``attempt``, ``llm_url``, ``delivery_url`` and ``pause_ms``: ``deliver`` dawdles up to
``pause_ms`` after its POST was answered, so kills land between the delivery and its
recorded outcome too.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Mapping
from typing import Any

from openai import OpenAI

import kernelext as kx
import kernelext._store.duckdb.backend  # imports duckdb before `go`
from crash.parcels import FIRST_PARCELS, parcels_agent, post_parcel, serve_parcels
from kernelext._adapters.openai import wrap_openai
from kernelext._adapters.tools import Tools

MODEL = "scripted"
CRASH_SCRIPT: list[dict[str, Any]] = [
    *FIRST_PARCELS,
    {"tool_calls": [{"name": "deliver", "arguments": {"parcel": 4, "address": "4 Hill Ave"}}]},
    {"content": "All four parcels are delivered."},
]
MODEL_CALLS, DELIVERIES = 4, 4
CONFIG: dict[str, Any] = {"delivery_url": "", "pause_ms": 0.0, "client": None}
RNG = random.Random(0)


@kx.effect
def deliver(parcel: int, address: str, *, idempotency_key: str | None = None) -> Any:
    """Deliver one parcel to an address."""
    answer = post_parcel(CONFIG, parcel, address, idempotency_key)
    if CONFIG["pause_ms"]:
        time.sleep(RNG.uniform(0, CONFIG["pause_ms"]) / 1000)
    return answer


TOOLS = Tools(deliver)


def message_from_chunks(chunks: Any) -> dict[str, Any]:
    """The assistant message a chat completions stream spells out, as a dict."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            for part in delta.tool_calls or []:
                call = calls.setdefault(
                    part.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.id or call["id"]
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def converse(client: Any, tools: Tools, question: str, *, stream_every: int = 2) -> str:
    """Ask, run the tools the model calls, ask again, until the model answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for turn in range(20):
        if stream_every and turn % stream_every == stream_every - 1:
            chunks = client.chat.completions.create(
                model=MODEL, messages=messages, tools=tools, stream=True
            )
            message: Any = message_from_chunks(chunks)
            calls, answer = message.get("tool_calls"), message["content"]
        else:
            message = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
            message = message.choices[0].message
            calls, answer = message.tool_calls, message.content
        messages.append(message)
        if not calls:
            return str(answer)
        messages += tools.call_all(calls)
    raise RuntimeError("the model never answered")


llm_crash = parcels_agent("llm-crash", converse, CONFIG, TOOLS)


def take_command(command: Mapping[str, Any]) -> None:
    CONFIG.update(run_id=command["run_id"], delivery_url=command["delivery_url"])
    CONFIG["pause_ms"] = float(command["pause_ms"])
    CONFIG["client"] = wrap_openai(
        OpenAI(base_url=command["llm_url"], api_key="sk-crash-test-key-0123456789", max_retries=0)
    )


def main() -> int:
    return serve_parcels(llm_crash, take_command, RNG)


if __name__ == "__main__":
    sys.exit(main())
