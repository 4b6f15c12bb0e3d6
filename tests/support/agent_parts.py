"""What the agent frameworks' test agents share, whichever framework runs them.

``PAY_SCRIPT``: the scripted model's answers (pay bob, pay ann, say so). ``HOLD``: the first
``pay`` of this process can be held until a test asked for a Stop. ``openai_client(url)``: an
``AsyncOpenAI`` client of the local model server (no retries: a failure is seen at once),
closed by ``close_clients()`` on the loop its connections belong to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI

__all__ = ["HOLD", "PAY_SCRIPT", "Hold", "close_clients", "openai_client", "serve_payer"]

PAY_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "pay", "arguments": {"who": "bob", "amount": 10}}]},
    {"tool_calls": [{"name": "pay", "arguments": {"who": "ann", "amount": 3}}]},
    {"content": "paid bob 10 and ann 3"},
]


class Hold:
    """Holds a ``pay`` until ``released`` is set; ``reached`` tells it got there."""

    def __init__(self) -> None:
        self.reached, self.released = threading.Event(), threading.Event()
        self.released.set()
        self.who: str | None = None

    def arm(self, who: str | None = None) -> None:
        """Hold the next ``pay`` (of ``who``, or of anyone)."""
        self.who = who
        self.reached.clear()
        self.released.clear()

    def holds(self, who: str) -> bool:
        return not self.released.is_set() and self.who in (None, who)

    def wait_here(self) -> None:
        self.reached.set()
        assert self.released.wait(30), "the test never released the held tool call"


HOLD = Hold()
_CLIENTS: list[AsyncOpenAI] = []


def openai_client(llm_url: str) -> AsyncOpenAI:
    client = AsyncOpenAI(base_url=llm_url, api_key="sk-agents-" + "K3Y" * 6, max_retries=0)
    _CLIENTS.append(client)
    return client


def close_clients() -> None:
    """Close the clients the agents were given, on the loop their connections belong to."""
    from kernelext._adapters.adapter_loop import run_on_adapter_loop

    while _CLIENTS:
        run_on_adapter_loop(_CLIENTS.pop().close)


def serve_payer(
    argv: list[str], framework: Any, payer: Callable[[str, str, dict[str, str]], Any]
) -> int:
    """``start|resume RUN_ID LLM_URL DELIVERY_URL [key=value...]``: the payer agent
    (``payer(llm_url, delivery_url, options)``) in a process of its own (a restarted kernel)
    through ``framework`` (``kx.openai_agents``, ``kx.pydantic_ai``); prints the run's end as
    one JSON line. ``start`` starts the run, ``resume`` hands the agent over and resumes."""
    import json

    import kernelext as kx

    verb, run_id, llm_url, delivery_url, *rest = argv
    options = dict(item.split("=", 1) for item in rest)
    agent = payer(llm_url, delivery_url, options)
    if verb == "start":
        handle = framework.start(agent, options.get("input", "pay"), run_id=run_id)
    else:
        framework.agent(agent)
        handle = kx.resume(run_id)
    handle.wait(timeout=float(options.get("timeout", 60)))
    print(json.dumps({"status": str(handle.status), "result": handle.result}), flush=True)
    close_clients()
    return 0
