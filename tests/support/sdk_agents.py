"""Agents of the OpenAI Agents SDK for the tests, built the same way in every process.

``payer(llm_url, delivery_url)``: an agent whose ``pay`` tool POSTs a payment to the local
delivery server (what is counted), answering from the scripted model server. The first
call of ``pay`` in this process can be held (``HOLD``, of support.agent_parts) until a test
asked for a Stop.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

from support.agent_parts import HOLD, PAY_SCRIPT, close_clients, openai_client
from support.http_server import post_json

__all__ = ["HOLD", "PAY_SCRIPT", "close_clients", "model_for", "payer"]

set_tracing_disabled(True)  # the SDK would send its traces to a server of its own


def model_for(llm_url: str) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(model="scripted", openai_client=openai_client(llm_url))


def payer(llm_url: str, delivery_url: str, **options: Any) -> Agent[Any]:
    @function_tool(**options)
    def pay(who: str, amount: int) -> str:
        """Pay someone an amount of dollars."""
        if HOLD.holds(who):
            HOLD.wait_here()
        answer = post_json(f"{delivery_url}/pay/{who}", {"who": who, "amount": amount})
        return f"paid {who} {amount} ({answer.status})"

    return Agent(
        name="payer", instructions="Pay who you are told.", tools=[pay], model=model_for(llm_url)
    )


def main(argv: list[str]) -> int:
    """``python -m support.sdk_agents start|resume RUN_ID LLM_URL DELIVERY_URL [key=value...]``:
    the payer agent in a process of its own (a restarted kernel); prints the run's end as
    one JSON line. ``start`` starts the run, ``resume`` hands the agent over and resumes."""
    import json

    import kernelext as kx

    verb, run_id, llm_url, delivery_url, *rest = argv
    options = dict(item.split("=", 1) for item in rest)
    tool_options = {"needs_approval": True} if options.get("approval") else {}
    agent = payer(llm_url, delivery_url, **tool_options)
    if verb == "start":
        handle = kx.openai_agents.start(agent, options.get("input", "pay"), run_id=run_id)
    else:
        kx.openai_agents.agent(agent)
        handle = kx.resume(run_id)
    handle.wait(timeout=float(options.get("timeout", 60)))
    print(json.dumps({"status": str(handle.status), "result": handle.result}), flush=True)
    close_clients()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
